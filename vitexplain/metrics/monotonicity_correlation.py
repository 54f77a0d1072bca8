"""Monotonicity correlation: the rank correlation between a feature's attribution and how much the model's score
moves when that feature is drawn at random (Nguyen & Rodríguez Martínez, "On quantitative aspects of model
interpretability", arXiv 2007.07584, 2020, "monotonicity"; as Quantus's ``MonotonicityCorrelation`` computes it).

A feature that matters more should, when it is resampled, move the model's output more. The paper draws the feature
from a distribution (here uniform) and measures the expected change of the output; monotonicity is the Spearman
correlation of those with the attributions' magnitudes over the K features of the image:

    v_i = 1/N sum_{j=1}^{N} (f(x) - f(x^{(i, j)}))^2,
    monotonicity(x) = rho_S( (|a_1|, ..., |a_K|), (v_1, ..., v_K) ),

x^{(i, j)} the image with feature i replaced by the j-th draw (higher is better, at most 1). As implemented:

* features: the ``patch_size`` x ``patch_size`` patches (16; 1 = single pixels) of a grid centred on the image
  (``_regions.pixel_patches``), a_i the sum of the map upsampled bilinearly over the patch, |a_i| its magnitude
  (Quantus's default ``abs=True``);
* draws: U[0, 1) noise in every pixel and channel, in pixel units (the range of pixel values), normalised with the
  batch's ``mean`` / ``std`` (a batch without them is refused); N = ``n_samples`` (10, LATEC's setting of Quantus;
  Quantus's own default is 100) noise images drawn once from ``seed`` (``seeding.seeded_draw``) and shared by every
  image and feature (the features do not overlap, so a feature's N draws are independent of every other's);
* f = the explained class's softmax probability (``score``: or its logit or log). Quantus also divides v by f(x)^2,
  one factor per image, which no rank correlation over its features sees; left out;
* one forward per (feature, draw) and the intact image: N K + 1 per image, every (image, draw, feature) of the
  batch in chunks of ``batch_size`` (``_faithfulness.chunked_scores``); ties ranked by their average rank.

A constant map, or a model whose score no draw moves, has no correlation: it scores 0. Per image ``correlation`` [B];
reported ``monotonicity_correlation``, its mean (Quantus fills a feature with one random value per image and
draw, in the normalised space: docs/decisions/metrics-latec-faithfulness.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, PositiveInt, Score
from ..seeding import seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._faithfulness import chunked_scores, correlation, intact_logits, patch_features
from ._perturb import normalisation
from ._regions import class_score
from .base import EvalBatch, register_metric


def monotonicity_correlation(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                             pixel_mean: Sequence[float], pixel_std: Sequence[float], patch_size: int = 16,
                             n_samples: int = 10, score: str = "probability", batch_size: int = 128,
                             seed: int = 0) -> dict[str, Tensor]:
    """Per image, the Spearman correlation of the patches' |attribution| with the mean squared change of the score
    when each is replaced by uniform noise.

    Args:
        forward: the classifier's forward, images -> logits; called without gradients, in chunks of ``batch_size``.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose score is followed (the explained class) [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (the noise is in pixel units).
        patch_size: side of the square features, in pixels.
        n_samples: noise draws per feature (N).
        score: ``"probability"``, ``"logit"`` or ``"log_probability"`` of the explained class.
        batch_size: perturbed images per forward.
        seed: seed of the noise.

    Returns:
        ``correlation`` [B].
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    mean, std = normalisation(images, pixel_mean, pixel_std)
    feature, relevance, count = patch_features(maps, images, patch_size)
    noise = seeded_draw(seed, lambda generator: torch.rand((n_samples, *images.shape[1:]), generator=generator),
                        images.device)
    noise = (noise.to(images.dtype) - mean) / std
    intact = class_score(intact_logits(forward, images, batch_size), targets, score).to(torch.float64)
    labels = feature[0]

    def drawn(image: Tensor, copy: Tensor) -> Tensor:                # copy = draw * K + feature
        taken = (labels[None] == (copy % count)[:, None]).view(-1, 1, *images.shape[-2:])
        return torch.where(taken, noise[copy // count], images[image])

    values = chunked_scores(forward, targets, n_samples * count, drawn, batch_size, score)
    values = values.to(torch.float64).view(images.shape[0], n_samples, count)
    squares = (intact[:, :, None] - values).square().sum(1)
    return {"correlation": correlation(relevance.abs(), squares / n_samples, ranked=True).float()}


reduce_monotonicity_correlation = Means(monotonicity_correlation="correlation")


def _cost(options: dict, method: float) -> float:
    """Draws x patches + 1 at 224 px (the planning resolution of ``reproduce``): 1,961 at the defaults."""
    return options["n_samples"] * math.ceil(224 / options["patch_size"]) ** 2 + 1


@register_metric(
    "monotonicity_correlation",
    reduce=reduce_monotonicity_correlation,
    higher_is_better={"monotonicity_correlation": True},
    cost=_cost,
    group="faithfulness",
    reference=("latec", "quantus"),
    departures="Quantus's features are runs of consecutive attribution rank (LATEC: 3,136 entries), and its uniform "
               "fill draws one value per image and step, in the normalised space, from NumPy's global generator; "
               "ours perturbs 16 px patches with U[0, 1) noise in every pixel, in pixel units, drawn once from "
               "`seed` (10 draws, LATEC's). Given our patches and noise, Quantus gives the same correlations (to "
               "3e-8).",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength = 16, n_samples: PositiveInt = 10,
             score: Score = "probability", batch_size: PositiveInt = 128, seed: int = 0) -> dict[str, Tensor]:
    return monotonicity_correlation(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                                    pixel_std=batch.std, patch_size=patch_size, n_samples=n_samples, score=score,
                                    batch_size=batch_size, seed=seed)
