"""Helpers shared by the pixel-level baselines: RISE, ViT-CX, Integrated Gradients and SmoothGrad."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

#: How per-channel attributions [B, C, H, W] become a map [B, H, W]: ``sum`` Σ_c a_c (signed; what the TIS
#: authors' Captum wrapper does), ``abs_sum`` Σ_c |a_c|, ``max_abs`` max_c |a_c| (Simonyan et al., 2014).
ChannelReduction = Literal["sum", "abs_sum", "max_abs"]
CHANNEL_REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "sum": lambda attributions: attributions.sum(1),
    "abs_sum": lambda attributions: attributions.abs().sum(1),
    "max_abs": lambda attributions: attributions.abs().amax(1),
}


def interpolation_matrix(size_in: int, size_out: int, *, device: torch.device) -> Tensor:
    """1-D linear interpolation as a matrix [size_out, size_in] (float32).

    Exactly ``F.interpolate(..., mode="bilinear", align_corners=False)`` along one axis, so
    ``rows @ maps @ cols.T`` is that bilinear resize of ``maps`` [..., size_in_h, size_in_w].
    """
    basis = torch.eye(size_in, device=device)[:, None, :]
    return F.interpolate(basis, size=size_out, mode="linear", align_corners=False)[:, 0, :].T


def resize_by_factors(maps: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Bilinear resize of maps [..., h, w] -> [..., H, W] with :func:`interpolation_matrix` factors."""
    return rows @ maps @ cols.T


def mask_major_pairs(counts: Tensor) -> tuple[Tensor, Tensor]:
    """All (image, mask) pairs with mask < counts[image], ordered mask-major.

    Mask-major order puts one mask index's pairs next to each other, so any contiguous slice of
    pairs needs only a contiguous range of masks. Returns (image indices, mask indices), each [P].
    """
    batch = counts.shape[0]
    most = int(counts.max())
    mask_idx = torch.arange(most, device=counts.device).repeat_interleave(batch)
    image_idx = torch.arange(batch, device=counts.device).repeat(most)
    keep = mask_idx < counts[image_idx]
    return image_idx[keep], mask_idx[keep]


def chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))
