"""Localisation AUC: the ROC-AUC of the map as a pixel classifier of the object (Fawcett, "An introduction to ROC
analysis", Pattern Recognition Letters 27(8), 2006; Quantus's ``AUC``).

Every pixel of the map upsampled bilinearly to the image is a score, the foreground mask its label; the AUC is the
probability that a random object pixel outscores a random background pixel, ties counting one half (Fawcett: the
AUC equals the Wilcoxon / Mann-Whitney statistic; Hanley & McNeil, Radiology 143, 1982). With average ranks r over
the image's n pixels (ties share the mean of their ranks), P object and N = n − P background pixels:

    AUC = (sum_{k in GT} r_k − P (P + 1) / 2) / (P · N),

computed exactly in float64 from one sort per image (batched), equal to scikit-learn's ``roc_auc_score`` and to
Quantus's ``auc(roc_curve(...))`` (whose trapezoids over tied thresholds count ties one half). Why: it judges the
whole ranking of the pixels, with no threshold and no budget, and is unchanged by any increasing rescaling.

* Raw map values (Quantus's ``abs=False``): negative relevance ranks below positive.
* A constant map scores 0.5 exactly (every pair tied), as a random one on average.
* Pixels in ``ignore`` are neither scored nor labelled; an image whose mask has no counted pixel, or covers every
  counted pixel (one class only: no ROC curve), is NaN, left out of the mean and counted (``undefined``; Quantus
  gives NaN for an empty mask and scikit-learn's warning and NaN for a full one).

In [0, 1], higher is better; a map equal to the mask scores 1, its complement 0. Per image ``localisation_auc``;
reported its mean over the defined images. Decisions: docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._localisation import MaskMeans, batch_truth, prepare
from .base import EvalBatch, register_metric


def average_ranks(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's values sorted ascending and the average rank (1-based, ties share their mean rank) of each sorted
    position, with the sort's order: ``(ranks [B, n] float64, order [B, n])``."""
    ordered, order = scores.sort(dim=1, stable=True)
    n = scores.shape[1]
    position = torch.arange(n, device=scores.device).expand_as(ordered)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    first = torch.where(starts, position, 0).cummax(1).values
    last = torch.where(ends, position, n).flip(1).cummin(1).values.flip(1)
    return (first + last).to(torch.float64) / 2 + 1, order


def roc_auc(scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
    """ROC-AUC of each row's ``scores`` [B, n] against the labels ``positives`` [B, n] (bool), over the entries in
    ``valid`` (all when None), ties counting one half; NaN for a row with one class only [B] (float64)."""
    if valid is None:
        valid = torch.ones_like(positives)
    # entries left out sort after every counted one, so the counted ones keep their ranks among themselves
    ranks, order = average_ranks(torch.where(valid, scores.to(torch.float64), float("inf")))
    labels = (positives & valid).gather(1, order)
    count = labels.sum(1).to(torch.float64)
    others = valid.sum(1).to(torch.float64) - count
    rank_sum = (ranks * labels).sum(1)
    auc = (rank_sum - count * (count + 1) / 2) / (count * others).clamp(min=1)
    return torch.where((count > 0) & (others > 0), auc, float("nan"))


def localisation_auc(maps: Tensor, masks: Tensor, *, ignore: Tensor | None = None) -> Tensor:
    """ROC-AUC of each map [B] (float64) as a classifier of its mask's pixels: maps [B, h, w] upsampled to the
    masks [B, H, W] (bool); ``ignore`` [B, H, W]: pixels left out."""
    relevance, truth, valid = prepare(maps, masks, ignore)
    return roc_auc(relevance, truth, valid)


reduce_localisation_auc = MaskMeans(localisation_auc="localisation_auc")


@register_metric(
    "localisation_auc",
    reduce=reduce_localisation_auc,
    requires=("masks",),
    higher_is_better={"localisation_auc": True},
    group="localisation",
    reference="quantus",
    departures="None in substance: the ROC-AUC of the map as a classifier of the mask, as Quantus's `AUC` and "
               "scikit-learn compute it, ties counting one half; Quantus's normalisation over the batch can merge or "
               "split ties (up to 1.2e-5).",
)
def _compute(batch: EvalBatch) -> dict[str, Tensor]:
    maps, masks, ignore = batch_truth(batch)
    return {"localisation_auc": localisation_auc(maps, masks, ignore=ignore)}
