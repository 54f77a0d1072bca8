"""Arithmetic on explanation maps that methods, metrics and drawing share: min-max scaling and resizing.

One of each, so a map is scaled and resized the same way wherever it goes. What a constant map becomes
under min-max scaling is the caller's explicit choice: 0 for a map to draw or to return, NaN where a
protocol copies Chefer et al.'s evaluation code (0 / 0) and decides itself what a constant map scores.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


class NonFiniteMapError(ValueError):
    """Explanation maps holding NaN or infinite values (:func:`check_finite`). ``rows``: the positions of those
    maps in the batch; ``maps``: the whole batch checked, so a caller may keep the finite ones."""

    def __init__(self, message: str, rows: list[int], maps: Tensor):
        super().__init__(message)
        self.rows, self.maps = rows, maps


def check_finite(maps: Tensor, names: Sequence[str], what: str = "explanation map") -> Tensor:
    """``maps`` [B, ...] when every value is finite, else :class:`NonFiniteMapError` naming ``names[i]`` of each
    map that is not. The one check of the bench, :func:`vitexplain.evaluate` and :func:`vitexplain.explain`."""
    bad = ~torch.isfinite(maps.flatten(1)).all(1)
    if bad.any():
        rows = bad.nonzero().flatten().tolist()
        raise NonFiniteMapError(f"{what} of {', '.join(str(names[i]) for i in rows)} contains NaN or infinite values",
                                rows, maps)
    return maps


def min_max(maps: Tensor, *, constant: float) -> Tensor:
    """Each map [..., h, w] scaled to [0, 1] by (m - min) / (max - min) over its last two dimensions; a
    constant map becomes ``constant`` everywhere (e.g. ``0.0``, or ``float("nan")`` for 0 / 0)."""
    low = maps.amin((-2, -1), keepdim=True)
    span = maps.amax((-2, -1), keepdim=True) - low
    scaled = (maps - low) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(span > 0, scaled, torch.full_like(maps, constant))


def resize(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """Maps [..., h, w] resized bilinearly (``align_corners=False``) to ``size`` (H, W); unchanged if already there.

    This is ``interpolate(..., scale_factor=16, mode="bilinear")`` of Chefer et al.'s evaluation code and
    torchvision's ``Resize`` of the TIS code (identical when enlarging).
    """
    size = tuple(int(s) for s in size)
    if tuple(maps.shape[-2:]) == size:
        return maps
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:])
    return F.interpolate(flat, size=size, mode="bilinear", align_corners=False).reshape(*lead, *size)
