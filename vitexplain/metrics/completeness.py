"""Completeness (Sundararajan, Taly & Yan, "Axiomatic Attribution for Deep Networks", ICML 2017, Sec. 3, Prop. 1):
the attributions add up to the difference between the output at the input and at the baseline,

    Σ_i a_i(x) = F(x) - F(x'),

which Integrated Gradients satisfies by construction, as do LRP's conservative rules with the bias terms counted. The
baseline x' is the paper's black image (0 before normalisation: ``-mean / std``; a batch without the normalisation is
refused); F = the explained class's logit (``score``: or its probability or log-probability; the paper's F is the
network's output, Quantus's ``Completeness`` scores logits).

Per image: ``attribution_sum`` Σ a_i over the map **at its own resolution** (each entry the attribution of one
feature: a pixel, or a patch for token maps; the bilinear upsampling of the other protocols would scale the sum by
the pixels per entry), ``output_difference`` F(x) - F(x'), ``gap`` their difference, ``abs_gap`` |gap| and ``complete``
= 1 where |gap| ≤ ``rtol`` x |F(x) - F(x')|. Reported: ``abs_gap`` (↓, in the units of F) and ``complete`` (↑, the share
of images within the tolerance). Quantus returns ``Σ a == F(x) - F(x')`` compared exactly, after dividing the map by its
largest |value| by default (``normalise=True``), which no float map meets.

Group "faithfulness" (**ours**): the built-in protocols must declare a kind, and of ``metrics.base.GROUPS`` this
is the one about the map's relation to the model's output. Unlike the others of the group it scores a map's scale,
its sum, not which pixels it ranks first: every other faithfulness protocol here is unchanged when a map is multiplied
by a positive number, and most methods return maps in arbitrary units (min-max normalised attention products), so
among methods without a conservation claim it ranks units. It is the check for those with one (IG, LRP / AttnLRP).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import NonNegative, PositiveInt, Score
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits
from ._regions import class_score
from .base import EvalBatch, register_metric


def completeness(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                 pixel_mean: Sequence[float], pixel_std: Sequence[float], score: str = "logit", rtol: float = 0.01,
                 batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image sums of the maps against the change of the explained class's score from the black baseline.

    Args:
        forward: images -> logits, batched, called without gradients.
        images: preprocessed images [B, C, H, W].
        maps: attributions [B, h, w], summed as they are.
        targets: the explained class of each image [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (black = 0 before it).
        score: ``"logit"``, ``"probability"`` or ``"log_probability"`` of the explained class.
        rtol: tolerance of ``complete``, relative to |F(x) - F(x')|.
        batch_size: images per forward.

    Returns:
        ``attribution_sum``, ``output_difference``, ``gap``, ``abs_gap``, ``complete``: [B] each.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    every = torch.zeros(images.shape[0], images.shape[-2] * images.shape[-1], dtype=torch.long, device=images.device)
    # step 0: the image itself; step 1: every pixel black, the baseline
    logits = mixed_logits(forward, images, black_pixel(images, pixel_mean, pixel_std), every, torch.tensor([0, 1]),
                          batch_size)
    values = class_score(logits, targets, score).double()
    difference = values[:, 0] - values[:, 1]
    total = maps.double().flatten(1).sum(1)
    gap = total - difference
    return {"attribution_sum": total, "output_difference": difference, "gap": gap, "abs_gap": gap.abs(),
            "complete": (gap.abs() <= rtol * difference.abs()).double()}


reduce_completeness = Means(abs_gap="abs_gap", complete="complete")


@register_metric(
    "completeness",
    reduce=reduce_completeness,
    higher_is_better={"abs_gap": False, "complete": True},
    cost=lambda options, method: 2,
    group="faithfulness",
    reference="quantus",
    departures="Quantus tests Σ a = F(x) − F(x′) exactly (no float map passes), by default on the map divided by its "
               "largest |value|, against the image's minimum; ours reports the gap and passes within `rtol` (1 %), "
               "against true black, the map summed at its own resolution.",
)
def _compute(batch: EvalBatch, *, score: Score = "logit", rtol: NonNegative = 0.01,
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return completeness(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                        pixel_std=batch.std, score=score, rtol=rtol, batch_size=batch_size)
