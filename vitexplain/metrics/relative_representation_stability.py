"""Relative representation stability, RRS (Agarwal et al., "Rethinking Stability for Attribution-based Explanations",
ICLR 2022 PAIR^2Struct workshop, arXiv 2203.06877, Eq. 3): the largest relative change of the map over small
perturbations of the image that keep its prediction, per relative change of the model's internal representation.

    RRS(x) = max_{x'} || (e_x - e_x') / e_x ||_2 / max(|| (L_x - L_x') / L_x ||_2, eps_min)

L is the representation the model's classifier reads, the input of the linear layer that computes its outputs
[B, D] (:attr:`EvalBatch.features`, :meth:`~vitexplain.instrumentation.ModelAdapter.features`): the class token after
the final norm for a ViT, the pooled tokens for a pooling head. The paper names "the output embeddings of a hidden
layer" without fixing one (its authors' code, OpenXAI, reads the first hidden layer of a small MLP); Quantus's
``RelativeRepresentationStability`` by default concatenates the output of every module of the model. We take the one
representation every classifier has and that a ViT's blocks all feed (docs/decisions/metrics-relative-stability.md);
a model with none (no linear classifier computes its output) is refused. Lower is more stable.
"""
from __future__ import annotations

from torch import Tensor

from ..options import Positive, PositiveInt
from ._relative_stability import DefinedMean, passes, relative_stability
from .base import EvalBatch, register_metric


@register_metric(
    reduce=DefinedMean("relative_representation_stability"),
    requires=("explain", "features"),
    higher_is_better={"relative_representation_stability": False},
    cost=lambda options, method: passes(options, method, forwards_per_copy=2),
    group="robustness",
    reference=("latec", "quantus"),
    departures="Quantus's representation is every module's output concatenated, ours the input of the classifier's "
               "last linear layer (the pre-logits); its noise and prediction rule differ as for the relative input "
               "stability (LATEC: 10 copies, all counted; ours 50 seeded Gaussian copies). Given our copies and the "
               "pre-logits it agrees to 3e-7 (relative).",
)
def relative_representation_stability(batch: EvalBatch, *, n_samples: PositiveInt = 50, noise: Positive = 0.05,
                                      eps_min: Positive = 1e-6, seed: int = 0,
                                      batch_size: PositiveInt = 64) -> dict[str, Tensor]:
    return {"relative_representation_stability": relative_stability(
        "representation", batch.explain, batch.logits, batch.images, batch.maps, batch.targets,
        features=batch.features, n_samples=n_samples, noise=noise, eps_min=eps_min, seed=seed,
        batch_size=batch_size)}
