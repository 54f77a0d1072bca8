"""timm's SwinV2-CR (``SwinTransformerV2Cr``, the ``swinv2_cr_*`` models: Swin Transformer V2 as Christoph Reich
re-implemented it): windowed attention with shifted windows, scaled cosine scores with a learnt per-head logit scale
(clamped at log 100), a continuous position bias from a small "meta" MLP of log-spaced relative coordinates,
res-post-norm blocks (x + LN(attn(x)), x + LN(mlp(x))), an optional extra norm of the residual stream after a
block (``extra_norm_period`` / ``extra_norm_stage``; the last stage always ends with one), patch merging between
stages, an average-pooling head.

Layouts: the patch embedding, the stages' outputs and the head are NCHW; each stage turns its input to NHWC
before its patch merging and blocks, so a block's call gives a token grid [B, h, w, C] as in timm's other Swins.
What differs from ``timm_swin.py``'s V2 (docs/decisions/families.md, "SwinV2-CR"): a qkv Linear with its own full
bias (the key's included), the position bias being the meta MLP's output itself (no 16·sigmoid), one logit scale
per head kept as [H], the block's extra norm, NCHW between stages, and no final norm outside the blocks."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..attention import AttentionParts, clamped_logit_scale
from .base import EmbeddingParts, Family, register_family
from .examples import TINY_SWIN, Example, timm_tiny
from .stack import Stack
from .timm_swin import GRID_BLOCK, TIMM_SWIN_LAYERS, HierarchicalSwin, pooling_reason

#: where timm keeps the classes described
MODULE = "timm.models.swin_transformer_v2_cr"


def _meta_position_bias(attn: nn.Module):
    """SwinV2-CR's continuous position bias [1, H, T, T]: the meta MLP of each window pair's log-spaced relative
    coordinates (Liu et al., Swin Transformer V2, CVPR 2022, Eq. 3-4), added to the scores as the MLP gives it.

    It depends on the weights only, never on the image: a constant of the input, computed without a graph, as
    Swin V2's bias (``timm_swin.py``), so no explanation differentiates it and LRP's rules stay out of its way."""
    def bias() -> Tensor:
        area = attn.window_size[0] * attn.window_size[1]
        with torch.no_grad():
            table = attn.meta_mlp(attn.relative_coordinates_log)  # [T·T, H], pairs row-major
        return table.transpose(0, 1).reshape(attn.num_heads, area, area).unsqueeze(0)
    return bias


def _attention(attn: nn.Module) -> AttentionParts:
    """timm's ``WindowMultiHeadAttention``: a qkv Linear with its full bias, scaled cosine scores, the meta bias."""
    head_dim = attn.qkv.out_features // (3 * attn.num_heads)
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=head_dim, scale=head_dim ** -0.5, proj=attn.proj,
        qkv=attn.qkv, position_bias=_meta_position_bias(attn), logit_scale=clamped_logit_scale(attn),
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)


def _attention_reason(place: str, block: nn.Module) -> str | None:
    kind = type(block.attn).__name__
    if kind == "WindowMultiHeadAttention":
        return None
    return f"{place}: its attention is a {kind}, not timm's WindowMultiHeadAttention"


@register_family
class TimmSwinV2Cr(HierarchicalSwin, Family):
    """Where timm's ``SwinTransformerV2Cr`` keeps its parts.

    The blocks of all stages, in order, are the model's blocks (block indices count across stages), each with
    its windows (:class:`~vitexplain.instrumentation.windows.Windows`, timm's roll-then-pad order and shift mask,
    as for timm's other Swins) and its extra norm where it has one. The stages' layout changes and patch merging
    run as the model's own code; the head averages the last stage's tokens.
    """

    name = "timm SwinV2-CR"
    listing_order = 15
    model_classes = (f"{MODULE}.SwinTransformerV2Cr",)
    stack = Stack("blocks", {"SwinTransformerV2CrBlock": "res_post_norm"}, "timm's SwinTransformerV2CrBlock",
                  stages="stages", checks=(_attention_reason,), parts=replace(GRID_BLOCK, main_norm="norm3"))
    refusals = (lambda model: pooling_reason(model.head.global_pool.pool_type), stack.reason)
    # the meta MLP computes a constant of the input: its ReLU never carries relevance
    lrp_modules = (f"{MODULE}.SwinTransformerV2CrStage", f"{MODULE}.PatchMerging", f"{MODULE}.PatchEmbed",
                   *TIMM_SWIN_LAYERS)
    example_models = (
        Example("SwinV2-CR (post-norm, extra stage norms)", timm_tiny("swinv2_cr_tiny_ns_224", TINY_SWIN)),)
    attention = staticmethod(_attention)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``tokens`` as a last-stage block returns them, a grid [B, h, w, C], through the model's NCHW head. The model
        has no norm after its blocks (its last block's extra norm is that block's own), so ``final_norm`` changes
        nothing: an earlier block's output is read as the model cut after that block would read it."""
        return self.model.forward_head(tokens.permute(0, 3, 1, 2))

    def embedding(self) -> EmbeddingParts:
        # the patch embedding's norm returns the patch tokens as a grid [B, h, w, C] (the embedding itself, NCHW)
        return EmbeddingParts(self.model.patch_embed.norm, self.model.patch_embed.proj, None)
