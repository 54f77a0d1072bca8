"""timm's hierarchical Swin Transformers (``SwinTransformer``, ``SwinTransformerV2``): windowed attention
with shifted windows, relative position bias (a table in V1; V2's continuous bias from an MLP of
log-spaced coordinates, cosine attention with a learnt logit scale, q / v biases, res-post-norm blocks),
patch merging between stages, NHWC token grids, an average-pooling head."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts, clamped_logit_scale
from ..blocks import BlockParts
from ..windows import Windows
from .base import EmbeddingParts, Family, PatchTokensOnly, register_family, timm_example
from .timm_common import timm_head

#: timm block classes and the layout their forward computes
BLOCK_LAYOUTS = {"SwinTransformerBlock": "pre_norm", "SwinTransformerV2Block": "res_post_norm"}
#: the support matrix's tiny Swins: 32 px images, 4 px patches, two stages of two blocks, 2×2 windows,
#: so that both stages have several windows and their odd blocks shift them
TINY_SWIN = dict(img_size=32, patch_size=4, embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=2,
                 num_classes=10)


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


def _swin_classes() -> tuple[type, type]:
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    return SwinTransformer, SwinTransformerV2


def grid_tokens(x: Tensor) -> tuple[Tensor, AttentionInput]:
    """A Swin block's input [B, h, w, C] as tokens [B, h·w, C] on the grid (h, w)."""
    return x.flatten(1, 2), AttentionInput(grid=tuple(x.shape[1:3]))


def grid_back(tokens: Tensor, given: Tensor) -> Tensor:
    return tokens.reshape(*given.shape[:-1], tokens.shape[-1])


def shift_mask(block: nn.Module):
    """The block's own shift mask for a padded grid: its buffer, or (dynamic image sizes) its own
    ``get_attn_mask`` on that grid."""
    def mask(padded, device, dtype) -> Tensor | None:
        if getattr(block, "dynamic_mask", False):
            return block.get_attn_mask(torch.zeros(1, *padded, 1, device=device, dtype=dtype))
        return block.attn_mask
    return mask


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

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        return isinstance(model, _swin_classes())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        if pooling_reason(model.global_pool):
            return pooling_reason(model.global_pool)
        for i, stage in enumerate(model.layers):
            for j, block in enumerate(stage.blocks):
                if type(block).__name__ not in BLOCK_LAYOUTS:
                    return f"stage {i} block {j} is a {type(block).__name__}, not a Swin block"
        return None

    @classmethod
    def examples(cls):
        return {"Swin (shifted windows, merging)": timm_example("swin_tiny_patch4_window7_224", TINY_SWIN),
                "Swin V2 (cosine attention, continuous bias)": timm_example("swinv2_tiny_window8_256", TINY_SWIN)}

    def block_modules(self):
        return [block for stage in self.model.layers for block in stage.blocks]

    def block(self, module: nn.Module) -> BlockParts:
        layout = BLOCK_LAYOUTS[type(module).__name__]
        attention = _v1_attention(module.attn) if layout == "pre_norm" else _v2_attention(module.attn)
        return BlockParts(
            module=module, attention=attention, norm1=module.norm1, norm2=module.norm2, mlp=module.mlp,
            activation=getattr(module.mlp, "act", None), layout=layout, inputs=grid_tokens, output=grid_back,
            windows=Windows(tuple(module.window_size), tuple(module.shift_size), shift_mask(module)))

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``tokens`` as a last-stage block returns them, a grid [B, h, w, C]."""
        return timm_head(self.model, tokens, final_norm)

    def embedding(self) -> EmbeddingParts:
        return EmbeddingParts(self.model.patch_embed, self.model.patch_embed.proj, None)

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import (
            ClassifierHead,
            DropPath,
            Mlp,
            PatchEmbed,
            SelectAdaptivePool2d,
        )
        from timm.layers.adaptive_avgmax_pool import FastAdaptiveAvgPool
        from timm.models import swin_transformer as v1
        from timm.models import swin_transformer_v2 as v2

        # the V2 bias MLP computes a constant of the input: its ReLU never carries relevance; the modules'
        # own softmax is not called (the attention is written out)
        return (*_swin_classes(), v1.SwinTransformerStage, v1.SwinTransformerBlock, v1.WindowAttention,
                v1.PatchMerging, v2.SwinTransformerV2Stage, v2.SwinTransformerV2Block, v2.WindowAttention,
                v2.PatchMerging, Mlp, PatchEmbed, DropPath, ClassifierHead, SelectAdaptivePool2d, FastAdaptiveAvgPool,
                nn.AdaptiveAvgPool2d, nn.Flatten,
                nn.Softmax, nn.ReLU)
