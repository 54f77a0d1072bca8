"""Efficient MPRT (Hedström et al., XAI in Action workshop, NeurIPS 2023): the relative rise in an explanation's
complexity from the trained to the fully randomised model.

Hedström, Weber, Bareeva, Motzkus, Samek, Lapuschkin, Höhne, "Sanity Checks Revisited: An Exploration to Repair
the Model Parameter Randomisation Test", XAI in Action: Past, Present, and Future Applications (NeurIPS 2023
workshop); Quantus's ``EfficientMPRT``. Instead of a similarity between the maps of the trained model f and of
the randomised model f̂ (whose reading depends on the similarity measure), eMPRT asks whether the explanation
becomes more complex — closer to noise — once the model's parameters are random::

    eMPRT(x) = (H(e(x; f̂)) − H(e(x; f))) / H(e(x; f)),

with H the discrete entropy of the histogram of the map's values: n equal-width bins between the map's minimum
and maximum (the histogram of the min-max normalised map), H = −Σ_k p_k ln p_k over the bins' shares p_k
(Quantus's ``discrete_entropy``: ``np.histogram(a, bins=n_bins)`` then ``scipy.stats.entropy``, n_bins = 100), of
the map upsampled bilinearly to the image as every protocol here reads a token map (``resolution="image"``; what
Quantus, which takes maps of the input's shape, is given for a ViT; ``"map"``: the map's own values).
Higher is better: a map that follows the model turns into noise (entropy up); one that ignores the model keeps
its entropy (0). A constant map has entropy 0 on both models and scores 0 (nothing rose; Quantus divides 0 by 0);
a map constant on the trained model only has no relative rise (NaN, counted as ``undefined``, left out of the
mean). Reported: ``complexity_rise`` (mean over images), the mean entropies, and with ``cascade`` the entropy at
every level of the cascade (curves). The layers are randomised as in smooth MPRT (timm's initialisation, from
``seed``, the model changed only within :attr:`EvalBatch.modified`); decisions and Quantus's departures:
docs/decisions/metrics-mprt.md.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation.randomisation import Randomisation
from ..maps import resize
from ..options import PositiveInt
from ._common import check_image_batch, check_maps
from ._randomise import check_explained, modifier_of
from .base import Curves, EvalBatch, register_metric
from .smooth_mprt import NOMINAL_LEVELS

Resolution = Literal["image", "map"]


def histogram_entropy(maps: Tensor, n_bins: int = 100) -> Tensor:
    """Discrete entropy (nats) of each map's histogram of ``n_bins`` equal-width bins between its minimum and its
    maximum [B] (float64), as ``scipy.stats.entropy(np.histogram(map, bins=n_bins)[0])`` (a constant map: one
    bin, 0)."""
    flat = maps.flatten(1)
    flat = flat if flat.is_floating_point() else flat.double()   # numpy's arithmetic is in the map's own dtype
    low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    constant = high == low
    low, high = torch.where(constant, low - 0.5, low), torch.where(constant, high + 0.5, high)
    # numpy's rule: the index from the scaled offset, the maximum in the last (closed) bin, then moved by one where
    # the value lies on the other side of its bin's edge as linspace computes the edges
    index = (((flat - low) / (high - low)) * n_bins).long().clamp(0, n_bins - 1)
    steps = torch.arange(n_bins + 1, device=flat.device, dtype=flat.dtype)
    edges = steps * ((high - low) / n_bins) + low                 # [B, n_bins + 1], np.linspace(low, high)
    edges[:, -1:] = high
    index = index - (flat < edges.gather(1, index)).long()
    index = index + ((flat >= edges.gather(1, index + 1)) & (index != n_bins - 1)).long()
    counts = torch.zeros(flat.shape[0], n_bins, dtype=torch.float64, device=flat.device)
    counts.scatter_add_(1, index, torch.ones_like(flat, dtype=torch.float64))
    shares = counts / flat.shape[1]
    return -(shares * torch.where(shares > 0, shares.log(), 0.0)).sum(1)


def relative_rise(trained: Tensor, random: Tensor) -> Tensor:
    """(random − trained) / trained per image: 0 where both are 0, NaN where only ``trained`` is."""
    rise = (random - trained) / torch.where(trained > 0, trained, 1.0)
    return torch.where(trained > 0, rise, torch.where(random > 0, float("nan"), 0.0))


def efficient_mprt(explain, modified, images: Tensor, maps: Tensor, targets: Tensor, *, n_bins: int = 100,
                   seed: int = 0, cascade: bool = False, resolution: str = "image") -> dict[str, Tensor]:
    """eMPRT of each image's explanation: ``complexity_rise`` [B], ``entropy_trained`` [B] and ``entropy_levels``
    [B, levels] (``cascade``) or [B, 1] (the fully random model), float64.

    Args:
        explain: (images, targets) -> maps, the method under test (run on the changed model within ``modified``).
        modified: :attr:`EvalBatch.modified`.
        images, maps, targets: the batch's images, the method's maps of them on the trained model, their classes.
        n_bins: histogram bins (Quantus: 100).
        seed: seeds the re-initialisation.
        cascade: the entropy at every level of the cascade (curves; the score is the last level's either way);
            False: the fully random model only, as Quantus's default ``skip_layers=True``.
        resolution: ``"image"``: the histogram of the map upsampled bilinearly to the image (what Quantus is
            given: maps of the input's shape); ``"map"``: of the map's own values (a token map's 196 values).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    size = tuple(images.shape[-2:]) if resolution == "image" else tuple(maps.shape[-2:])
    trained = histogram_entropy(resize(maps, size), n_bins)

    def entropy(change: Randomisation) -> Tensor:
        with modified(change):
            random = check_explained(explain(images, targets), maps, "of the randomised model")
        return histogram_entropy(resize(random, size), n_bins)

    first = Randomisation(0 if cascade else None, seed)
    columns = [entropy(first)]
    if cascade:
        columns += [entropy(Randomisation(level, seed)) for level in range(1, len(first.levels))]
    levels = torch.stack(columns, 1)
    return {"complexity_rise": relative_rise(trained, levels[:, -1]), "entropy_trained": trained,
            "entropy_levels": levels}


def reduce_efficient_mprt(values: dict[str, Tensor]) -> dict[str, float]:
    rise = values["complexity_rise"].double()
    defined = ~rise.isnan()
    return {"complexity_rise": rise[defined].mean().item() if defined.any() else float("nan"),
            "entropy_trained": values["entropy_trained"].double().mean().item(),
            "entropy_random": values["entropy_levels"].double()[:, -1].mean().item(),
            "undefined": int((~defined).sum())}


@register_metric(
    "efficient_mprt",
    reduce=reduce_efficient_mprt,
    requires=("explain", "model"),
    higher_is_better={"complexity_rise": True},
    # one explanation per level (a ViT-B's 14 levels with the cascade), the trained model's map is the batch's
    cost=lambda options, method: (NOMINAL_LEVELS if options["cascade"] else 1) * method,
    group="randomisation",
    curves=Curves(lambda options, points: [float(k) for k in range(1, points + 1)],
                  "levels of the model randomised, top first (head, blocks from the last, embedding)",
                  {"entropy_levels": "discrete entropy (nats) of the randomised model's map"}),
    reference="quantus",
    departures="Quantus re-seeds before each module's reset, so modules of one shape get the same weights, and "
               "leaves the class token and position embedding trained; ours re-draws every parameter from one seeded "
               "generator. A constant map scores 0 (Quantus: NaN); on the same random model the entropies agree to "
               "1e-16.",
)
def _compute(batch: EvalBatch, *, n_bins: PositiveInt = 100, seed: int = 0, cascade: bool = False,
             resolution: Resolution = "image") -> dict[str, Tensor]:
    return efficient_mprt(batch.explain, modifier_of(batch, "efficient_mprt"), batch.images, batch.maps, batch.targets,
                          n_bins=n_bins, seed=seed, cascade=cascade, resolution=resolution)
