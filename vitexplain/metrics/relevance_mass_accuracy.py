"""Relevance mass accuracy (Arras, Osman & Samek, "CLEVR-XAI: A benchmark dataset for the ground truth evaluation of
neural network explanations", Information Fusion 81, 2022; Quantus's ``RelevanceMassAccuracy``): the share
of the map's positive relevance that lies on the object.

    RMA = R_within / R_total,   R_within = sum_{k in GT} R_k,   R_total = sum_k R_k,

R_k the relevance of pixel k of the map upsampled bilinearly to the image, GT the foreground mask. Why: unlike the
pointing game it weighs every pixel by its relevance, so a map that puts most of its mass on the object scores
high even when its peak falls off it, and unlike IoU it needs no threshold.

* ``negatives="clip"`` (default): R = the positive part of the map, as the metric is defined on positive
  relevance (Quantus's docstring says the same, its code does not); ``"absolute"``: R = |map|, as the authors'
  earlier simply-CLEVR code (``calc_overlap``: ``np.abs``). Quantus's default (``abs=False``) sums the raw signed
  values, with which the ratio leaves [0, 1] and is undefined where they cancel.
* A map with no relevance left (zero, or nowhere positive with ``"clip"``) scores as a constant map does: the
  mask's share of the image (**ours**; Quantus divides 0 by 0).
* Pixels in ``ignore`` count in neither sum; an image whose mask has no counted pixel is NaN, left out of the mean
  and counted (``undefined``; Quantus: NaN).

In [0, 1], higher is better; a map equal to the mask scores 1. Per image ``relevance_mass_accuracy``; reported its
mean over the defined images. Decisions: docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ._localisation import NEGATIVES, MaskMeans, batch_truth, prepare, undefined_where_empty, uniform_share
from .base import EvalBatch, register_metric

Negatives = Literal["clip", "absolute"]


def relevance_mass_accuracy(maps: Tensor, masks: Tensor, *, negatives: str = "clip",
                            ignore: Tensor | None = None) -> Tensor:
    """Relevance mass accuracy of each map [B] (float64): maps [B, h, w] upsampled to the masks [B, H, W] (bool);
    ``ignore`` [B, H, W]: pixels left out; ``negatives``: ``"clip"`` or ``"absolute"`` (module docstring)."""
    relevance, truth, valid = prepare(maps, masks, ignore)
    relevance = NEGATIVES[negatives](relevance) * valid
    total = relevance.sum(1)
    inside = (relevance * truth).sum(1)
    ratio = inside / total.where(total > 0, 1.0)
    return undefined_where_empty(ratio.where(total > 0, uniform_share(truth, valid)), truth)


reduce_relevance_mass_accuracy = MaskMeans(relevance_mass_accuracy="relevance_mass_accuracy")


@register_metric(
    "relevance_mass_accuracy",
    reduce=reduce_relevance_mass_accuracy,
    requires=("masks",),
    higher_is_better={"relevance_mass_accuracy": True},
    group="localisation",
    reference="quantus",
    departures="Quantus sums the signed values, so its ratio leaves [0, 1] where signs cancel; ours takes the "
               "positive part (`negatives=\"clip\"`; `\"absolute\"`: |map|), and a map without relevance scores the "
               "mask's share (Quantus: NaN). On the same clipped maps it agrees to 4e-8.",
)
def _compute(batch: EvalBatch, *, negatives: Negatives = "clip") -> dict[str, Tensor]:
    maps, masks, ignore = batch_truth(batch)
    return {"relevance_mass_accuracy": relevance_mass_accuracy(maps, masks, negatives=negatives, ignore=ignore)}
