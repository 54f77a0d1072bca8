"""Relevance rank accuracy (Arras, Osman & Samek, "CLEVR-XAI: A benchmark dataset for the ground truth evaluation of
neural network explanations", Information Fusion 81, 2022; Quantus's ``RelevanceRankAccuracy``): how many
of the map's K most relevant pixels lie on the object, K the object's size.

    RRA = |P_top-K ∩ GT| / |GT|,   K = |GT|,

P_top-K the K pixels of highest relevance of the map upsampled bilinearly to the image, GT the foreground mask.
Why: it asks only for the order of the pixels, not their values, so it is unchanged by any increasing rescaling of
the map, and it adapts to the object's size (a small object is judged on few pixels).

* Pixels are ranked by their raw values (Quantus's ``abs=False``): positive relevance ranks above negative, as
  with the positive part, and the order among negative pixels is kept instead of being tied at 0.
* Ties in raster order, lower row-major index first (the house rule, ``_common.removal_rank``; Quantus's
  ``np.argsort`` leaves them unspecified): a constant map takes the first K pixels of the image.
* Pixels in ``ignore`` are neither ranked nor on the mask (K counts the mask's counted pixels); an image whose
  mask has no counted pixel is NaN, left out of the mean and counted (``undefined``; Quantus: NaN).

In [0, 1], higher is better; a map equal to the mask scores 1, its complement 0. Per image
``relevance_rank_accuracy``; reported its mean over the defined images. Decisions:
docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._localisation import MaskMeans, batch_truth, prepare, top_ranked, undefined_where_empty
from .base import EvalBatch, register_metric


def relevance_rank_accuracy(maps: Tensor, masks: Tensor, *, ignore: Tensor | None = None) -> Tensor:
    """Relevance rank accuracy of each map [B] (float64): maps [B, h, w] upsampled to the masks [B, H, W] (bool);
    ``ignore`` [B, H, W]: pixels left out."""
    relevance, truth, valid = prepare(maps, masks, ignore)
    size = truth.sum(1)
    hits = (top_ranked(relevance, valid, size) & truth).sum(1)
    return undefined_where_empty(hits.to(torch.float64) / size.clamp(min=1), truth)


reduce_relevance_rank_accuracy = MaskMeans(relevance_rank_accuracy="relevance_rank_accuracy")


@register_metric(
    "relevance_rank_accuracy",
    reduce=reduce_relevance_rank_accuracy,
    requires=("masks",),
    higher_is_better={"relevance_rank_accuracy": True},
    group="localisation",
    reference="quantus",
    departures="None in substance: as Quantus computes it on the raw values, ties broken in raster order (Quantus "
               "leaves them unspecified); identical on maps without ties.",
)
def _compute(batch: EvalBatch) -> dict[str, Tensor]:
    maps, masks, ignore = batch_truth(batch)
    return {"relevance_rank_accuracy": relevance_rank_accuracy(maps, masks, ignore=ignore)}
