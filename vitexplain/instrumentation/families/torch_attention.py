"""PyTorch's own ``nn.MultiheadAttention`` as the written-out attention reads it: torchvision's ViT, open_clip's
towers and the pooling head of transformers' SigLIP use it.

Its input projection is one packed parameter (``in_proj_weight``, rows q, k, v), not a Linear module; the
description reads it through :class:`InProjectionRows`. LRP's module rules are placed on Linear modules of
the model, so they cannot reach a packed projection: families built on this attention refuse LRP
(:data:`LRP_REASON`).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import AttentionParts
from .base import UnsupportedModelError

#: why a family whose blocks attend through ``nn.MultiheadAttention`` takes no LRP rules
LRP_REASON = ("its attention is torch's nn.MultiheadAttention, whose packed input projection (in_proj_weight) is no "
              "Linear module an LRP rule can be placed on")


class MultiheadAttentionWithoutLRP:
    """Mixin of a :class:`~.base.Family` whose blocks attend through ``nn.MultiheadAttention``: LRP refused
    with :data:`LRP_REASON`."""

    def embedding(self):
        raise UnsupportedModelError(f"LRP rules are not placed on {self.name} models: {LRP_REASON}")

    def lrp_allowed(self) -> tuple[type, ...]:
        raise UnsupportedModelError(f"LRP rules are not placed on {self.name} models: {LRP_REASON}")


class InProjectionRows(nn.Module):
    """Rows ``start:stop`` of ``nn.MultiheadAttention``'s packed input projection as a Linear, read from the
    module's own parameters at each call (so gradients and precision changes reach them)."""

    def __init__(self, attention: nn.MultiheadAttention, start: int, stop: int):
        super().__init__()
        self.rows = slice(start, stop)
        self._attention = [attention]  # not a submodule: the model owns it

    def forward(self, x: Tensor) -> Tensor:
        attention = self._attention[0]
        bias = None if attention.in_proj_bias is None else attention.in_proj_bias[self.rows]
        return F.linear(x, attention.in_proj_weight[self.rows], bias)


def multihead_attention_reason(attention: nn.Module) -> str | None:
    """None when ``attention`` is an ``nn.MultiheadAttention`` the written-out attention computes, else why not."""
    if not isinstance(attention, nn.MultiheadAttention):
        return f"its attention is a {type(attention).__name__}, not torch's nn.MultiheadAttention"
    if not attention._qkv_same_embed_dim:
        return "its attention's keys and values have another width than its queries"
    if attention.bias_k is not None or attention.add_zero_attn:
        return "its attention appends learnt or zero key / value tokens (add_bias_kv / add_zero_attn)"
    return None


def multihead_attention(attention: nn.MultiheadAttention) -> AttentionParts:
    """``nn.MultiheadAttention`` as self-attention: the packed projection as one qkv (rows q, k, v: heads laid
    out [3, H, D]), scores scaled by 1/√D, ``out_proj``."""
    width = attention.embed_dim
    return AttentionParts(module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim,
                          scale=attention.head_dim ** -0.5, proj=attention.out_proj,
                          qkv=InProjectionRows(attention, 0, 3 * width))


def latent_attention(attention: nn.MultiheadAttention, latent: Tensor) -> AttentionParts:
    """``nn.MultiheadAttention`` reading the tokens with learnt queries ``latent`` (an attention-pooling head):
    queries from the first rows of the packed projection, keys and values from the rest."""
    width = attention.embed_dim
    return AttentionParts(module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim,
                          scale=attention.head_dim ** -0.5, proj=attention.out_proj,
                          query=InProjectionRows(attention, 0, width), kv=InProjectionRows(attention, width, 3 * width),
                          latent=latent)
