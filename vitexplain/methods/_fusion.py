"""Fusing maps over heads or blocks: one function for every method that offers a fusion option."""
from __future__ import annotations

from typing import Literal

from torch import Tensor

#: how maps are fused over a dimension (heads or blocks)
Fusion = Literal["sum", "mean", "max", "min"]
#: the fusions rollout offers over heads (a sum of attention rows is not an attention row)
HeadFusion = Literal["mean", "max", "min"]


def fuse(maps: Tensor, dim: int, how: Fusion) -> Tensor:
    """``maps`` fused over ``dim``: summed, averaged, or their element-wise maximum or minimum."""
    if how == "sum":
        return maps.sum(dim)
    if how == "mean":
        return maps.mean(dim)
    return maps.amax(dim) if how == "max" else maps.amin(dim)
