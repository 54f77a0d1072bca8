"""Avg-sensitivity (Yeh, Hsieh, Suggala, Inouye & Ravikumar, "On the (In)fidelity and Sensitivity of Explanations",
NeurIPS 2019): the mean change of a map under small input noise.

Yeh et al. define (Sec. 3) max-sensitivity and its average-case counterpart,

    SENS_AVG(Φ, f, x, r) = ∫_{‖δ‖ ≤ r} ‖Φ(f, x + δ) − Φ(f, x)‖ dP(δ),

the expected change of the explanation over perturbations of radius r, where max-sensitivity takes the maximum.
Here the integral is a Monte-Carlo mean over ``n_samples`` draws, and the change is the ratio max-sensitivity
computes (``sensitivity.py``: Captum's ``sensitivity_max`` arithmetic, also Quantus's ``AvgSensitivity``):

    avg_sensitivity(x) = 1/n Σ_s ‖e(x) − e(x + d_s)‖_2 / ‖e(x)‖_2,   d_s ~ U[−r, r]^(C×H×W),

noise uniform in the L-infinity ball of radius r around the preprocessed image, the norm of the unperturbed map
in the denominator (0 -> 1). The ratio is Yeh et al.'s change of a map normalised to unit norm at x; without it
the number would rank methods by the scale of their maps. The samples, the normalisation options and the copy-wise
re-explaining (so that the random control draws afresh for every copy) are max-sensitivity's, one implementation
(:func:`.sensitivity.sensitivity_changes`): with the same options, ``avg_sensitivity ≤ max_sensitivity`` on
every image. The mean over the samples is taken in float64.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..options import Positive, PositiveInt
from ..uncertainty import Means
from .base import EvalBatch, register_metric
from .sensitivity import Normalise, sensitivity_changes


def avg_sensitivity(explain: Callable[..., Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                    n_samples: int = 10, radius: float = 0.02, seed: int = 0, normalise: str = "none",
                    reseed: bool = False) -> Tensor:
    """Avg-sensitivity of each image's explanation [B] (float64): the mean over the perturbed copies of what
    :func:`.sensitivity.max_sensitivity` maximises; the arguments are its."""
    return sensitivity_changes(explain, images, maps, targets, n_samples=n_samples, radius=radius, seed=seed,
                               normalise=normalise, reseed=reseed).to(torch.float64).mean(0)


reduce_avg_sensitivity = Means(avg_sensitivity="avg_sensitivity")


@register_metric(
    "avg_sensitivity",
    reduce=reduce_avg_sensitivity,
    requires=("explain",),
    higher_is_better={"avg_sensitivity": False},
    cost=lambda options, method: options["n_samples"] * method,
    group="robustness",
    reference="quantus",
    departures="The mean of max-sensitivity's samples (the same noise and ratio, so avg ≤ max per image); Quantus's "
               "`AvgSensitivity` defaults to radius 0.2 and 200 samples drawn per image from NumPy's global "
               "generator. Given our noise, unnormalised, it agrees to 5e-7 (relative).",
)
def _compute(batch: EvalBatch, *, n_samples: PositiveInt = 10,
             radius: Positive = 0.02, seed: int = 0,
             normalise: Normalise = "none", reseed: bool = False) -> dict[str, Tensor]:
    return {"avg_sensitivity": avg_sensitivity(batch.explain, batch.images, batch.maps, batch.targets,
                                               n_samples=n_samples, radius=radius, seed=seed, normalise=normalise,
                                               reseed=reseed)}
