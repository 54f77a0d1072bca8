"""What attnlrp and cp_lrp share: the attention-aware rule sets with the caller's γ values, read at the pixels
or the patches."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import attention_aware, relevance
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..options import NonNegative

#: γ at the feed-forward and head Linears: one value for every block, or one per block (the head takes the last)
Gammas = NonNegative | Sequence[NonNegative]
#: where the map is read: the input pixels (LXT's ViT example) or the patch embeddings, spread over their pixels
Stage = Literal["pixels", "patches"]


def attention_aware_map(adapter: ModelAdapter, images: Tensor, target, *, constant_attention: bool,
                        gamma: Gammas, conv_gamma: float, at: Stage, recompute: Recompute) -> Tensor:
    """The channel sum of the relevance at ``at`` [B, H, W], under :func:`attention_aware`'s rule set.

    ``at="patches"``: each patch embedding's relevance (before the position embedding) spread evenly over
    the patch's pixels, so that the map keeps the image's size and each patch's sum.
    """
    if not isinstance(gamma, (int, float)) and len(gamma) != adapter.num_blocks:
        raise ValueError(f"gamma takes one value, or one per block: {adapter.num_blocks} for this model, "
                         f"got {len(gamma)}")
    rules = attention_aware(constant_attention, gamma, conv_gamma)
    recompute = choose_recompute("cp_lrp" if constant_attention else "attnlrp", recompute, adapter, images)
    found = relevance(adapter, images, target, rules, at=(at,), recompute=recompute)
    if at == "pixels":
        return found.pixels.sum(1)
    per_patch = found.patches.sum(-1).reshape(images.shape[0], 1, *found.geometry.grid)
    spread = F.interpolate(per_patch, size=images.shape[-2:], mode="nearest")[:, 0]
    return spread * (per_patch.shape[-2] * per_patch.shape[-1] / spread[0].numel())
