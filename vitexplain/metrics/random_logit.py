"""Random Logit test (Sixt, Granz & Landgraf, "When Explanations Lie: Why Many Modified BP Attributions Fail", ICML
2020, Sec. 6.2): the map of the explained class against the map of a randomly chosen other class, compared by SSIM.

Sixt et al. find that several modified-backprop methods give nearly the same map whatever logit they explain; a map
that follows the class asked for changes. Per image:

* a random class c' ≠ c (the explained class), uniform among the others, drawn from a CPU ``torch.Generator`` seeded
  with ``derived_seed(seed, crc32(id))``: each image's draw depends on the seed and its id only, not on its batch or
  the device (Quantus reseeds NumPy's global generator per batch, so an image's class depends on its place in it);
* both maps divided by their largest |value| (Quantus's ``normalise=True``, ``normalise_by_max``; a zero map stays 0);
* SSIM (Wang, Bovik, Sheikh & Simoncelli, IEEE TIP 2004) with scikit-image's ``structural_similarity`` semantics, on
  the 2-D maps at the method's own resolution: uniform ``window`` x ``window`` windows (7, its default; **ours**: the
  largest odd size that fits when a map is smaller), K1 = 0.01, K2 = 0.03, sample covariances (N / (N - 1)),
  ``data_range`` = max - min over both maps together (what Quantus passes), averaged over the windows that lie inside
  the map (scikit-image computes every pixel with a reflected border, then crops those half a window from the
  border); computed batched in float64 with ``avg_pool2d`` (scikit-image is not a dependency). Two equal constant maps
  (data range 0) score 1. Quantus applies SSIM to the **flattened** maps (a 1-D signal with 7-entry windows), which
  mixes rows; here the maps stay 2-D, as Sixt et al. compare images.

Per image ``ssim`` [B] and ``random_class`` [B]; reported ``ssim``, its mean (↓: lower = the map follows the class).
Group "class sensitivity" (**ours**; Quantus files it under randomisation): nothing in the model is randomised, the
test asks whether the map follows the class asked for, which is what that group rewards.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..options import PositiveInt
from ..seeding import derived_seed, seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from .base import EvalBatch, register_metric

#: scikit-image's ``structural_similarity`` constants
K1, K2 = 0.01, 0.03


def random_classes(targets: Tensor, classes: int, keys: Sequence[str], seed: int) -> Tensor:
    """For each image a class other than its target, uniform among the ``classes`` - 1 others, from a generator seeded
    with ``derived_seed(seed, crc32(key))`` [B] (long, on the targets' device)."""
    if classes < 2:
        raise ValueError(f"the random logit test needs a model with at least 2 classes, this one has {classes}")
    if len(keys) != targets.shape[0]:
        raise ValueError(f"got {len(keys)} ids for {targets.shape[0]} images")
    drawn = torch.stack([seeded_draw(derived_seed(seed, zlib.crc32(str(key).encode())),
                                     lambda generator: torch.randint(classes - 1, (), generator=generator))
                         for key in keys]).to(targets.device)
    return drawn + (drawn >= targets).long()


def ssim(first: Tensor, second: Tensor, window: int = 7) -> Tensor:
    """SSIM of each pair of maps [B, h, w] -> [B] (float64), scikit-image's ``structural_similarity(a, b,
    win_size=window, data_range=max - min of both)`` (see the module docstring); ``window`` is reduced to the largest
    odd size that fits the maps."""
    a, b = first.double()[:, None], second.double()[:, None]
    side = min(window, *a.shape[-2:])
    side -= 1 - side % 2
    both = torch.cat([a, b], 1).flatten(1)
    span = both.max(1).values - both.min(1).values
    c1, c2 = ((K1 * span) ** 2).view(-1, 1, 1, 1), ((K2 * span) ** 2).view(-1, 1, 1, 1)
    pool = lambda x: F.avg_pool2d(x, side, stride=1)   # noqa: E731 - the windows that lie inside the map
    correction = side * side / (side * side - 1) if side > 1 else 1.0
    mean_a, mean_b = pool(a), pool(b)
    var_a = correction * (pool(a * a) - mean_a * mean_a)
    var_b = correction * (pool(b * b) - mean_b * mean_b)
    cov = correction * (pool(a * b) - mean_a * mean_b)
    numerator = (2 * mean_a * mean_b + c1) * (2 * cov + c2)
    denominator = (mean_a ** 2 + mean_b ** 2 + c1) * (var_a + var_b + c2)
    value = (numerator / denominator).flatten(1).mean(1)
    return torch.where(span > 0, value, torch.ones_like(value))


def _by_max(maps: Tensor) -> Tensor:
    high = maps.abs().flatten(1).max(1).values.view(-1, 1, 1)
    return maps / torch.where(high > 0, high, torch.ones_like(high))


def random_logit(explain: Callable[[Tensor, Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor,
                 keys: Sequence[str], *, classes: int, seed: int = 0, window: int = 7) -> dict[str, Tensor]:
    """Per-image SSIM between the map of the explained class and that of a random other class.

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test.
        images: preprocessed images [B, C, H, W].
        maps: the method's maps of ``images`` for ``targets`` [B, h, w].
        targets: the explained class of each image [B].
        keys: an id per image; with ``seed`` it decides the image's random class.
        classes: the model's number of classes.
        seed: seed of the random classes.
        window: side of SSIM's square windows.

    Returns:
        ``ssim`` [B] (float64) and ``random_class`` [B] (long).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    others = random_classes(targets, classes, keys, seed)
    other_maps = check_maps(explain(images, others).to(images.device), images.shape[0],
                            what="explanation map of the random class")
    if other_maps.shape != maps.shape:
        raise ValueError(f"explain returned maps of shape {tuple(other_maps.shape)}, expected {tuple(maps.shape)}")
    return {"ssim": ssim(_by_max(maps.double()), _by_max(other_maps.double()), window), "random_class": others}


reduce_random_logit = Means(ssim="ssim")


@register_metric(
    "random_logit",
    reduce=reduce_random_logit,
    requires=("explain",),
    higher_is_better={"ssim": False},
    cost=lambda options, method: method + 1,
    group="class sensitivity",
    reference="quantus",
    departures="Quantus flattens each map to one row before SSIM (windows of 7 pixels of a row) and draws the other "
               "class from NumPy's global generator, reseeded per batch; ours compares the 2-D maps with 7 × 7 "
               "windows and draws the class from `seed` and the image's id. Per image r = 0.75 against Quantus; "
               "methods rank alike.",
)
def _compute(batch: EvalBatch, *, seed: int = 0, window: PositiveInt = 7) -> dict[str, Tensor]:
    classes = batch.logits(batch.images[:1]).shape[-1]
    return random_logit(batch.explain, batch.images, batch.maps, batch.targets, batch.ids, classes=classes, seed=seed,
                        window=window)
