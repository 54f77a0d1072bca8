"""Smooth MPRT (Hedström et al., XAI in Action workshop, NeurIPS 2023): the model-parameter randomisation test on
explanations denoised by averaging over noisy copies of the input.

Hedström, Weber, Bareeva, Motzkus, Samek, Lapuschkin, Höhne, "Sanity Checks Revisited: An Exploration to Repair
the Model Parameter Randomisation Test", XAI in Action: Past, Present, and Future Applications (NeurIPS 2023
workshop); Quantus's ``SmoothMPRT``. MPRT (Adebayo et al., NeurIPS 2018) compares the explanation of the trained
model f with that of a model whose parameters are randomised, layer by layer (the cascade, top first); a method
whose map does not change does not explain the model. sMPRT first denoises every explanation (the paper's Eq. for
sMPRT, as SmoothGrad)::

    ê(x; f) = 1/N Σ_{i=1..N} e(x + δ_i; f),   δ_i ~ N(0, σ² I),  σ = noise · (max x − min x),

and scores, per level l of the cascade (f_l: the levels 0 … l random), the similarity
ρ_l = Spearman(|ê(x; f)|, |ê(x; f_l)|). Lower is better: a map that follows the model loses its ranking once the
model is random. Reported: ``similarity`` (mean over images of ρ at the fully random model, the paper's score)
and ``similarity_average`` (mean over images and levels, Quantus's ``return_average_correlation`` without the
unrandomised model's self-similarity that Quantus averages in); per image ``similarity_levels`` [B, levels],
drawn as curves.

As Quantus (docs/decisions/metrics-mprt.md): of the N samples, N − 1 are noisy and one is the clean input (so
N = 1 is plain MPRT, and its clean sample is the batch's map); σ is per image; |·| before the rank correlation
(``absolute``); the explained class stays the trained model's. Ours: the noise δ_i is drawn once from ``seed``
(``seeding.seeded_draw``) and shared by the trained and the randomised models and by every image (an image's
value does not depend on its batch); the layers are randomised top-down, as Adebayo et al. and the bench's
sanity check, with timm's initialisation (``metrics._randomise``), each level drawn from ``seed`` (Quantus
re-seeds every module, so same-shaped layers get identical weights, and defaults to bottom-up; at the fully
random level the order does not matter). The model is changed only within :attr:`EvalBatch.modified` and
restored exactly.
"""
from __future__ import annotations

from typing import Callable, ContextManager

import torch
from torch import Tensor, nn

from ..instrumentation.randomisation import Randomisation
from ..options import NonNegative, PositiveInt
from ..seeding import seeded_draw
from ._common import check_image_batch, check_maps
from ._randomise import check_explained, modifier_of
from .base import Curves, EvalBatch, register_metric
from .correlation import spearman

#: the levels a ViT-B/16 has (head, 12 blocks, embedding): the cost's nominal count, the model being unknown there
NOMINAL_LEVELS = 14

Modified = Callable[[Callable[[nn.Module], None]], ContextManager[None]]


def input_noise(n_samples: int, images: Tensor, noise: float, seed: int) -> Tensor:
    """The N − 1 noisy offsets [N − 1, B, C, H, W]: standard normal draws from ``seed`` (one per sample, shared by
    every image), times each image's σ = noise · (max − min)."""
    shape = tuple(images.shape[1:])
    draws = seeded_draw(seed, lambda g: torch.randn((n_samples - 1, *shape), generator=g), images.device)
    flat = images.flatten(1)
    sigma = (noise * (flat.max(1).values - flat.min(1).values)).view(1, -1, *[1] * (images.dim() - 1))
    return draws.to(images.dtype).unsqueeze(1) * sigma


def smoothed(explain: Callable[..., Tensor], images: Tensor, targets: Tensor, offsets: Tensor, like: Tensor,
             clean: bool, what: str) -> Tensor:
    """ê: the mean of the maps of ``images + offsets[i]`` and of the clean images (``like``, the batch's maps, when
    ``clean``; else explained now) [B, h, w]."""
    total = like.double() if clean else 0
    for inputs in ([] if clean else [images]) + [images + offset for offset in offsets]:
        total = total + check_explained(explain(inputs, targets), like, what).double()
    return (total / (len(offsets) + 1)).float()


def smooth_mprt(explain: Callable[..., Tensor], modified: Modified, images: Tensor, maps: Tensor, targets: Tensor, *,
                n_samples: int = 50, noise: float = 0.1, seed: int = 0, absolute: bool = True,
                cascade: bool = True) -> dict[str, Tensor]:
    """sMPRT of each image's explanation: ``similarity_levels`` [B, levels] (``cascade``) or [B, 1] (the fully
    random model only), float64.

    Args:
        explain: (images, targets) -> maps, the method under test (run on the changed model within ``modified``).
        modified: :attr:`EvalBatch.modified`.
        images: preprocessed images [B, C, H, W].
        maps: the method's maps of ``images`` on the trained model [B, h, w] (the clean sample).
        targets: explained class per image [B], kept at every level.
        n_samples: N, samples averaged per explanation (one of them clean; paper / Quantus: 50).
        noise: σ as a share of each image's value range (paper / Quantus: 0.1).
        seed: seeds the input noise and the re-initialisation.
        absolute: rank |ê| (Quantus: ``abs=True``).
        cascade: every level of the cascade (curves); False: the fully random model only (Quantus's ``skip_layers``).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    offsets = input_noise(n_samples, images, noise, seed)
    trained = smoothed(explain, images, targets, offsets, maps, True, "of the noisy images")

    def similarity(change: Randomisation) -> Tensor:
        with modified(change):
            random = smoothed(explain, images, targets, offsets, maps, False, "of the randomised model")
        return spearman(trained, random, absolute=absolute)

    first = Randomisation(0 if cascade else None, seed)         # it finds the model's levels
    columns = [similarity(first)]
    if cascade:
        columns += [similarity(Randomisation(level, seed)) for level in range(1, len(first.levels))]
    return {"similarity_levels": torch.stack(columns, 1)}


def reduce_smooth_mprt(values: dict[str, Tensor]) -> dict[str, float]:
    levels = values["similarity_levels"].double()
    return {"similarity": levels[:, -1].mean().item(), "similarity_average": levels.mean().item()}


@register_metric(
    "smooth_mprt",
    reduce=reduce_smooth_mprt,
    requires=("explain", "model"),
    higher_is_better={"similarity": False, "similarity_average": False},
    # the trained model's N - 1 noisy samples, then N per level (a ViT-B's 14 levels; 1 without the cascade)
    cost=lambda options, method: (options["n_samples"] - 1 + options["n_samples"]
                                  * (NOMINAL_LEVELS if options["cascade"] else 1)) * method,
    group="randomisation",
    curves=Curves(lambda options, points: [float(k) for k in range(1, points + 1)],
                  "levels of the model randomised, top first (head, blocks from the last, embedding)",
                  {"similarity_levels": "Spearman correlation of the smoothed maps of the trained and the "
                                        "randomised model"}),
    reference="quantus",
    departures="Quantus's averaged similarity counts the trained model's similarity to itself, its random model "
               "repeats one block, and as shipped it explains with Captum's gradient whatever `explain_func` says; "
               "ours averages the randomised levels only, re-draws every parameter, explains with the method and "
               "shares one seeded noise draw between the models. Otherwise it agrees to 1e-16.",
)
def _compute(batch: EvalBatch, *, n_samples: PositiveInt = 50, noise: NonNegative = 0.1, seed: int = 0,
             absolute: bool = True, cascade: bool = True) -> dict[str, Tensor]:
    found = smooth_mprt(batch.explain, modifier_of(batch, "smooth_mprt"), batch.images, batch.maps, batch.targets,
                        n_samples=n_samples, noise=noise, seed=seed, absolute=absolute, cascade=cascade)
    return {"similarity": found["similarity_levels"][:, -1].clone(), **found}   # its own storage: stored apart
