"""Faithfulness correlation: over many random subsets of pixels, the correlation between the map's sum over a subset
and the fall of the model's score when the subset is removed (Bhatt, Weller & Moura, "Evaluating and Aggregating
Feature-based Model Explanations", IJCAI 2020, Sec. 3.1, Eq. 2).

The paper asks that the total attribution of any set of features predict what removing the set costs the model:

    mu_F(f, g; x) = corr_{S in (d choose |S|)} ( sum_{i in S} g(f, x)_i ,  f(x) - f(x_[x_S = xbar_S]) ),

the Pearson correlation over subsets S of a fixed size, drawn at random, x_[x_S = xbar_S] the image with the
features of S set to a baseline xbar (higher is better, at most 1). As implemented:

* features: pixels, all channels of a pixel together (the maps are per pixel); g = the map upsampled bilinearly to
  the image; |S| = ``subset_size`` pixels (224: Quantus's default, which counts single input entries);
* ``n_samples`` subsets (100: Quantus's ``nr_runs``), drawn without replacement from ``seed``
  (``seeding.seeded_draw``) once, shared by every image, so no value depends on the batch or the device;
* xbar (``fill``): ``"black"`` (default, Quantus's ``perturb_baseline="black"``) = black pixels, the batch's
  ``-mean / std`` (refused without them); ``"zero"``, ``"mean"``, ``"blur"`` as SRG's fills;
* f = the explained class's logit (``score``: or its softmax probability or log-probability): Quantus's default
  here, whose ``__call__`` takes ``softmax=False`` for this metric (and ``True`` for pixel flipping and
  monotonicity correlation);
* the perturbed images of every (image, subset) pair of the batch go through the model in chunks of ``batch_size``
  (``_faithfulness.chunked_scores``): n_samples + 1 forwards per image.

A constant map, or a model whose score no subset moves, has no correlation: it scores 0. Per image ``correlation``
[B]; reported ``faithfulness_correlation``, its mean (Quantus's ``FaithfulnessCorrelation`` draws single input
entries and fills them with the image's minimum: docs/decisions/metrics-latec-faithfulness.md).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import AtLeastTwo, PixelArea, PositiveInt, Score
from ..seeding import seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._faithfulness import chunked_scores, constant, correlation, intact_logits
from ._regions import class_score, upsampled
from .base import EvalBatch, register_metric
from .srg import Fill, fill_images


def faithfulness_correlation(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                             pixel_mean: Sequence[float] | None = None, pixel_std: Sequence[float] | None = None,
                             n_samples: int = 100, subset_size: int = 224, fill: str = "black",
                             score: str = "logit", batch_size: int = 128, seed: int = 0) -> dict[str, Tensor]:
    """Per image, the Pearson correlation over random pixel subsets of their summed attribution with the score's drop
    when they are removed.

    Args:
        forward: the classifier's forward, images -> logits; called without gradients, in chunks of ``batch_size``.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose score is followed (the explained class) [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (``fill="black"`` only).
        n_samples: random subsets per image.
        subset_size: pixels per subset.
        fill: ``"black"``, ``"zero"``, ``"mean"`` or ``"blur"``.
        score: ``"logit"``, ``"probability"`` or ``"log_probability"`` of the explained class.
        batch_size: perturbed images per forward.
        seed: seed of the subsets.

    Returns:
        ``correlation`` [B].
    """
    check_image_batch(images)
    pixels = images.shape[-2] * images.shape[-1]
    if subset_size > pixels:
        raise ValueError(f"subset_size must be an integer from 1 to the image's {pixels} pixels "
                         f"({images.shape[-2]} x {images.shape[-1]}), got {subset_size!r}")
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    substitute = fill_images(images, fill, pixel_mean, pixel_std)
    chosen = seeded_draw(seed, lambda generator: torch.rand((n_samples, pixels), generator=generator)
                         .argsort(1)[:, :subset_size], images.device)
    taken = torch.zeros(n_samples, pixels, dtype=torch.bool, device=images.device).scatter_(1, chosen, True)
    relevance = upsampled(maps, images).flatten(1).masked_fill(constant(maps)[:, None], 0.0)
    sums = relevance @ taken.to(torch.float64).T                                        # [B, n_samples]
    intact = class_score(intact_logits(forward, images, batch_size), targets, score)

    def removed(image: Tensor, subset: Tensor) -> Tensor:
        fill = substitute if substitute.shape[0] == 1 else substitute[image]
        return torch.where(taken[subset].view(-1, 1, *images.shape[-2:]), fill, images[image])

    dropped = chunked_scores(forward, targets, n_samples, removed, batch_size, score)
    return {"correlation": correlation(sums, intact - dropped).float()}


reduce_faithfulness_correlation = Means(faithfulness_correlation="correlation")


@register_metric(
    "faithfulness_correlation",
    reduce=reduce_faithfulness_correlation,
    higher_is_better={"faithfulness_correlation": True},
    cost=lambda options, method: options["n_samples"] + 1,
    group="faithfulness",
    reference=("latec", "quantus"),
    departures="Quantus's features are single channel values, drawn per image from NumPy's global generator and "
               "filled with the image's minimum; ours removes 224 whole pixels per subset (LATEC's 100 subsets of "
               "224, in pixels), the subsets drawn once from `seed` for every image, filled with true black. Given "
               "our subsets and fill, Quantus gives the same correlations (to 2e-7).",
)
def _compute(batch: EvalBatch, *, n_samples: AtLeastTwo = 100, subset_size: PixelArea = 224,
             fill: Fill = "black", score: Score = "logit", batch_size: PositiveInt = 128,
             seed: int = 0) -> dict[str, Tensor]:
    return faithfulness_correlation(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                                    pixel_std=batch.std, n_samples=n_samples, subset_size=subset_size, fill=fill,
                                    score=score, batch_size=batch_size, seed=seed)
