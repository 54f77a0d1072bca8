"""timm's hierarchical Swin Transformers (``SwinTransformer``, ``SwinTransformerV2``): windowed attention
with shifted windows, relative position bias (a table in V1; V2's continuous bias from an MLP of
log-spaced coordinates, cosine attention with a learnt logit scale, q / v biases, res-post-norm blocks),
patch merging between stages, NHWC token grids, an average-pooling head."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts, clamped_logit_scale
from ..windows import Windows
from .base import EmbeddingParts, Family, PatchTokensOnly, register_family
from .examples import TINY_SWIN, Example, timm_tiny
from .stack import Parts, Stack
from .timm_common import timm_head

#: why a Swin Transformer cannot run on token subsets
SWIN_TOKEN_SUBSETS = ("a Swin Transformer's windows and patch merging need the whole token grid, so dropping tokens "
                      "has no meaning (mask the image instead, e.g. tis with input_space=True)")


class HierarchicalSwin(PatchTokensOnly):
    """Mixin of a Swin :class:`Family` (timm's, torchvision's): no prefix tokens, an average over the last stage's
    tokens as the readout, no token subsets (:data:`SWIN_TOKEN_SUBSETS`)."""

    readout = "avg"

    def token_subsets_reason(self) -> str | None:
        return SWIN_TOKEN_SUBSETS


def pooling_reason(pooling: str) -> str | None:
    """Why a timm Swin head pooling by ``pooling`` (its ``global_pool``) is not described, or None for ``'avg'``."""
    if pooling == "avg":
        return None
    return f"its head pools with global_pool={pooling!r}, which is not a weighting of the tokens (supported: 'avg')"


def grid_tokens(x: Tensor) -> tuple[Tensor, AttentionInput]:
    """A Swin block's input [B, h, w, C] as tokens [B, h·w, C] on the grid (h, w)."""
    return x.flatten(1, 2), AttentionInput(grid=tuple(x.shape[1:3]))


def grid_back(tokens: Tensor, given: Tensor) -> Tensor:
    return tokens.reshape(*given.shape[:-1], tokens.shape[-1])


def timm_windows(block: nn.Module) -> Windows:
    """A timm Swin block's windows: its window and shift (timm's roll-then-pad order), its own shift mask."""
    return Windows(tuple(block.window_size), tuple(block.shift_size), shift_mask(block))


def shift_mask(block: nn.Module):
    """The block's own shift mask for a padded grid: its buffer, or (dynamic image sizes) its own
    ``get_attn_mask`` on that grid."""
    def mask(padded, device, dtype) -> Tensor | None:
        if getattr(block, "dynamic_mask", False):
            return block.get_attn_mask(torch.zeros(1, *padded, 1, device=device, dtype=dtype))
        return block.attn_mask
    return mask


#: where a timm Swin block (V1, V2, V2-CR) keeps its parts: it takes and returns a token grid, attends in windows
GRID_BLOCK = Parts(inputs=grid_tokens, output=grid_back, windows=timm_windows)
#: the layers around timm's Swin blocks that LRP's rules cover: the MLP, drop path, the average-pooling head; a
#: position-bias MLP's ReLU (its output is a constant of the input: it never carries relevance)
TIMM_SWIN_LAYERS = ("timm.layers.Mlp", "timm.layers.PatchEmbed", "timm.layers.DropPath", "timm.layers.ClassifierHead",
                    "timm.layers.SelectAdaptivePool2d", "timm.layers.adaptive_avgmax_pool.FastAdaptiveAvgPool",
                    nn.AdaptiveAvgPool2d, nn.Flatten, nn.ReLU)


def _continuous_position_bias(attn: nn.Module):
    """Swin V2's bias: 16·sigmoid of an MLP of the log-spaced relative coordinates, gathered per pair [1, H, T, T].

    It depends on the weights only, never on the image, so it is computed without a graph: no explanation
    differentiates it, and the LRP rules on the Linear layers of that MLP then stay out of its way."""
    def bias() -> Tensor:
        with torch.no_grad():
            table = attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads)
        area = attn.window_size[0] * attn.window_size[1]
        pairs = table[attn.relative_position_index.view(-1)].view(area, area, -1).permute(2, 0, 1)
        return (16 * torch.sigmoid(pairs)).unsqueeze(0)
    return bias


def swin_attention(attn: nn.Module) -> AttentionParts:
    """timm's ``WindowAttention``: V1's (a relative position bias table), or V2's (with a logit scale)."""
    return _v2_attention(attn) if hasattr(attn, "logit_scale") else _v1_attention(attn)


def _v1_attention(attn: nn.Module) -> AttentionParts:
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.qkv.out_features // (3 * attn.num_heads),
        scale=attn.scale, proj=attn.proj, qkv=attn.qkv, position_bias=attn._get_rel_pos_bias,
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)


def _v2_attention(attn: nn.Module) -> AttentionParts:
    bias = None
    if attn.q_bias is not None:
        bias = lambda: torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))  # noqa: E731
    head_dim = attn.qkv.out_features // (3 * attn.num_heads)
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=head_dim, scale=head_dim ** -0.5, proj=attn.proj,
        qkv=attn.qkv, qkv_bias=bias, position_bias=_continuous_position_bias(attn),
        logit_scale=clamped_logit_scale(attn),
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)


@register_family
class TimmSwin(HierarchicalSwin, Family):
    """Where timm's ``SwinTransformer`` and ``SwinTransformerV2`` keep their parts.

    The blocks of all stages, in order, are the model's blocks (block indices count across stages);
    each block's windows are described by :class:`~vitexplain.instrumentation.windows.Windows`. Patch
    merging runs as the model's own code between stages; recording learns each stage's token grid from
    the forward. No prefix tokens; the head averages the last stage's tokens.
    """

    name = "timm Swin Transformer (V1, V2)"
    listing_order = 14
    model_classes = ("timm.models.swin_transformer.SwinTransformer",
                     "timm.models.swin_transformer_v2.SwinTransformerV2")
    stack = Stack("blocks", {"SwinTransformerBlock": "pre_norm", "SwinTransformerV2Block": "res_post_norm"},
                  "a Swin block", stages="layers", parts=GRID_BLOCK)
    refusals = (lambda model: pooling_reason(model.global_pool), stack.reason)
    # the V2 bias MLP computes a constant of the input: its ReLU never carries relevance; the modules' own softmax is
    # not called (the attention is written out)
    lrp_modules = ("timm.models.swin_transformer.SwinTransformerStage", "timm.models.swin_transformer.PatchMerging",
                   "timm.models.swin_transformer_v2.SwinTransformerV2Stage",
                   "timm.models.swin_transformer_v2.PatchMerging", *TIMM_SWIN_LAYERS, nn.Softmax)
    example_models = (
        Example("Swin (shifted windows, merging)", timm_tiny("swin_tiny_patch4_window7_224", TINY_SWIN)),
        Example("Swin V2 (cosine attention, continuous bias)", timm_tiny("swinv2_tiny_window8_256", TINY_SWIN)))
    attention = staticmethod(swin_attention)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``tokens`` as a last-stage block returns them, a grid [B, h, w, C]."""
        return timm_head(self.model, tokens, final_norm)

    def embedding(self) -> EmbeddingParts:
        return EmbeddingParts(self.model.patch_embed, self.model.patch_embed.proj, None)
