"""Non-sensitivity (Nguyen & Martínez, "On Quantitative Aspects of Model Interpretability", arXiv:2007.07584, 2020,
Sec. 3.2): a feature the map gives no attribution should be one the model's output does not depend on, and the
other way round.

Nguyen & Martínez count the features on which the two disagree, the size of the symmetric difference

    |X_0 Δ X_f|,   X_0 = {i : a_i = 0},   X_f = {i : f does not change when x_i is perturbed},

0 for a map that is zero exactly where the model is insensitive. As Quantus's ``NonSensitivity``, "zero" is below
``eps``, of the map rescaled by its largest magnitude (|a| / max |a|) and of the change of the explained class's
softmax probability when the feature alone is replaced by a baseline.

Features (**ours**): the ``patch_size`` × ``patch_size`` patches of the image (all channels together; 16: a ViT-B/16
token), where Quantus perturbs each element of the input (C × H × W forwards per image, 150,528 at 224 pixels). A
patch's attribution is the largest magnitude of the map over its pixels, the map brought to the image by nearest
neighbours: a patch is "zero" only if every cell of the map over it is, and interpolation, which the other pixel
protocols use, would spread non-zero values onto cells the method left at exactly 0. A patch is replaced by black
(−mean / std of the batch's preprocessing; a batch without it is refused, as the perturbation test), one forward
per patch, in chunks of ``batch_size`` (``_perturb.mixed_logits``). The value is the *share* of the patches in the
symmetric difference (the count divided by the number of patches; lower is better), so that it reads the same at
any patch size; the paper's count is the share times the number of patches.

What it can and cannot tell: a map without any near-zero value (a random or constant map, most gradient maps) has
X_0 empty and scores the share of patches the model ignores, whatever else it says; only maps that are exactly zero
somewhere (thresholded, ReLU-ed or sparse maps) are told apart by it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, Positive, PositiveInt, Score
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits
from ._regions import class_score, pixel_patches
from ._robustness import normalise_maps
from .base import EvalBatch, register_metric


def patch_attribution(maps: Tensor, labels: Tensor, count: int, size: tuple[int, int]) -> Tensor:
    """Per image the largest |map| over each patch [B, count] (float32): the map rescaled by its largest magnitude,
    brought to ``size`` (H, W) by nearest neighbours, labels [H, W] the patch of each pixel."""
    scaled = normalise_maps(maps.float(), "maxabs").abs()
    pixels = torch.nn.functional.interpolate(scaled[:, None], size=tuple(size), mode="nearest-exact")[:, 0]
    index = labels.reshape(1, -1).expand(maps.shape[0], -1)
    return pixels.new_zeros(maps.shape[0], count).scatter_reduce_(1, index, pixels.flatten(1), "amax")


def non_sensitivity(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                    pixel_mean: Sequence[float] | None, pixel_std: Sequence[float] | None, patch_size: int = 16,
                    eps: float = 1e-5, score: str = "probability", batch_size: int = 64) -> dict[str, Tensor]:
    """Per image the share of patches where "zero attribution" and "the output does not change" disagree.

    Args:
        forward: images -> logits, batched (the bench's ``EvalBatch.logits``).
        images: preprocessed images [B, C, H, W]; maps: their maps [B, h, w]; targets: explained classes [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (what black is).
        patch_size: side of the square patches, in pixels (:func:`._regions.pixel_patches`).
        eps: below it, an attribution (rescaled to max |a| = 1) is zero and a change of the score is none.
        score: the explained class's ``"probability"`` (Quantus), ``"logit"`` or ``"log_probability"``.
        batch_size: perturbed images per forward.

    Returns:
        per image [B] (float64): ``non_sensitivity``, the share of the patches in the symmetric difference;
        ``zero_attribution`` and ``insensitive``, the shares of patches in X_0 and in X_f.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    labels, count = pixel_patches(images.shape[-2], images.shape[-1], patch_size, images.device)
    zero = patch_attribution(maps, labels, count, images.shape[-2:]) < eps
    rank = labels.reshape(1, -1).expand(images.shape[0], -1)        # patch k is taken at step k + 1
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(count)])     # step 0: the image itself
    counts = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, count + 1)])
    black = black_pixel(images, pixel_mean, pixel_std)
    values = class_score(mixed_logits(forward, images, black, rank, counts, batch_size, starts), targets, score)
    insensitive = (values[:, 1:] - values[:, :1]).abs() < eps
    disagree = zero ^ insensitive
    return {"non_sensitivity": disagree.to(torch.float64).mean(1),
            "zero_attribution": zero.to(torch.float64).mean(1), "insensitive": insensitive.to(torch.float64).mean(1)}


def _cost(options: dict, method: float) -> float:
    """Patches + 1 at 224 px (the planning resolution of ``reproduce``): 197 at 16-pixel patches."""
    side = math.ceil(224 / options["patch_size"])
    return side * side + 1


reduce_non_sensitivity = Means(non_sensitivity="non_sensitivity")


@register_metric(
    "non_sensitivity",
    reduce=reduce_non_sensitivity,
    higher_is_better={"non_sensitivity": False},
    cost=_cost,
    group="faithfulness",
    reference="quantus",
    departures="Quantus makes every input element a feature (150,528 forwards per 224 px image); ours takes 16 px "
               "patches, all channels together, set to black. On single pixels with baseline 0 it gives Quantus's "
               "counts.",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength = 16,
             eps: Positive = 1e-5, score: Score = "probability",
             batch_size: PositiveInt = 64) -> dict[str, Tensor]:
    return non_sensitivity(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                           pixel_std=batch.std, patch_size=patch_size, eps=eps, score=score, batch_size=batch_size)
