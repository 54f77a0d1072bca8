"""Explanation continuity (Montavon, Samek & Müller, "Methods for Interpreting and Understanding Deep Neural
Networks", Digital Signal Processing 73, 2018, Sec. 7.1): a map should not jump when the image moves a little.

Montavon et al. measure the strongest variation of the explanation over the input domain,

    max_{x ≠ x'} ‖R(x) − R(x')‖_1 / ‖x − x'‖_2,

and show it on a digit translated horizontally pixel by pixel: a continuous explanation follows the
digit, a discontinuous one (gradient-based maps of a ReLU network) jumps. Here, as Quantus's ``Continuity`` does, x'
runs over horizontal translations of the image and each is compared with the image itself; the number is the
maximum of the ratio over the translations. Lower is better.

Translations (**ours**: Quantus sweeps ``nr_steps`` shifts evenly over the whole width, from −W to +W, so most of
its x' are mostly fill): ``n_steps`` shifts of ``step`` pixels, alternately to the right and to the left, growing:
+step, −step, +2·step, −2·step, ... The uncovered columns are black pixels (−mean / std of the batch's
preprocessing, so a batch without it is refused, as the perturbation test; Quantus fills with the image's minimum).
A shift that leaves the image as it was (a translation of an image constant along x) is not a pair x ≠ x' and
counts 0.

The maps are upsampled to the image (bilinearly) and rescaled per image (``normalise``, default ``"maxabs"``, Quantus's
``normalise_by_max``) before the L1 norm, so that neither a method's scale nor its grid size decides; signs are kept
(the paper's R; Quantus takes absolute values by default). Each translation is one copy of the batch, re-explained
as max-sensitivity does (:mod:`._robustness`), so the random control draws afresh for it. Quantus explains the
unperturbed image again; here it is the batch's map. Float32; the maximum of float32 ratios.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import torch
from torch import Tensor

from ..maps import resize
from ..options import PixelLength, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps
from ._perturb import black_pixel
from ._robustness import Normalise, explained_copies, norm_of_difference, normalise_maps, translated
from .base import EvalBatch, register_metric


def translation_shifts(n_steps: int, step: int) -> list[int]:
    """The shifts in pixels along x: +step, −step, +2·step, −2·step, ... (``n_steps`` of them)."""
    return [(k + 1) // 2 * step * (1 if k % 2 else -1) for k in range(1, n_steps + 1)]


def continuity(explain: Callable[..., Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
               shifts: Sequence[int], fill: Tensor, normalise: str = "maxabs") -> Tensor:
    """Per image, max over ``shifts`` of ‖R(x) − R(x_shift)‖_1 / ‖x − x_shift‖_2 [B] (float32).

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test (given ``copy=k`` for the k-th shift
            when it takes ``copy``: :func:`._common.explain_copy`).
        images: preprocessed images [B, C, H, W]; maps: the method's maps of them [B, h, w]; targets: classes [B].
        shifts: translations along x in pixels (positive: to the right), one copy each.
        fill: the value of the uncovered pixels, broadcast to [B or 1, C, H, 1] (black: ``_perturb.black_pixel``).
        normalise: rescaling of every map per image, upsampled to the image, before the norm
            (:func:`._robustness.normalise_maps`).
    """
    check_image_batch(images)
    if not shifts:
        raise ValueError("continuity needs at least one shift")
    maps = check_maps(maps.to(images.device), images.shape[0])
    size = images.shape[-2:]
    reference = normalise_maps(resize(maps, size), normalise)
    copies = (translated(images, shift, fill) for shift in shifts)
    ratios = []
    for shift, perturbed in zip(shifts, explained_copies(explain, copies, targets, maps, what="a translated image")):
        distance = norm_of_difference(images, translated(images, shift, fill))
        change = norm_of_difference(reference, normalise_maps(resize(perturbed, size), normalise), order=1)
        ratios.append(torch.where(distance > 0, change / torch.where(distance > 0, distance, 1), 0))
    return torch.stack(ratios).max(0).values


reduce_continuity = Means(continuity="continuity")


@register_metric(
    "continuity",
    reduce=reduce_continuity,
    requires=("explain",),
    higher_is_better={"continuity": False},
    cost=lambda options, method: options["n_steps"] * method,
    group="robustness",
    reference=("latec", "quantus"),
    departures="Quantus sweeps its shifts evenly from −W to +W (most copies mostly fill, one the image itself), "
               "fills with the image's minimum and takes |·|; ours shifts by ±2, ±4 … px (8 copies), fills with true "
               "black and keeps the signs. Given Quantus's shifts and fill it agrees to 1e-6 (relative); LATEC ran an "
               "older Quantus's variant (20 shifts, 56 px patches compared by rank correlation).",
)
def _compute(batch: EvalBatch, *, n_steps: PositiveInt = 8, step: PixelLength = 2,
             normalise: Normalise = "maxabs") -> dict[str, Tensor]:
    fill = black_pixel(batch.images, batch.mean, batch.std)
    return {"continuity": continuity(batch.explain, batch.images, batch.maps, batch.targets,
                                     shifts=translation_shifts(n_steps, step), fill=fill, normalise=normalise)}
