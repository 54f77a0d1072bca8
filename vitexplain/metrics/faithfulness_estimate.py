"""Faithfulness estimate: the correlation between what a map gives each feature and the fall of the model's score
when that feature alone is removed (Alvarez-Melis & Jaakkola, "Towards Robust Interpretability with
Self-Explaining Neural Networks", NeurIPS 2018, the faithfulness evaluation of Sec. 5).

The paper removes the features of an input one at a time, sets each to a baseline value, and measures the drop of
the model's prediction; an explanation is faithful when its relevance scores follow those drops:

    faithfulness(x) = rho( (a_1, ..., a_K), (f(x) - f(x_{-1}), ..., f(x) - f(x_{-K})) ),

rho the Pearson correlation over the K features of the image, a_i the map's attribution of feature i and x_{-i} the
image with feature i replaced (higher is better, at most 1). As implemented:

* features: the ``patch_size`` x ``patch_size`` patches (16, a ViT-B/16 token; 1 = single pixels, all channels
  together) of a grid centred on the image (``_regions.pixel_patches``: cut at the borders when the size does not
  divide a side); a_i = the sum of the map, upsampled bilinearly to the image, over the patch (Quantus sums too);
* removal (``fill``): ``"black"`` (default, Quantus's ``perturb_baseline="black"``) = black pixels, the batch's
  ``-mean / std`` (refused without them); ``"zero"``, ``"mean"``, ``"blur"`` as SRG's fills;
* f = the explained class's logit (``score``: or its softmax probability or log-probability): Quantus's default
  here, whose ``__call__`` takes ``softmax=False`` for this metric (and ``True`` for pixel flipping and
  monotonicity correlation);
* every feature is removed from the intact image, each as one perturbed image: K + 1 forwards per image, in chunks
  of ``batch_size`` (``_perturb.mixed_logits``, each pixel's rank its patch).

A constant map, or a model whose score no removal moves, has no correlation: it scores 0. Per image ``correlation``
[B]; reported ``faithfulness_estimate``, its mean (Quantus's ``FaithfulnessEstimate`` removes single input
entries, or groups of entries of consecutive attribution rank: docs/decisions/metrics-latec-faithfulness.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, PositiveInt, Score
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._faithfulness import correlation, patch_features
from ._perturb import mixed_logits
from ._regions import class_score
from .base import EvalBatch, register_metric
from .srg import Fill, fill_images


def faithfulness_estimate(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                          pixel_mean: Sequence[float] | None = None, pixel_std: Sequence[float] | None = None,
                          patch_size: int = 16, fill: str = "black", score: str = "logit",
                          batch_size: int = 128) -> dict[str, Tensor]:
    """Per image, the Pearson correlation of the patches' attributions with the score's drop when each is removed.

    Args:
        forward: the classifier's forward, images -> logits; called without gradients, in chunks of ``batch_size``.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose score is followed (the explained class) [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (``fill="black"`` only).
        patch_size: side of the square features, in pixels.
        fill: ``"black"``, ``"zero"``, ``"mean"`` or ``"blur"``.
        score: ``"logit"``, ``"probability"`` or ``"log_probability"`` of the explained class.
        batch_size: perturbed images per forward.

    Returns:
        ``correlation`` [B].
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    substitute = fill_images(images, fill, pixel_mean, pixel_std)
    feature, relevance, count = patch_features(maps, images, patch_size)
    counts = torch.arange(count + 1)                 # step 0 the image itself, step k feature k - 1 alone (CPU)
    starts = (counts - 1).clamp(min=0)
    values = class_score(mixed_logits(forward, images, substitute, feature, counts, batch_size, starts), targets, score)
    return {"correlation": correlation(relevance, values[:, :1] - values[:, 1:]).float()}


reduce_faithfulness_estimate = Means(faithfulness_estimate="correlation")


def _cost(options: dict, method: float) -> float:
    """Patches + 1 at 224 px (the planning resolution of ``reproduce``): 197 at the default 16 px."""
    return math.ceil(224 / options["patch_size"]) ** 2 + 1


@register_metric(
    "faithfulness_estimate",
    reduce=reduce_faithfulness_estimate,
    higher_is_better={"faithfulness_estimate": True},
    cost=_cost,
    group="faithfulness",
    reference=("latec", "quantus"),
    departures="Quantus's features are runs of `features_in_step` entries of consecutive attribution rank (LATEC's "
               "224 group about 75 scattered pixels), filled with the image's minimum; ours removes each 16 px patch "
               "alone into true black. Given patch-constant maps and the same fill, Quantus gives the same "
               "correlations (to 2e-7).",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength = 16, fill: Fill = "black", score: Score = "logit",
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return faithfulness_estimate(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                                 pixel_std=batch.std, patch_size=patch_size, fill=fill, score=score,
                                 batch_size=batch_size)
