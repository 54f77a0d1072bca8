"""Segmentation test: explanation maps as foreground segmentations (TokenTM Table 1, GradToken Table 1).

TokenTM (Wu et al., CVPR 2024) Sec. 5.2 "Localization Ability" and GradToken (Cheng et al., Neural
Networks 2024) Sec. 4.2.1 both follow the ImageNet-Segmentation protocol of Chefer et al. (CVPR 2021,
``baselines/ViT/imagenet_seg_eval.py`` and ``utils/metrices.py`` of hila-chefer/Transformer-Explainability),
which this module reproduces:

1. the map is upsampled bilinearly to the image (``align_corners=False``) and min-max normalised
   per image; a constant map gives 0/0 = NaN, which that code turns into "all background" and
   scores 0 for both classes in the AP;
2. foreground = normalised map **strictly greater** than the threshold: its mean (TokenTM, Chefer)
   or each of 0, 0.1, ..., 0.9 (GradToken, "best" threshold);
3. pixel accuracy and IoU of background and foreground are accumulated over the dataset: per-image
   correct / labelled pixel counts and per-class intersection / union counts are summed, then
   divided (``np.spacing(1)`` added to the denominators), mIoU = mean of the two classes' IoU;
4. AP: scikit-learn's ``average_precision_score`` of one image, computed on the foreground channel
   (score = normalised map, positive = foreground) and the background channel (score = 1 - map,
   positive = background) pooled together, as Chefer et al.'s ``get_ap_scores`` does; mAP = mean
   over images.

"best" threshold (GradToken Sec. 4.2.1: "We search the best thresholds with the step of 0.1 within
the range of [0, 0.9] after normalization for each method to achieve the best performance"): the
counts of every threshold are kept per image and :func:`reduce_segmentation` picks, for the dataset,
**one threshold per method**: the one with the highest mIoU (ties: the lower threshold), and reports
pixel accuracy and mIoU both at it. "for each method" names one threshold per method, and a binarised
map is one segmentation, so both numbers describe the same one; mIoU decides because it is the
segmentation number that an all-background or all-foreground map cannot win. ``"best_per_metric"``
keeps the alternative: pixel accuracy at its own best threshold, mIoU at its own. Either way the
thresholds used are reported (``pixel_accuracy_threshold``, ``miou_threshold``; equal for ``"best"``).

PASCAL VOC (GradToken Table 1, right; the paper gives no further detail): each ground-truth class
present in an image is one item (map explaining that class, mask = that class's pixels), evaluated
with ``threshold="best"``; its table reads ``pixel_accuracy`` and ``miou``. VOC's void pixels are
left out through ``ignore`` (``EvalBatch.truth["ignore"]``, which the bench fills from a dataset's ``ignore``
samples) as Chefer et al.'s code does with label -1.

Numbers are reported in percent, as in both papers' tables.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ..maps import min_max, resize
from ..uncertainty import Stacked
from ._common import check_maps
from .base import EvalBatch, register_metric

Threshold = Literal["mean", "best", "best_per_metric"]
#: the thresholds GradToken searches
THRESHOLD_GRID = tuple(i / 10 for i in range(10))
_EPS = float(np.spacing(1))


def average_precision(scores: Tensor, positives: Tensor) -> Tensor:
    """scikit-learn's ``average_precision_score`` of each row, [B] (0 for a row without positives).

    AP = sum over distinct score values t (high to low) of (R(t) - R(previous t)) * P(t), where all
    items with score >= t are predicted positive.
    """
    ordered, order = scores.sort(dim=1, descending=True)
    hits = positives.gather(1, order).to(torch.float64)
    true_pos = hits.cumsum(1)
    ranks = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=torch.float64)
    precision = true_pos / ranks
    last_of_value = torch.ones_like(positives, dtype=torch.bool)
    last_of_value[:, :-1] = ordered[:, 1:] != ordered[:, :-1]
    at_ends = torch.where(last_of_value, true_pos, 0.0)
    previous = torch.cat([torch.zeros_like(at_ends[:, :1]), at_ends.cummax(1).values[:, :-1]], 1)
    gained = torch.where(last_of_value, true_pos - previous, 0.0)
    total = true_pos[:, -1]
    return torch.where(total > 0, (gained * precision).sum(1) / total.clamp(min=1), 0.0)


def segmentation(maps: Tensor, masks: Tensor, *, threshold: str = "mean",
                 ignore: Tensor | None = None) -> dict[str, Tensor]:
    """Per-image counts of the segmentation test (see the module docstring).

    Args:
        maps: raw explanation maps [B, h, w].
        masks: ground-truth foreground [B, H, W] (bool) at image resolution.
        threshold: ``"mean"`` (TokenTM / Chefer et al.), or ``"best"`` / ``"best_per_metric"``
            (GradToken, thresholds 0, 0.1, ..., 0.9; the two differ only in :func:`reduce_segmentation`).
        ignore: pixels left out of every count and of the AP [B, H, W] (bool), e.g. VOC's void
            border pixels, which Chefer et al.'s code labels -1 (``ignore_index``); the mean
            threshold is still the mean over the whole map, as there.

    Returns:
        ``correct``, ``intersection_background``, ``intersection_foreground``, ``union_background``,
        ``union_foreground``: pixel counts, [B] for "mean", [B, 10] (one per threshold) otherwise;
        ``labeled``: [B] pixels counted per image; ``ap``: [B] average precision.
    """
    if masks.dim() != 3:
        raise ValueError(f"masks must have shape [B, H, W], got {tuple(masks.shape)}")
    if ignore is not None and ignore.shape != masks.shape:
        raise ValueError(f"ignore must have the masks' shape {tuple(masks.shape)}, got {tuple(ignore.shape)}")
    maps = check_maps(maps.to(masks.device), masks.shape[0])
    relevance = min_max(resize(maps, masks.shape[-2:]), constant=float("nan")).flatten(1)
    truth = masks.flatten(1).bool()
    valid = torch.ones_like(truth) if ignore is None else ~ignore.to(truth.device).flatten(1).bool()
    if threshold == "mean":
        cut = relevance.mean(1, keepdim=True)
    else:
        cut = torch.tensor(THRESHOLD_GRID, device=relevance.device, dtype=relevance.dtype)[None]
    above = relevance[:, None, :] > cut[:, :, None]                  # NaN (constant map) -> background
    foreground, background = above & valid[:, None, :], ~above & valid[:, None, :]
    inter_fg = (foreground & truth[:, None, :]).sum(-1)
    inter_bg = (background & ~truth[:, None, :]).sum(-1)
    predicted_fg = foreground.sum(-1)
    true_fg = (truth & valid).sum(1, keepdim=True)
    pixels = valid.sum(1, keepdim=True)
    counts = {
        "correct": inter_fg + inter_bg,
        "intersection_background": inter_bg,
        "intersection_foreground": inter_fg,
        "union_background": 2 * pixels - predicted_fg - true_fg - inter_bg,
        "union_foreground": predicted_fg + true_fg - inter_fg,
    }
    if threshold == "mean":
        counts = {name: value[:, 0] for name, value in counts.items()}
    scores = torch.cat([torch.nan_to_num(1 - relevance, nan=0.0), torch.nan_to_num(relevance, nan=0.0)], 1)
    scores = torch.where(valid.repeat(1, 2), scores, float("-inf"))    # ignored: below every score, no positive
    positives = torch.cat([~truth & valid, truth & valid], 1)
    return {**counts, "labeled": pixels[:, 0], "ap": average_precision(scores, positives)}


def segmentation_numbers(values: dict[str, Tensor], positions: Tensor, threshold: str = "best") -> dict[str, Tensor]:
    """Dataset-level pixel accuracy, mIoU (accumulated counts) and mAP (mean of per-image AP), in %, on each set of
    images ``positions`` draws [R] (a :class:`~vitexplain.uncertainty.Stacked` report: every bootstrap resample at
    once; the counts are whole numbers, so their sums are exact in any order).

    Counts of the mean threshold ([B]) are reduced as they are; counts of the threshold grid ([B, 10])
    at the threshold(s) ``threshold`` chooses: ``"best"``, the one with the highest mIoU for both
    numbers, or ``"best_per_metric"``, each number's own best (see the module docstring).
    """

    def total(name: str) -> Tensor:
        return values[name].to(torch.float64)[positions].sum(1)

    pixel_accuracy = total("correct") / (_EPS + total("labeled"))
    iou_background = total("intersection_background") / (_EPS + total("union_background"))
    iou_foreground = total("intersection_foreground") / (_EPS + total("union_foreground"))
    miou = (iou_background + iou_foreground) / 2
    mean_ap = 100 * values["ap"].to(torch.float64)[positions].mean(1)
    if pixel_accuracy.ndim == 1:
        return {"pixel_accuracy": 100 * pixel_accuracy, "miou": 100 * miou, "map": mean_ap}
    best_miou = miou.argmax(1, keepdim=True)
    best_accuracy = pixel_accuracy.argmax(1, keepdim=True) if threshold == "best_per_metric" else best_miou
    grid = torch.tensor(THRESHOLD_GRID, dtype=torch.float64, device=miou.device)
    return {
        "pixel_accuracy": 100 * pixel_accuracy.gather(1, best_accuracy)[:, 0],
        "miou": 100 * miou.gather(1, best_miou)[:, 0],
        "map": mean_ap,
        "pixel_accuracy_threshold": grid[best_accuracy[:, 0]],
        "miou_threshold": grid[best_miou[:, 0]],
    }


#: the report: :func:`segmentation_numbers` on the whole set
reduce_segmentation = Stacked(segmentation_numbers)


@register_metric(
    "segmentation",
    reduce=reduce_segmentation,
    requires=("masks",),
    higher_is_better={"pixel_accuracy": True, "miou": True, "map": True},
    group="localisation",
)
def _compute(batch: EvalBatch, *, threshold: Threshold = "mean") -> dict[str, Tensor]:
    return segmentation(batch.maps, batch.truth["masks"], threshold=threshold, ignore=batch.truth.get("ignore"))
