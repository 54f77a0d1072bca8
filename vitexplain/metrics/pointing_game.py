"""Pointing game (Zhang et al., ECCV 2016) as run by TIS (Englebert et al., ICCVW 2023, Table 3).

TIS Sec. 4.2: "we excluded images where the bounding box covered more than 50% of the image" (2892
of 5000 excluded). This reproduces ``metrics/pointing_game.py`` of aenglebert/Transformer_Input_Sampling:

* the union of the image's ground-truth boxes is painted on a pixel grid of the image's size, box
  (x0, y0, x1, y1) covering rows ``int(y0):int(y1)`` and columns ``int(x0):int(x1)`` (coordinates
  truncated, then clipped to the image);
* the image is excluded when the painted area is >= ``max_coverage`` of the image (the code keeps an
  image only when the share is strictly below 0.5); an image without boxes is kept and misses;
* hit = the painted grid at the maximum of the map upsampled bilinearly to the image (first maximum
  in row-major order when several pixels tie).

Per image: ``hit`` (1 / 0) and ``excluded`` (1 / 0). Reported: accuracy over the kept images, and
how many images were kept and excluded.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import resize
from ..options import Share
from ._common import check_maps
from .base import EvalBatch, register_metric


def box_masks(boxes: list[Tensor], size: tuple[int, int], device: torch.device) -> Tensor:
    """Union of each image's boxes as a pixel mask [B, H, W] (see the module docstring)."""
    height, width = size
    sizes = [b.reshape(-1, 4).shape[0] for b in boxes]
    if sum(sizes) == 0:
        return torch.zeros(len(boxes), height, width, dtype=torch.bool, device=device)
    corners = torch.cat([b.reshape(-1, 4).to(device=device, dtype=torch.float64) for b in boxes]).trunc().long()
    owner = torch.repeat_interleave(torch.arange(len(boxes), device=device), torch.tensor(sizes, device=device))
    x0, x1 = corners[:, 0].clamp(0, width), corners[:, 2].clamp(0, width)
    y0, y1 = corners[:, 1].clamp(0, height), corners[:, 3].clamp(0, height)
    rows = torch.arange(height, device=device)
    cols = torch.arange(width, device=device)
    in_rows = (rows >= y0[:, None]) & (rows < y1[:, None])
    in_cols = (cols >= x0[:, None]) & (cols < x1[:, None])
    painted = (in_rows[:, :, None] & in_cols[:, None, :]).flatten(1).float()
    union = torch.zeros(len(boxes), height * width, device=device).index_add_(0, owner, painted)
    return (union > 0).view(len(boxes), height, width)


def pointing_game(maps: Tensor, boxes: list[Tensor], image_size: tuple[int, int], *,
                  max_coverage: float = 0.5) -> dict[str, Tensor]:
    """Per-image hits and exclusions.

    Args:
        maps: explanation maps [B, h, w].
        boxes: per image, ground-truth boxes [k, 4] as (x0, y0, x1, y1) pixels of the input image.
        image_size: (H, W) of the input image.
        max_coverage: images whose boxes cover at least this share of the image are excluded.

    Returns:
        ``hit`` and ``excluded``: [B] floats (1 / 0).
    """
    maps = check_maps(maps, len(boxes))
    if not 0 < max_coverage <= 1:
        raise ValueError(f"max_coverage must be in (0, 1], got {max_coverage}")
    covered = box_masks(boxes, image_size, maps.device).flatten(1)
    peak = resize(maps, image_size).flatten(1).argmax(1)
    hit = covered.gather(1, peak[:, None])[:, 0]
    excluded = covered.float().mean(1) >= max_coverage
    return {"hit": hit.float(), "excluded": excluded.float()}


def reduce_pointing_game(values: dict[str, Tensor]) -> dict[str, float]:
    kept = values["excluded"] == 0
    accuracy = values["hit"][kept].to(torch.float64).mean().item() if kept.any() else float("nan")
    return {"accuracy": accuracy, "included": int(kept.sum()), "excluded": int((~kept).sum())}


@register_metric(
    "pointing_game",
    reduce=reduce_pointing_game,
    requires=("boxes",),
    higher_is_better={"accuracy": True},
    group="localisation",
)
def _compute(batch: EvalBatch, *, max_coverage: Share = 0.5) -> dict[str, Tensor]:
    return pointing_game(batch.maps, batch.truth["boxes"], tuple(batch.images.shape[-2:]), max_coverage=max_coverage)
