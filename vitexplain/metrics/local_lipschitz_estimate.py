"""Local Lipschitz estimate (Alvarez-Melis & Jaakkola, "On the Robustness of Interpretability Methods", ICML
Workshop on Human Interpretability in Machine Learning, 2018): how fast a map can change, relative to how far the
image moved.

Their measure (also in their NeurIPS 2018 "Towards Robust Interpretability with Self-Explaining Neural Networks")
is the local Lipschitz constant of the explanation around x,

    L(x) = max_{x' ∈ B_ε(x)} ‖Φ(x) − Φ(x')‖_2 / ‖x − x'‖_2,

which they estimate by optimising over x' (Bayesian optimisation, or gradient-free search for non-differentiable
explainers). We estimate the maximum by sampling, as Quantus's ``LocalLipschitzEstimate`` does: ``n_samples``
Gaussian perturbations x' = x + δ_s, δ_s ~ N(0, σ²) on every element of the preprocessed image (Quantus's
``perturb_std`` = 0.1), the ratio of the L2 change of the map to ‖δ_s‖_2, the maximum over s. A sampled maximum is
a lower bound of the paper's L(x); more samples raise it.

The maps are upsampled to the image (bilinearly, as every pixel-level protocol here) and rescaled per image before
the norm (``normalise``, default ``"maxabs"``: m / max |m|, Quantus's default ``normalise_by_max``), so that the
number compares stability, not the scale of each method's maps (the paper's ratio is not scale-free) or the size of
their grid (a 224 × 224 map has 256 times the cells of a 14 × 14 one; Quantus's maps are all of the image's size).
The noise is drawn once on the CPU from ``seed`` and shared by every image (Quantus draws per image from NumPy's
global state), so an image's value does not depend on its batch or device; each sample is one copy of the batch,
re-explained as max-sensitivity does (:mod:`._robustness`), so the random control draws afresh for it. Arithmetic in
float32, the maximum of float32 ratios.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..maps import resize
from ..options import Positive, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps
from ._relative_stability import gaussian_noise
from ._robustness import Normalise, explained_copies, norm_of_difference, normalise_maps
from .base import EvalBatch, register_metric


def local_lipschitz_estimate(explain: Callable[..., Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                             n_samples: int = 10, sigma: float = 0.1, seed: int = 0,
                             normalise: str = "maxabs") -> Tensor:
    """The sampled local Lipschitz estimate of each image's map [B] (float32).

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test (given ``copy=s`` for sample s when it
            takes ``copy``: :func:`._common.explain_copy`).
        images: preprocessed images [B, C, H, W]; maps: the method's maps of them [B, h, w]; targets: classes [B].
        n_samples: perturbed copies (Quantus: 200).
        sigma: standard deviation of the Gaussian noise, in preprocessed units (Quantus: 0.1).
        seed: seed of the noise.
        normalise: rescaling of every map per image, upsampled to the image, before the norm
            (:func:`._robustness.normalise_maps`).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    noise = gaussian_noise(n_samples, tuple(images.shape[1:]), sigma, seed, images.device).to(images.dtype)
    size = images.shape[-2:]
    reference = normalise_maps(resize(maps, size), normalise)
    distances = torch.linalg.vector_norm(noise.flatten(1), dim=1)               # ‖x − x'‖ of each sample [n]
    ratios = [norm_of_difference(reference, normalise_maps(resize(perturbed, size), normalise)) / distance
              for perturbed, distance in zip(explained_copies(explain, (images + delta for delta in noise), targets,
                                                              maps), distances)]
    return torch.stack(ratios).max(0).values


reduce_local_lipschitz_estimate = Means(local_lipschitz_estimate="local_lipschitz_estimate")


@register_metric(
    "local_lipschitz_estimate",
    reduce=reduce_local_lipschitz_estimate,
    requires=("explain",),
    higher_is_better={"local_lipschitz_estimate": False},
    cost=lambda options, method: options["n_samples"] * method,
    group="robustness",
    reference=("latec", "quantus"),
    departures="Quantus divides the maps by their largest value over the whole batch, so an image's number depends "
               "on its batch, and draws per image from NumPy's global generator; ours rescales each map by its own "
               "max |value| and draws the Gaussian noise (σ 0.1, Quantus's) once from `seed`. 10 samples by default "
               "(Quantus 200, LATEC 5).",
)
def _compute(batch: EvalBatch, *, n_samples: PositiveInt = 10,
             sigma: Positive = 0.1, seed: int = 0,
             normalise: Normalise = "maxabs") -> dict[str, Tensor]:
    return {"local_lipschitz_estimate": local_lipschitz_estimate(batch.explain, batch.images, batch.maps,
                                                                 batch.targets, n_samples=n_samples, sigma=sigma,
                                                                 seed=seed, normalise=normalise)}
