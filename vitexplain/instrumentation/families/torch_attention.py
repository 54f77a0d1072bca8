"""PyTorch's own ``nn.MultiheadAttention`` as the written-out attention reads it: torchvision's ViT, open_clip's
towers (:class:`MultiheadAttentionViT`) and the pooling head of transformers' SigLIP use it.

Its input projection is one packed parameter (``in_proj_weight``, rows q, k, v), not a Linear module; the
description reads it through :func:`in_projection_rows`, a Linear whose weight and bias are rows of the packed
ones (a :class:`~.base.LinearView`). The written-out attention calls it as a module, so LRP's Linear rules are
placed on it as on timm's ``qkv`` (:func:`~vitexplain.instrumentation.lrp.placement.lrp_rules` places them on the
description's Linears that are no modules of the model too); the model itself is not changed.
"""
from __future__ import annotations

from torch import Tensor, nn

from ..attention import AttentionParts
from .base import ClassTokenFirst, Family, LinearView, at
from .stack import BlockCheck


def in_projection_rows(attention: nn.MultiheadAttention, start: int, stop: int) -> LinearView:
    """Rows ``start:stop`` of ``nn.MultiheadAttention``'s packed input projection as a Linear (read from the
    attention's own parameters at each call)."""
    rows = slice(start, stop)

    def bias() -> Tensor | None:
        return None if attention.in_proj_bias is None else attention.in_proj_bias[rows]

    return LinearView(lambda: attention.in_proj_weight[rows], bias, attention.embed_dim, stop - start)


def multihead_attention_reason(attention: nn.Module) -> str | None:
    """None when ``attention`` is an ``nn.MultiheadAttention`` the written-out attention computes, else why not."""
    if not isinstance(attention, nn.MultiheadAttention):
        return f"its attention is a {type(attention).__name__}, not torch's nn.MultiheadAttention"
    if not attention._qkv_same_embed_dim:
        return "its attention's keys and values have another width than its queries"
    if attention.bias_k is not None or attention.add_zero_attn:
        return "its attention appends learnt or zero key / value tokens (add_bias_kv / add_zero_attn)"
    return None


def multihead_attention_check(path: str) -> BlockCheck:
    """The check that a block's attention (its part at ``path``) is one :func:`multihead_attention` reads."""
    def check(place: str, block: nn.Module) -> str | None:
        reason = multihead_attention_reason(at(block, path))
        return f"{place}: {reason}" if reason else None

    return check


def multihead_attention(attention: nn.MultiheadAttention) -> AttentionParts:
    """``nn.MultiheadAttention`` as self-attention: the packed projection as one qkv (rows q, k, v: heads laid
    out [3, H, D]), scores scaled by 1/√D, ``out_proj``."""
    width = attention.embed_dim
    return AttentionParts(module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim,
                          scale=attention.head_dim ** -0.5, proj=attention.out_proj,
                          qkv=in_projection_rows(attention, 0, 3 * width))


def latent_attention(attention: nn.MultiheadAttention, latent: Tensor) -> AttentionParts:
    """``nn.MultiheadAttention`` reading the tokens with learnt queries ``latent`` (an attention-pooling head):
    queries from the first rows of the packed projection, keys and values from the rest."""
    width = attention.embed_dim
    return AttentionParts(module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim,
                          scale=attention.head_dim ** -0.5, proj=attention.out_proj,
                          query=in_projection_rows(attention, 0, width),
                          kv=in_projection_rows(attention, width, 3 * width),
                          latent=latent)


class MultiheadAttentionViT(ClassTokenFirst, Family):
    """A ViT of one image size whose blocks attend through ``nn.MultiheadAttention``, a class token first
    (torchvision's, open_clip's)."""

    image_size = "model.image_size"
    attention = staticmethod(multihead_attention)
