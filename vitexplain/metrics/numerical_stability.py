"""Numerical stability (ours, issue 35 item 4): does a method's map survive perturbations of the size of floating-point
rounding — of the weights and of the input?

A user who runs the model in bfloat16, or retrains it with another seed of the same data-loading order, or feeds
an image decoded by another library, changes the weights or the input by about one bfloat16 rounding: a relative
2^-9 (bfloat16 keeps 8 significant bits). A map that is a function of what the model computes should not move
at that scale; one whose arithmetic amplifies rounding (LRP's divisions by near-zero attention scores, a
discontinuous clustering) is chaotic: its map on one machine says little about its map on another. Four
perturbations, each against the unperturbed map (the batch's)::

    r_bf16_weights   every floating parameter rounded to bfloat16 and back to float32
    r_noise_weights  every floating parameter θ → θ (1 + 2^-9 z), z ~ N(0, 1) drawn from ``seed``
    r_bf16_input     the image rounded to bfloat16 and back
    r_noise_input    the image x → x (1 + 2^-9 z), z drawn from ``seed`` (shared by every image)

each scored by Pearson's r of the perturbed map to the unperturbed map per image (r, not a rank correlation: the
values of a map are what a reader of a heatmap sees, and r is 1 only for the same map up to scale and offset); two
constant maps give 1, a constant against a varying one 0. ``r_worst`` is per image the lowest of the four. The
reported numbers are means over images (the bench adds bootstrap intervals); a method whose ``r_worst`` is below
:data:`CHAOTIC_BELOW` on the model in hand is chaotic there (docs/decisions/metrics-mprt.md). The maps are computed
in float32 (``explain`` scopes its precision); the weights change only within :attr:`EvalBatch.modified` and are
restored exactly. Buffers are left as they are (they hold indices and fixed tables, not learnt weights).

Each perturbation is a copy (``copy=k``, k = 1 … 4 in the order of :data:`KINDS`, of :attr:`EvalBatch.explain`): the
random control is drawn afresh for each, so its r is that of two unrelated maps, about 0, not a perfect 1
(docs/decisions/metric-trust.md); every explanation method ignores it.

Public beside the protocol (:data:`__all__`): :data:`CHAOTIC_BELOW`, which the bench's reports read to name the chaotic
maps, and the weight changes :func:`round_weights` and :func:`noisy_weights`, with which the bench builds a model's
noisy copy (``ModelEntry.noise_of``), so that copy is the model this protocol explains.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..options import Positive
from ..seeding import seeded_draw
from ._common import check_image_batch, check_maps, explain_copy
from ._randomise import check_explained, modifier_of
from .base import EvalBatch, register_metric
from .correlation import pearson

#: a method whose r_worst (mean over images) is below this on the model in hand has chaotic maps there
CHAOTIC_BELOW = 0.9
#: the relative size of one bfloat16 rounding (8 significant bits: half a unit in the last place, 2^-9)
ROUNDING = 2.0 ** -9
KINDS = ("bf16_weights", "noise_weights", "bf16_input", "noise_input")

__all__ = ["CHAOTIC_BELOW", "KINDS", "ROUNDING", "bf16_round", "noisy_weights", "numerical_stability",
           "reduce_numerical_stability", "round_weights"]


def bf16_round(tensor: Tensor) -> Tensor:
    """``tensor`` rounded to bfloat16 (to nearest, ties to even) and back to its own dtype."""
    return tensor.to(torch.bfloat16).to(tensor.dtype)


def round_weights(model: nn.Module) -> None:
    """Every floating parameter rounded to bfloat16 and back, in place (for :attr:`EvalBatch.modified`)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point():
                parameter.copy_(bf16_round(parameter))


def noisy_weights(seed: int, size: float = ROUNDING) -> Callable[[nn.Module], None]:
    """``change(model)``: every floating parameter times (1 + size · z), in place, z standard normal drawn on the CPU
    from ``seed`` (``seeding.seeded_draw``), parameter by parameter in the order of ``parameters()``."""
    def change(model: nn.Module) -> None:
        chosen = [parameter for parameter in model.parameters() if parameter.is_floating_point()]
        noise = seeded_draw(seed, lambda g: tuple(torch.randn(p.shape, generator=g) for p in chosen))
        with torch.no_grad():
            for parameter, z in zip(chosen, noise):
                parameter.mul_(1 + size * z.to(parameter.device, parameter.dtype))

    return change


def numerical_stability(explain: Callable[..., Tensor], modified, images: Tensor, maps: Tensor, targets: Tensor, *,
                        seed: int = 0, size: float = ROUNDING) -> dict[str, Tensor]:
    """Per image, r of the map under each perturbation to ``maps`` (``r_<kind>``, float64 [B]) and ``r_worst``.

    Args:
        explain: (images, targets) -> maps, the method under test (given ``copy=k`` for perturbation k when it
            takes ``copy``: :func:`._common.explain_copy`).
        modified: :attr:`EvalBatch.modified` (the weight perturbations happen within it and are undone).
        images: preprocessed images [B, C, H, W]; maps: the method's maps of them [B, h, w]; targets: classes [B].
        seed: seeds the relative noise (of the weights and of the input).
        size: the relative noise's standard deviation (default 2^-9, one bfloat16 rounding).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    noise = seeded_draw(seed, lambda g: torch.randn(tuple(images.shape[1:]), generator=g), images.device)
    found = {}
    for kind, change in (("bf16_weights", round_weights), ("noise_weights", noisy_weights(seed, size))):
        with modified(change):
            found[kind] = explain_copy(explain, images, targets, 1 + KINDS.index(kind))
    found["bf16_input"] = explain_copy(explain, bf16_round(images), targets, 1 + KINDS.index("bf16_input"))
    found["noise_input"] = explain_copy(explain, images * (1 + size * noise.to(images.dtype)), targets,
                                        1 + KINDS.index("noise_input"))
    values = {f"r_{kind}": pearson(maps, check_explained(found[kind], maps, f"under {kind.replace('_', ' ')}"))
              for kind in KINDS}
    values["r_worst"] = torch.stack(list(values.values()), 1).min(1).values
    return values


def reduce_numerical_stability(values: dict[str, Tensor]) -> dict[str, float]:
    return {key: values[key].double().mean().item() for key in (*(f"r_{kind}" for kind in KINDS), "r_worst")}


@register_metric(
    "numerical_stability",
    reduce=reduce_numerical_stability,
    requires=("explain", "model"),
    higher_is_better={**{f"r_{kind}": True for kind in KINDS}, "r_worst": True},
    cost=lambda options, method: 4 * method,
    group="robustness",
)
def _compute(batch: EvalBatch, *, seed: int = 0,
             size: Positive = ROUNDING) -> dict[str, Tensor]:
    return numerical_stability(batch.explain, modifier_of(batch, "numerical_stability"), batch.images, batch.maps,
                               batch.targets, seed=seed, size=size)
