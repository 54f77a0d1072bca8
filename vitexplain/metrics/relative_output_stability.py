"""Relative output stability, ROS (Agarwal et al., "Rethinking Stability for Attribution-based Explanations", ICLR
2022 PAIR^2Struct workshop, arXiv 2203.06877, Eq. 5): the largest relative change of the map over small perturbations
of the image that keep its prediction, per change of the model's output logits.

    ROS(x) = max_{x'} || (e_x - e_x') / e_x ||_2 / max(|| h(x) - h(x') ||_2, eps_min)

h is the model's output (:attr:`EvalBatch.logits`), its change not divided by h(x), as the paper and Quantus's
``RelativeOutputStability`` write it. Lower is more stable; a map that never changes scores 0. A method whose map
changes no more than the logits do scores low even where the image changed much: ROS asks whether the map follows the
model, RIS whether it follows the image. Perturbations, the prediction condition, eps_min and the defaults:
:mod:`._relative_stability`, docs/decisions/metrics-relative-stability.md.
"""
from __future__ import annotations

from torch import Tensor

from ..options import Positive, PositiveInt
from ._relative_stability import NOISE_DEPARTURES, DefinedMean, passes, relative_stability
from .base import EvalBatch, register_metric


@register_metric(
    reduce=DefinedMean("relative_output_stability"),
    requires=("explain",),
    higher_is_better={"relative_output_stability": False},
    cost=passes,
    group="robustness",
    reference=("latec", "quantus"),
    departures=NOISE_DEPARTURES + " Given our copies it agrees to 2e-7 (relative).",
)
def relative_output_stability(batch: EvalBatch, *, n_samples: PositiveInt = 50, noise: Positive = 0.05,
                              eps_min: Positive = 1e-6, seed: int = 0,
                              batch_size: PositiveInt = 64) -> dict[str, Tensor]:
    return {"relative_output_stability": relative_stability(
        "output", batch.explain, batch.logits, batch.images, batch.maps, batch.targets, n_samples=n_samples,
        noise=noise, eps_min=eps_min, seed=seed, batch_size=batch_size)}
