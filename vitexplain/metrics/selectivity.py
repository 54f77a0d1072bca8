"""Selectivity: how fast the explained score falls while patches are set to black, most relevant first (Montavon,
Samek & Müller, "Methods for interpreting and understanding deep neural networks", Digital Signal Processing 73,
2018, Sec. 7.2, "Explanation selectivity"; the pixel-flipping of Bach et al. 2015 and Samek et al. 2017).

"At each iteration, a patch of size 4 x 4 corresponding to the region with highest relevance is set to black. The
plot keeps track of the function value f(x) as the features are being progressively removed": with x^(0) = x and
x^(k) the image with its k most relevant patches black, the curve is k -> f(x^(k)), and a selective explanation makes
it fall fast. The number is the area under the curve (as Quantus reports it), lower is better:

    AUC = integral_0^1 f(x^(t K)) dt,  by the trapezoidal rule on t = k / K, k = 0 ... K  (K patches in all).

As implemented:

* patches of ``patch_size`` pixels on a grid centred on the image (``_regions.pixel_patches``; cut at the borders when
  the size does not divide a side), ranked by the sum of the map (upsampled bilinearly) over each, most relevant
  first; ties: the lower patch (raster order) first. The paper's 4 x 4 patches made a 7 x 7 grid of its 28 x 28
  MNIST digits; by default (``patch_size=None``) the patches are ceil(shorter side / 7) pixels, which keeps that
  7 x 7 grid and its 49 steps wherever 7 divides the side (16 px at 112, 32 at 224; 6 x 6 patches of 5 px at 30);
  ``patch_size=4`` is the literal size;
* black = 0 in every channel before normalisation, i.e. ``-mean / std`` of the batch's normalisation (the black of
  the perturbation test; a batch without it is refused);
* every patch is removed, one per step: K + 1 points, the image itself first, all black last;
* f = the softmax probability of the explained class (``score``: or its logit, or its log).

Per image ``score`` [B, K + 1]; reported ``auc``, the mean over images of the curve's trapezoidal area over [0, 1].
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, PositiveInt, Score
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits
from ._regions import class_score, pixel_patches, pixel_rank, region_relevance, upsampled
from .base import Curves, EvalBatch, register_metric

#: patches per side of the paper's grid (4 x 4 patches of 28 x 28 MNIST digits)
GRID = 7


def selectivity(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                pixel_mean: Sequence[float], pixel_std: Sequence[float], patch_size: int | None = None,
                score: str = "probability", batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image curves of the explained class's score while patches turn black, most relevant first.

    Args:
        forward, images, maps, pixel_mean, pixel_std, batch_size: as in
            :func:`vitexplain.metrics.region_perturbation.region_perturbation`.
        targets: class whose score is followed (the explained class) [B].
        patch_size: side of the patches in pixels; None: ceil(shorter side / 7), the paper's 7 x 7 grid.
        score: ``"probability"``, ``"logit"`` or ``"log_probability"`` of the explained class.

    Returns:
        ``score``: [B, K + 1], f(x^(k)) for k = 0 ... K patches black.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    height, width = images.shape[-2:]
    size = math.ceil(min(height, width) / GRID) if patch_size is None else patch_size
    labels, count = pixel_patches(height, width, size, images.device)
    rank = pixel_rank(region_relevance(upsampled(maps, images), labels[None], count, "sum"), labels[None], True)
    black = black_pixel(images, pixel_mean, pixel_std)
    steps = torch.arange(count + 1)                 # CPU: see mixed_logits
    return {"score": class_score(mixed_logits(forward, images, black, rank, steps, batch_size), targets, score)}


def curve_area(curves: Tensor) -> Tensor:
    """Trapezoidal area of each curve [B, n] with its n points spread evenly over [0, 1], [B]."""
    return torch.trapezoid(curves, dx=1 / (curves.shape[-1] - 1), dim=-1)


def reduce_selectivity(values: dict[str, Tensor]) -> dict[str, float]:
    return {"auc": curve_area(values["score"].to(torch.float64)).mean().item()}


def _cost(options: dict, method: float) -> float:
    """Patches + 1 at 224 px (the planning resolution of ``reproduce``): 50 on the default 7 x 7 grid."""
    side = math.ceil(224 / (options["patch_size"] or math.ceil(224 / GRID)))
    return side * side + 1


@register_metric(
    "selectivity",
    reduce=reduce_selectivity,
    higher_is_better={"auc": False},
    cost=_cost,
    group="faithfulness",
    curves=Curves(lambda options, points: [k / (points - 1) for k in range(points)],
                  "share of the patches set to black, most relevant first (0 = the image itself)",
                  {"score": "score of the explained class (probability unless score says otherwise)"}),
    reference="quantus",
    departures="Quantus's default black is the image's minimum, its patches 8 px, and its area, in steps without the "
               "intact image, grows with the number of patches; ours uses true black, the paper's 7 × 7 grid of "
               "patches and the area over [0, 1] with the intact image. With the same black and patches the curves "
               "are identical.",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength | None = None, score: Score = "probability",
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return selectivity(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                       pixel_std=batch.std, patch_size=patch_size, score=score, batch_size=batch_size)
