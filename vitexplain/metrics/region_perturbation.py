"""Region Perturbation: the area over the MoRF perturbation curve, regions replaced by uniform noise (Samek, Binder,
Montavon, Lapuschkin & Müller, "Evaluating the visualization of what a deep neural network has learned", IEEE
TNNLS 28(11), 2017, Sec. III).

The paper orders the image's locations by the heatmap, O = (r_1, r_2, ..., r_L) with h(r_i) > h(r_j) for i < j,
and removes them most relevant first (MoRF):

    x^(0)_MoRF = x,    x^(k)_MoRF = g(x^(k-1)_MoRF, r_k),  k = 1 ... L,

where g replaces the region at r_k by samples of the uniform distribution. The area over the MoRF perturbation
curve averages the fall of the classifier's score f over the L + 1 levels and the images:

    AOPC = 1 / (L + 1) < sum_{k=0}^{L} f(x^(0)_MoRF) - f(x^(k)_MoRF) >_p(x)

(higher is better: a map that finds the evidence makes f fall fast). As implemented:

* regions: the ``patch_size`` x ``patch_size`` patches (9, the paper's 9 x 9 regions) of a grid centred on the image
  (``_regions.pixel_patches``: when the size does not divide a side, the border patches are cut), ranked by the sum of
  the map (upsampled bilinearly to the image) over each, most relevant first; ties: the lower patch (raster order)
  first. The regions do not overlap, so every pixel is replaced once;
* g: uniform noise U[0, 1) in every pixel and channel, in pixel units (the paper's images are pixel values and its
  noise spans their range), normalised with the batch's ``mean`` / ``std`` (a batch without them is refused); one
  seeded draw of the image's shape (``seeding.seeded_draw``) shared by every image and step, so no value depends
  on the batch or the device (with disjoint regions this is the same as a fresh draw per region);
* L = ``n_regions`` (100, the paper's), or every patch when the image has fewer;
* f = the softmax probability of the explained class (``score``: or its logit, the score LRP explains, or its log).

Per image ``drop`` [B, L + 1], f(x) - f(x^(k)) for k = 0 ... L (0 at k = 0); reported ``aopc``, its mean over the
levels and the images (Quantus's ``RegionPerturbation`` returns the same drops without the k = 0 level, and
fills a region with one random scalar: docs/decisions/metrics-quantus-2.md).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, PositiveInt, Score
from ..seeding import seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import mixed_logits, normalisation
from ._regions import class_score, pixel_patches, pixel_rank, region_relevance, upsampled
from .base import Curves, EvalBatch, register_metric


def region_perturbation(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                        pixel_mean: Sequence[float], pixel_std: Sequence[float], patch_size: int = 9,
                        n_regions: int = 100, score: str = "probability", batch_size: int = 128,
                        seed: int = 0) -> dict[str, Tensor]:
    """Per-image drops of the explained class's score while the most relevant regions become uniform noise.

    Args:
        forward: the classifier's forward, images -> logits (e.g. ``adapter_for(model).logits``); called without
            gradients, in chunks of ``batch_size`` perturbed images.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose score is followed (the explained class) [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (the noise is drawn in
            pixel units).
        patch_size: side of the square regions, in pixels.
        n_regions: regions replaced, one per step (L).
        score: ``"probability"``, ``"logit"`` or ``"log_probability"`` of the explained class.
        batch_size: perturbed images per forward.
        seed: seed of the noise.

    Returns:
        ``drop``: [B, L + 1], f(x) - f(x^(k)) for k = 0 ... L regions replaced.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    mean, std = normalisation(images, pixel_mean, pixel_std)
    labels, count = pixel_patches(images.shape[-2], images.shape[-1], patch_size, images.device)
    rank = pixel_rank(region_relevance(upsampled(maps, images), labels[None], count, "sum"), labels[None], True)
    noise = seeded_draw(seed, lambda generator: torch.rand(images.shape[1:], generator=generator), images.device)
    noise = (noise.to(images.dtype)[None] - mean) / std
    steps = torch.arange(min(n_regions, count) + 1)                 # CPU: see mixed_logits
    values = class_score(mixed_logits(forward, images, noise, rank, steps, batch_size), targets, score)
    return {"drop": values[:, :1] - values}


#: AOPC: the mean drop over the L + 1 levels (k = 0 included) and the images
reduce_region_perturbation = Means(aopc="drop")


@register_metric(
    "region_perturbation",
    reduce=reduce_region_perturbation,
    higher_is_better={"aopc": True},
    cost=lambda options, method: options["n_regions"] + 1,      # at most: fewer when the image has fewer patches
    group="faithfulness",
    curves=Curves(lambda options, points: [float(k) for k in range(points)],
                  "patches replaced by uniform noise, most relevant first (0 = the image itself)",
                  {"drop": "drop of the explained class's score (probability unless score says otherwise)"}),
    reference=("latec", "quantus"),
    departures="Quantus's uniform fill gives each region one random value (normalised space, NumPy's global "
               "generator), returns the drops without their AOPC and calls lower better; ours fills every pixel with "
               "seeded U[0, 1) noise in pixel units (the paper) and reports the paper's AOPC, k = 0 included, higher "
               "better. Defaults are the paper's 9 px patches and 100 regions (LATEC: `patch_size=14`, "
               "`n_regions=10`).",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength = 9, n_regions: PositiveInt = 100,
             score: Score = "probability", batch_size: PositiveInt = 128, seed: int = 0) -> dict[str, Tensor]:
    return region_perturbation(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                               pixel_std=batch.std, patch_size=patch_size, n_regions=n_regions, score=score,
                               batch_size=batch_size, seed=seed)
