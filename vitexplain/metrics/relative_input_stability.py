"""Relative input stability, RIS (Agarwal et al., "Rethinking Stability for Attribution-based Explanations", ICLR
2022 PAIR^2Struct workshop, arXiv 2203.06877, Eq. 2): the largest relative change of the map over small perturbations
of the image that keep its prediction, per relative change of the image.

    RIS(x) = max_{x'} || (e_x - e_x') / e_x ||_2 / max(|| (x - x') / x ||_2, eps_min)

Lower is more stable; a map that never changes scores 0. The image is the preprocessed tensor the model reads (where
the noise is added), as Quantus's ``RelativeInputStability`` takes it; an element near 0 makes the input's relative
change large and RIS small, which is the paper's definition on such inputs. Perturbations, the prediction condition,
eps_min and the defaults: :mod:`._relative_stability`, docs/decisions/metrics-relative-stability.md.
"""
from __future__ import annotations

from torch import Tensor

from ..options import Positive, PositiveInt
from ._relative_stability import NOISE_DEPARTURES, DefinedMean, passes, relative_stability
from .base import EvalBatch, register_metric


@register_metric(
    reduce=DefinedMean("relative_input_stability"),
    requires=("explain",),
    higher_is_better={"relative_input_stability": False},
    cost=passes,
    group="robustness",
    reference=("latec", "quantus"),
    departures=NOISE_DEPARTURES + " Given our copies it agrees to 1e-6 (relative).",
)
def relative_input_stability(batch: EvalBatch, *, n_samples: PositiveInt = 50, noise: Positive = 0.05,
                             eps_min: Positive = 1e-6, seed: int = 0,
                             batch_size: PositiveInt = 64) -> dict[str, Tensor]:
    return {"relative_input_stability": relative_stability(
        "input", batch.explain, batch.logits, batch.images, batch.maps, batch.targets, n_samples=n_samples,
        noise=noise, eps_min=eps_min, seed=seed, batch_size=batch_size)}
