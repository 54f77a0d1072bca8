"""Pointing game (Zhang et al., ECCV 2016 / IJCV 2018) as run by TIS (Englebert et al., ICCVW 2023, Table 3).

Zhang et al. count a hit when the map's maximum lies on one of the annotated instances of the cued class, with
a 15-pixel tolerance; TorchRay's reimplementation of their benchmark (facebookresearch/TorchRay,
``benchmark/pointing_game.py``) paints VOC's boxes and COCO's segmentation masks alike as one boolean region, so a
dataset's masks serve as well as its boxes.

TIS Sec. 4.2: "we excluded images where the bounding box covered more than 50% of the image" (2892
of 5000 excluded). This reproduces ``metrics/pointing_game.py`` of aenglebert/Transformer_Input_Sampling:

* the union of the image's ground-truth boxes is painted on a pixel grid of the image's size, box
  (x0, y0, x1, y1) covering rows ``int(y0):int(y1)`` and columns ``int(x0):int(x1)`` (coordinates
  truncated, then clipped to the image);
* the image is excluded when the painted area is >= ``max_coverage`` of the image (the code keeps an
  image only when the share is strictly below 0.5); an image without boxes is kept and misses;
* hit = the painted grid at the maximum of the map upsampled bilinearly to the image (first maximum
  in row-major order when several pixels tie).

Masks instead of boxes (a dataset with masks and no boxes; boxes are used when it has both): the mask is the
painted grid, and everything else is the same (exclusion by its share of the image, an empty mask kept and a
miss, the first maximum). Quantus's ``PointingGame``, which takes masks only, agrees on the hit (the mask at the
maximum, no tolerance) but counts a hit when any tied maximum is on the mask and gives an empty mask NaN.

``tolerance`` (pixels of the image the maps are scored at; 0, TIS's and Quantus's, by default) is Zhang et al.'s:
a hit also when a pixel of the region, box or mask alike, lies at Euclidean distance < ``tolerance`` from the
maximum (TorchRay's acceptance disc ``du**2 + dv**2 < tolerance**2``); their 15 was in pixels of the original
VOC / COCO images (about 500 wide), so at 224 pixels it is a wider share of the image.

Per image: ``hit`` (1 / 0) and ``excluded`` (1 / 0). Reported: accuracy over the kept images, and
how many images were kept and excluded.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import resize
from ..options import NonNegative, Share
from ..uncertainty import Stacked
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


def mask_regions(masks: Tensor, size: tuple[int, int], device: torch.device) -> Tensor:
    """Foreground masks [B, H, W] as the regions the maximum must point at (bool, on ``device``)."""
    masks = torch.as_tensor(masks)
    if masks.dim() != 3 or tuple(masks.shape[-2:]) != tuple(size):
        raise ValueError(f"masks must be [B, H, W] at the image's size {tuple(size)}, got {tuple(masks.shape)}; "
                         f"resize them as the images were (nearest neighbour)")
    return masks.to(device).bool()


def pointing_game(maps: Tensor, boxes: list[Tensor] | None = None, image_size: tuple[int, int] | None = None, *,
                  masks: Tensor | None = None, max_coverage: float = 0.5, tolerance: float = 0.0) -> dict[str, Tensor]:
    """Per-image hits and exclusions, on boxes or on masks.

    Args:
        maps: explanation maps [B, h, w].
        boxes: per image, ground-truth boxes [k, 4] as (x0, y0, x1, y1) pixels of the input image.
        image_size: (H, W) of the input image (with ``masks``, theirs when not given).
        masks: instead of ``boxes``, foreground masks [B, H, W] (bool) at the input image's size.
        max_coverage: images whose boxes (mask) cover at least this share of the image are excluded.
        tolerance: a hit also when the region lies within this many pixels of the maximum (Zhang et al.'s 15;
            0, the TIS code's, by default).

    Returns:
        ``hit`` and ``excluded``: [B] floats (1 / 0).
    """
    if (boxes is None) == (masks is None):
        raise ValueError("pointing_game needs either boxes or masks (one of them); give boxes=[...] or masks=...")
    if masks is not None and image_size is None:
        image_size = tuple(torch.as_tensor(masks).shape[-2:])
    if image_size is None:
        raise ValueError("pointing_game on boxes needs image_size, the (H, W) of the input image")
    maps = check_maps(maps, len(boxes) if masks is None else len(masks))
    if masks is None:
        region = box_masks(boxes, image_size, maps.device)
    else:
        region = mask_regions(masks, image_size, maps.device)
    covered = region.flatten(1)
    peak = resize(maps, image_size).flatten(1).argmax(1)
    hit = covered.gather(1, peak[:, None])[:, 0]
    if tolerance > 0:
        hit = hit | _within(region, peak, tolerance)
    excluded = covered.float().mean(1) >= max_coverage
    return {"hit": hit.float(), "excluded": excluded.float()}


def _within(region: Tensor, peak: Tensor, tolerance: float) -> Tensor:
    """[B] whether a pixel of ``region`` [B, H, W] lies at distance < ``tolerance`` from the flat index ``peak``."""
    height, width = region.shape[-2:]
    row, col = (peak // width).double(), (peak % width).double()
    rows = torch.arange(height, device=region.device, dtype=torch.float64)
    cols = torch.arange(width, device=region.device, dtype=torch.float64)
    distance = (rows[None, :] - row[:, None]).square()[:, :, None] + (cols[None, :] - col[:, None]).square()[:, None]
    return (region & (distance < float(tolerance) ** 2)).flatten(1).any(1)


def pointing_game_numbers(values: dict[str, Tensor], positions: Tensor) -> dict[str, Tensor]:
    """The share of hits among the images not left out (NaN where none is), and how many were in and out, on each
    set of images ``positions`` draws [R] (a :class:`~vitexplain.uncertainty.Stacked` report: every bootstrap resample
    at once)."""
    kept = values["excluded"][positions] == 0
    included = kept.sum(1)
    hits = (values["hit"][positions].to(torch.float64) * kept).sum(1)
    return {"accuracy": hits / included, "included": included, "excluded": positions.shape[1] - included}


#: the report: :func:`pointing_game_numbers` on the whole set
reduce_pointing_game = Stacked(pointing_game_numbers)


@register_metric(
    "pointing_game",
    reduce=reduce_pointing_game,
    requires=(("boxes", "masks"),),
    higher_is_better={"accuracy": True},
    group="localisation",
    reference="quantus",
    departures="Quantus takes masks only, counts a hit when any tied maximum is on the mask and gives an empty mask "
               "NaN; ours keeps TIS's rules for boxes and masks alike: the first maximum in raster order, an image "
               "whose region covers half of it or more left out, an empty one a miss.",
)
def _compute(batch: EvalBatch, *, max_coverage: Share = 0.5, tolerance: NonNegative = 0.0) -> dict[str, Tensor]:
    size = tuple(batch.images.shape[-2:])
    boxes = batch.truth.get("boxes")
    if boxes is not None:                                   # boxes first, as TIS and Zhang et al. (VOC) used them
        return pointing_game(batch.maps, boxes, size, max_coverage=max_coverage, tolerance=tolerance)
    return pointing_game(batch.maps, None, size, masks=batch.truth["masks"], max_coverage=max_coverage,
                         tolerance=tolerance)
