"""Effective complexity: how many pixels carry more than a sliver of the map (Nguyen & Martínez, "On quantitative
aspects of model interpretability", arXiv:2007.07584, 2020; Quantus's ``EffectiveComplexity``).

With g_i the map's value at pixel i of the map upsampled bilinearly to the image (as sparseness reads it),

    effective complexity = |{ i : |g_i| / max_j |g_j| > ε }|,

the number of pixels whose magnitude, relative to the map's largest, exceeds ε (``eps``, Quantus's default 1e-5).
Why: Nguyen & Martínez count the attributions above ε as the features an explanation really uses; the fewer, the
simpler the explanation.

* Magnitudes |g| (Quantus's ``abs=True``), divided by the map's own largest magnitude before the threshold: Quantus
  divides by the largest over the whole batch (``normalise_by_max`` over every axis), so an image's count there
  depends on the other images; here it does not (**ours**; identical for a batch of one).
* A zero map has no pixel above the threshold: 0 (as Quantus).
* A count of pixels at the scored resolution (a 224 × 224 image has 50,176): the paper's and Quantus's unit. Bilinear
  upsampling gives every pixel between two non-zero tokens a non-zero value, so a token map's count grows with the
  image.

In [0, n], lower is better. Per image ``effective_complexity`` (float64); reported its mean. Decisions:
docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import resize
from ..options import NonNegative
from ..uncertainty import Means
from ._common import check_maps
from .base import EvalBatch, register_metric


def effective_complexity(maps: Tensor, image_size: tuple[int, int] | None = None, *, eps: float = 1e-5) -> Tensor:
    """Pixels of each map [B] (float64 counts) whose |value| / the map's largest |value| exceeds ``eps``, after
    bilinear upsampling to ``image_size`` when given."""
    maps = check_maps(maps)
    if image_size is not None:
        maps = resize(maps, image_size)
    magnitude = maps.flatten(1).to(torch.float64).abs()
    largest = magnitude.max(1, keepdim=True).values
    relative = magnitude / largest.where(largest > 0, 1.0)
    return (relative > eps).sum(1).to(torch.float64)


reduce_effective_complexity = Means(effective_complexity="effective_complexity")


@register_metric(
    "effective_complexity",
    reduce=reduce_effective_complexity,
    higher_is_better={"effective_complexity": False},
    group="complexity",
    reference=("latec", "quantus"),
    departures="Quantus divides the maps by the largest value over the whole batch before counting, so an image's "
               "count depends on its batch; ours divides each map by its own largest |value| (Quantus's batches of "
               "one agree exactly). ε defaults to Quantus's 1e-5 (LATEC: `eps=0.01`).",
)
def _compute(batch: EvalBatch, *, eps: NonNegative = 1e-5) -> dict[str, Tensor]:
    return {"effective_complexity": effective_complexity(batch.maps, tuple(batch.images.shape[-2:]), eps=eps)}
