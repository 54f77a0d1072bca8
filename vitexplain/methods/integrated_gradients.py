"""Integrated Gradients (Sundararajan, Taly & Yan, ICML 2017), through Captum."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter, Target
from ..options import PositiveInt
from ..registry import register_method
from ._pixel import CHANNEL_REDUCTIONS, ChannelReduction, chunks

Quadrature = Literal["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"]


def integration_baselines(baseline: float | Tensor, images: Tensor) -> Tensor:
    """The baseline x' as a tensor shaped like ``images``: a constant, or a tensor that broadcasts to them."""
    if isinstance(baseline, bool) or not isinstance(baseline, (int, float, Tensor)):
        raise TypeError(f"baseline must be a number or a tensor, got {type(baseline).__name__}")
    baseline = torch.as_tensor(baseline, dtype=images.dtype, device=images.device)
    try:
        return baseline.expand_as(images)
    except RuntimeError:
        raise ValueError(f"baseline of shape {tuple(baseline.shape)} does not broadcast to the images' "
                         f"shape {tuple(images.shape)}") from None


class _PathScore:
    """The target score of path points, for Captum. Captum's batches hold whole steps of the path, each
    step all the images in order, so a point's image is its row modulo the number of images."""

    def __init__(self, forward, target: Target, images: int):
        self.forward, self.target, self.images = forward, target, images

    def __call__(self, points: Tensor) -> Tensor:
        image = torch.arange(points.shape[0], device=points.device) % self.images
        return self.target.select(image).score(self.forward(points))


@register_method(resolution="pixel", cost=lambda o: 3 * o["n_steps"], reads="output")
def integrated_gradients(adapter: ModelAdapter, images: Tensor, target=None, *, n_steps: PositiveInt = 50,
                         quadrature: Quadrature = "gausslegendre", baseline: float | Tensor = 0.0,
                         channel_reduction: ChannelReduction = "sum", batch_size: PositiveInt = 64) -> Tensor:
    """Integrated Gradients of the target logit, summed over colour channels.

    Sundararajan, Taly & Yan, "Axiomatic Attribution for Deep Networks", ICML 2017:
    IG_i(x) = (x_i - x'_i) ∫_0^1 ∂F(x' + α(x - x'))/∂x_i dα (Eq. 1), approximated by a sum over
    ``n_steps`` points (Sec. 5, Eq. 3 is the right Riemann sum). Computed by Captum's
    ``IntegratedGradients`` as the TIS benchmark did (Englebert et al., ICCVW 2023: 50 steps, Captum
    defaults), so the default quadrature is Captum's Gauss-Legendre, F is the target logit, the
    baseline is 0 (the mean colour in normalised space) and channels are summed with their signs.

    Options:
        n_steps: number of points on the path (50 in the TIS benchmark).
        quadrature: Captum's ``method``: ``gausslegendre`` (Captum's default) or ``riemann_right`` (the paper's Eq. 3),
            ``riemann_left``, ``riemann_middle``, ``riemann_trapezoid``.
        baseline: x', a constant or a tensor that broadcasts to the images (e.g. [3, 1, 1]).
        channel_reduction: ``sum`` (signed, as the TIS authors' wrapper), ``abs_sum`` or ``max_abs``.
        batch_size: path points (images × steps) per forward/backward; bounds memory.
    """
    reduce = CHANNEL_REDUCTIONS[channel_reduction]
    from captum.attr import IntegratedGradients  # a dependency; imported here to keep `import vitexplain` light
    resolved = adapter.target(images, target)
    baselines = integration_baselines(baseline, images)
    with adapter.differentiable_forward() as forward:
        attributions = []
        for part in chunks(images.shape[0], batch_size):
            rows = torch.arange(images.shape[0], device=images.device)[part]
            if resolved.is_class:  # Captum picks the target logit, as the TIS benchmark ran it
                attribute, given = IntegratedGradients(forward).attribute, {"target": resolved.classes[part]}
            else:  # any other score: Captum integrates the score itself, repeated along the path
                scores = _PathScore(forward, resolved.select(rows), len(rows))
                attribute, given = IntegratedGradients(scores).attribute, {}
            attributions.append(attribute(images[part], baselines=baselines[part], n_steps=n_steps, method=quadrature,
                                          internal_batch_size=batch_size, **given))
        attributions = torch.cat(attributions)
    return reduce(attributions)
