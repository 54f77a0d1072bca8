"""Complexity: the entropy of the map's fractional contributions (Bhatt, Weller & Moura, "Evaluating and Aggregating
Feature-based Model Explanations", IJCAI 2020; Quantus's ``Complexity``).

With g_i the map's value at pixel i of the n pixels of the map upsampled bilinearly to the image (as sparseness
reads it), the fractional contribution of pixel i and the complexity are

    P_g(i) = |g_i| / sum_j |g_j|,        complexity = −sum_i P_g(i) ln P_g(i)   (nats, 0 ln 0 = 0).

Why: a map that spreads its magnitude over every pixel is as hard to read as no map (ln n, the most); one that puts
it all on one pixel is the simplest (0). It measures concentration, not correctness: a faithful map of a large
object scores high.

* Magnitudes |g| (the paper's and Quantus's ``abs=True``): a negative pixel contributes as much as a positive one.
* Quantus adds 1e-12 inside the logarithm (about n · 1e-12 nats: 5e-8 at 224 × 224) and divides 0 by 0 for a zero
  map; here 0 ln 0 = 0 exactly, and a zero map scores as a constant one, ln n, the limit of ever smaller constant maps
  (**ours**). Quantus's normalisation by the largest |value| (over the whole batch) does not change P_g.

In [0, ln n], lower is better (a more concise map). Per image ``complexity`` (float64); reported its mean.
Decisions: docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import resize
from ..uncertainty import Means
from ._common import check_maps
from .base import EvalBatch, register_metric


def complexity(maps: Tensor, image_size: tuple[int, int] | None = None) -> Tensor:
    """Entropy (nats) of each map's fractional contributions [B] (float64), after bilinear upsampling to
    ``image_size`` when given."""
    maps = check_maps(maps)
    if image_size is not None:
        maps = resize(maps, image_size)
    magnitude = maps.flatten(1).to(torch.float64).abs()
    total = magnitude.sum(1, keepdim=True)
    share = torch.where(total > 0, magnitude / total.where(total > 0, 1.0), 1.0 / magnitude.shape[1])
    return -(share * torch.where(share > 0, share.log(), 0.0)).sum(1)


reduce_complexity = Means(complexity="complexity")


@register_metric(
    "complexity",
    reduce=reduce_complexity,
    higher_is_better={"complexity": False},
    group="complexity",
    reference=("latec", "quantus"),
    departures="None in substance: the entropy of |map| / Σ |map| as Quantus computes it, to 1.6e-6; ours takes 0 ln "
               "0 = 0 exactly (Quantus adds 1e-12 in the logarithm) and gives a zero map ln n (Quantus: NaN).",
)
def _compute(batch: EvalBatch) -> dict[str, Tensor]:
    return {"complexity": complexity(batch.maps, tuple(batch.images.shape[-2:]))}
