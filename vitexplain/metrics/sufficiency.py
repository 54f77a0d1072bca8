"""Sufficiency (Dasgupta, Frost & Moshkovitz, "Framework for Evaluating Faithfulness of Local Explanations", ICML
2022, Sec. 3): how often the points an explanation applies to get the same prediction as the point it explains.

The paper's local sufficiency of x is Pr_{x'}[f(x') = f(x) | x' ∈ C_{e(x)}], C_e the points explanation e applies to,
and global sufficiency its expectation over x. It defines C_e for rules and highlighted features, not for saliency
maps; Quantus (``Sufficiency``) and LATEC, which this number is compared with, take "e(x) applies to x'" as "the maps
of x and x' are close", which is what is implemented:

* each map at the method's own resolution (**ours**: the bilinear upsampling of the other protocols would only
  interpolate, at 256 times the cost of the distances), its absolute value divided by its largest value (Quantus's
  ``abs=True`` and ``normalise_by_max``; a zero map stays 0);
* the standardised Euclidean distance between every two maps of the **dataset** (SciPy's ``seuclidean``: each
  entry's difference divided by that entry's variance over the maps, ddof = 1; an entry constant over the maps
  counts 0), the distances divided by the largest one (Quantus's ``normalise_by_max`` of the distance matrix);
* x' is a neighbour of x when that distance is at most ``threshold`` (0.6, Quantus's default), x' ≠ x;
* local sufficiency = the share of x's neighbours whose predicted class (argmax of the logits) is x's; 0 when x has
  none (Quantus's 0 / inf).

Quantus does all this within each batch it is given, so an image's value depends on its batch; here ``compute``
keeps each image's normalised map and prediction and ``reduce`` does the rest over the whole dataset, so the number
does not depend on batching (the bootstrap resamples whole images, duplicates included, and recomputes it: O(n^2 F)
per resample, the resamples of up to 64 images stacked a hundred to a call; :func:`drawn_sufficiency`). Reported:
``sufficiency`` (↑, the mean local sufficiency) and ``covered``, the share of images with at least one neighbour
(no direction). This measures consistency of similar maps (the paper's consistency is Pr[f(x') = f(x) | e(x') =
e(x)]) as much as sufficiency; docs/decisions/metrics-latec-faithfulness-2.md.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
from torch import Tensor

from ..options import PositiveInt, Range
from ..uncertainty import Stacked
from ._common import check_image_batch, check_maps
from ._perturb import mixed_logits
from .base import EvalBatch, register_metric


def sufficiency_inputs(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor,
                       batch_size: int = 128) -> dict[str, Tensor]:
    """What :func:`reduce_sufficiency` needs of each image: ``explanation`` [B, h*w], |map| / max |map| (float32),
    and ``prediction`` [B], the predicted class (as float)."""
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0]).flatten(1).float().abs()
    high = maps.max(1, keepdim=True).values
    explanation = maps / torch.where(high > 0, high, torch.ones_like(high))
    untouched = torch.zeros(images.shape[0], images.shape[-2] * images.shape[-1], dtype=torch.long,
                            device=images.device)
    logits = mixed_logits(forward, images, images, untouched, torch.tensor([0]), batch_size)[:, 0]
    return {"explanation": explanation, "prediction": logits.argmax(-1).float()}


def local_sufficiency(explanation: Tensor, prediction: Tensor, threshold: float = 0.6) -> tuple[Tensor, Tensor]:
    """Per image of a whole set, its local sufficiency [n] and whether it has a neighbour [n] (float64), from
    :func:`sufficiency_inputs`' values of its n images ([n, h*w] and [n])."""
    whole = torch.arange(explanation.shape[0], device=explanation.device)[None]
    local, covered = drawn_sufficiency(explanation, prediction, whole, threshold)
    return local[0], covered[0]


#: up to this many images, the distances of every resample come at once from the n x n pairs' squared differences,
#: weighted by each resample's variances (one matrix product: n^2 x resamples held); above, one resample at a time
SMALL_SET = 64


def drawn_sufficiency(explanation: Tensor, prediction: Tensor, positions: Tensor,
                      threshold: float = 0.6) -> tuple[Tensor, Tensor]:
    """:func:`local_sufficiency` of each of the R sets that ``positions`` [R, m] draws from the n images (rows,
    repeats allowed: the bootstrap's resamples), each as if alone: [R, m] each.

    A set's variances are those of its members, from the member counts (sums of the centred values and of their
    squares). Up to :data:`SMALL_SET` images, its distances come from each pair's own differences, for every set at
    once: the n x n squared differences weighted by each set's 1 / variance. Above, one set at a time, from
    ``torch.cdist`` of the members' scaled maps, whose expansion |a|^2 + |b|^2 - 2 a.b over more than 25 rows may lose
    the last digits of a distance between near-identical maps (a neighbour either way: far below the threshold).
    """
    maps = explanation.to(torch.float64)
    maps = maps - maps.mean(0)         # centred: the variances' sums of squares lose no digits to the mean
    positions, prediction = positions.to(maps.device), prediction.to(maps.device)
    groups = [positions] if maps.shape[0] <= SMALL_SET else positions.split(1)
    found = [_neighbourhoods(maps, prediction, rows, threshold) for rows in groups]
    return torch.cat([local for local, _ in found]), torch.cat([covered for _, covered in found])


def _neighbourhoods(maps: Tensor, prediction: Tensor, positions: Tensor, threshold: float) -> tuple[Tensor, Tensor]:
    """Local sufficiency and coverage [R, m] of the sets ``positions`` draws from the centred ``maps``."""
    count, entries = maps.shape
    sets, members = positions.shape
    if members > 1:
        counts = torch.zeros(sets, count, dtype=torch.float64, device=maps.device)
        counts.scatter_add_(1, positions, torch.ones_like(positions, dtype=torch.float64))
        total = counts @ maps
        variance = (counts @ maps.square() - total.square() / members) / (members - 1)
    else:
        variance = maps.new_zeros(sets, entries)
    varies = variance > 0              # an entry constant over the set adds nothing to any distance
    if count <= SMALL_SET:
        weight = torch.where(varies, 1 / torch.where(varies, variance, 1.0), 0.0)
        squared = torch.stack([(row - maps).square() @ weight.T for row in maps])       # [n, n, R]
        chosen = torch.arange(sets, device=maps.device)[:, None, None]
        distance = squared[positions[:, :, None], positions[:, None, :], chosen].clamp(min=0).sqrt()   # [R, m, m]
    else:
        scale = torch.where(varies, torch.where(varies, variance, 1.0).rsqrt(), 0.0)
        scaled = maps[positions] * scale[:, None, :]
        distance = torch.cdist(scaled, scaled)       # the matrix-product form: n^2 F per set, at BLAS speed
    high = distance.amax((-2, -1), keepdim=True)
    distance = distance / torch.where(high > 0, high, 1.0)
    near = (distance <= threshold) & ~torch.eye(members, dtype=torch.bool, device=maps.device)
    predicted = prediction[positions]
    same = predicted[:, :, None] == predicted[:, None, :]
    neighbours = near.sum(-1).to(torch.float64)
    agreeing = (near & same).sum(-1).to(torch.float64)
    return torch.where(neighbours > 0, agreeing / neighbours.clamp(min=1), 0.0), (neighbours > 0).to(torch.float64)


def sufficiency_numbers(values: dict[str, Tensor], positions: Tensor, threshold: float = 0.6) -> dict[str, Tensor]:
    """The reported numbers on each set of images ``positions`` draws [R] (:class:`~vitexplain.uncertainty.Stacked`:
    every bootstrap resample at once)."""
    local, covered = drawn_sufficiency(values["explanation"], values["prediction"], positions, threshold)
    return {"sufficiency": local.mean(-1), "covered": covered.mean(-1)}


reduce_sufficiency = Stacked(sufficiency_numbers)


@register_metric(
    "sufficiency",
    reduce=reduce_sufficiency,
    higher_is_better={"sufficiency": True},
    cost=lambda options, method: 1,
    group="faithfulness",
    carried=("explanation",),
    reference=("latec", "quantus"),
    departures="As Quantus computes it (|map| / max, standardised Euclidean distances, neighbours within "
               "`threshold`), but over the whole dataset instead of each batch (Quantus's values move by up to 0.29 "
               "with the batching) and at each map's own resolution. The threshold defaults to Quantus's 0.6 (LATEC: "
               "0.9).",
)
def _compute(batch: EvalBatch, *, threshold: Annotated[float, Range(low=0)] = 0.6,
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    # threshold is read by reduce_sufficiency (Metric.report hands it the option), over the whole dataset
    return sufficiency_inputs(batch.logits, batch.images, batch.maps, batch_size)
