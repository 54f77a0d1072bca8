"""Grad-ECLIP (Zhao, Wang, Zeng, Zhao & Chan, ICML 2024)."""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter, UnsupportedModelError
from ..instrumentation.targets import resolve_target
from ..options import Score
from ..registry import register_method
from ._clip import READOUT, OneHead, geometry_of, taking


@register_method(cost=2,
                 zero_map_reason="its ReLU removed every patch: the channel- and spatially-weighted values were "
                                 "negative on every patch")
def grad_eclip(adapter: ModelAdapter, images: Tensor, target=None, *, heads: Literal["model", "one"] = "model",
               score: Score = "logit") -> Tensor:
    """Grad-ECLIP: the last attention's values weighted per channel by the score's gradient, per patch by q-k.

    Zhao, Wang, Zeng, Zhao & Chan, "Gradient-based Visual Explanation for Transformer-based CLIP", ICML 2024
    (code: Cyang-Zhao/Grad-Eclip). The image–text similarity S = cos(f_I, f_T) (here: the target's score, a
    direction's cosine or a class's logit) is decomposed at the last attention, whose output at the class token is
    o_cls = Σ_i A_cls,i v_i (heads concatenated, before the output projection). With the channel weights
    w = ∂S/∂o_cls and the loosened spatial weights λ_i = min-max_i cos(q_cls, k_i) over the patches (the q-k
    attention without the softmax's sharpness), the map is

        H_i = ReLU( λ_i Σ_c w_c v_i,c )

    q, k and v are the last attention's projections over all channels (the authors' ``in_proj`` outputs). Where
    the output reads more than a class token, every query row j of that attention enters with its own gradient,
    H_i = ReLU(Σ_j λ_j,i w_j·v_i) (the class-token case is the paper's: no other row reaches the output); a
    SigLIP-style model's last attention is its attention-pooling head (its learnt query), and a windowed one
    compares each query with the keys of its window. Decisions and the measured agreement with the authors'
    code: docs/decisions/clip-methods.md.

    Options:
        heads: ``"model"``: the model's own multi-head attention, so S is the model's own similarity;
            ``"one"``: the last attention computed again as one head over all channels, softmax(q kᵀ / √(H·D)),
            as the released code does (its ``attention_layer(q, k, v, 1)``): the maps of that code, of a model
            whose last attention differs from this one's.
        score: ``"logit"`` | ``"probability"`` | ``"log_probability"`` for class targets (an embedding
            direction is scored by its cosine similarity, the paper's S).
    """
    probe = adapter.readout == "map"
    at = READOUT if probe else adapter.num_blocks - 1
    parts = adapter.probe.attention if probe else adapter.blocks[at].attention
    one = heads == "one"
    if one and (parts.logit_scale is not None or parts.position_bias is not None):
        kind = "cosine scores with a per-head scale" if parts.logit_scale is not None else "a per-head position bias"
        raise UnsupportedModelError(f"grad_eclip with heads='one' computes the last attention as one head over all "
                                    f"channels, but the last attention of this {adapter.model_name} "
                                    f"has {kind}, which one head cannot carry; use heads='model'")
    wanted = {at: {"q", "k", "v", "mixed"} | ({"attn_logits", "attn"} if one else set())}
    arithmetic = OneHead(parts.scale, parts.num_heads, parts.head_dim) if one else None
    with taking(adapter, images, target, wanted, arithmetic=arithmetic, gradient=True) as (outputs, sink):
        taken = sink.taken[at]
        resolved = resolve_target(target, outputs.detach())
        (gradient,) = torch.autograd.grad(resolved.score(outputs, score).sum(), taken["mixed"])
    if one and not torch.equal(taken["attn_logits"], taken["attn_logits"][:, :1].expand_as(taken["attn_logits"])):
        raise UnsupportedModelError(
            f"grad_eclip with heads='one' computes the last attention as one head over all channels, but this "
            f"{adapter.model_name} adds a per-head bias to its attention scores, which one head "
            "cannot carry; use heads='model'")
    q, k, v = (taken[name].detach() for name in ("q", "k", "v"))  # [B', H, N, D] (B' = B · windows when windowed)
    channels = torch.einsum("bhjd,bhid->bji", gradient, v)  # w_j · v_i over all channels, every query row j
    queries, keys = (F.normalize(t.transpose(1, 2).flatten(2), dim=-1) for t in (q, k))
    cosine = queries @ keys.transpose(-2, -1)  # cos(q_j, k_i) [B', queries, keys]
    geometry = geometry_of(adapter, images, sink)
    layout = sink.layouts.get(at)
    if layout is not None:  # each query with the keys of its window (shift mask), padding slots left out
        read = (layout.connected & (layout.slots >= 0)[:, None, :]).repeat(cosine.shape[0] // layout.num_windows, 1, 1)
    else:  # the patches (all keys, when a pooling head reads the patches alone)
        read = torch.ones(cosine.shape[-1], dtype=torch.bool, device=cosine.device)
        prefix = geometry.num_prefix_tokens
        if cosine.shape[-1] > _patches(geometry):
            read[:prefix] = False
    spatial = _loosened(cosine, read.expand_as(cosine))
    per_key = (spatial * channels).sum(1).clamp(min=0)  # H, summed over the query rows
    if layout is not None:
        per_token = layout.tokens_of(per_key.unflatten(0, (-1, layout.num_windows)), dim=1)
    else:
        per_token = F.pad(per_key, (geometry.num_prefix_tokens + _patches(geometry) - per_key.shape[-1], 0))
    return geometry.patch_map(per_token)


def _patches(geometry) -> int:
    """Patch tokens of the last stage."""
    height, width = geometry.stages[-1]
    return height * width


def _loosened(cosine: Tensor, read: Tensor) -> Tensor:
    """λ: each row's cosines min-max scaled to [0, 1] over the keys it reads (0 elsewhere); a row whose cosines
    are all equal is 1 on them (the released code divides by zero)."""
    big = torch.finfo(cosine.dtype).max
    low = cosine.masked_fill(~read, big).amin(-1, keepdim=True)
    span = cosine.masked_fill(~read, -big).amax(-1, keepdim=True) - low
    scaled = torch.where(span > 0, (cosine - low) / torch.where(span > 0, span, torch.ones_like(span)), 1.0)
    return scaled * read
