"""Integrated Gradients (Sundararajan, Taly & Yan, ICML 2017), through Captum."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._captum import captum_attributions
from ._pixel import CHANNEL_REDUCTIONS, ChannelReduction

Quadrature = Literal["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"]


def integration_baselines(baseline: float | Tensor, images: Tensor) -> Tensor:
    """The baseline x' as a tensor shaped like ``images``: a constant, or a tensor that broadcasts to them."""
    baseline = torch.as_tensor(baseline, dtype=images.dtype, device=images.device)
    try:
        return baseline.expand_as(images)
    except RuntimeError:
        raise ValueError(f"baseline of shape {tuple(baseline.shape)} does not broadcast to the images' "
                         f"shape {tuple(images.shape)}") from None


@register_method(resolution="pixel", cost=lambda o: 3 * o["n_steps"], reads="output",
                 reference="latec",
                 departures="Ours defaults to the TIS benchmark's setting, 50 steps and the channels summed with "
                            "their signs; LATEC runs 30 steps (`n_steps=30`) and keeps each channel's positive part "
                            "(its Captum fork) before averaging them, which ours does not offer. Both use Captum's "
                            "Gauss-Legendre points and a zero baseline.")
def integrated_gradients(adapter: ModelAdapter, images: Tensor, target=None, *, n_steps: PositiveInt = 50,
                         quadrature: Quadrature = "gausslegendre", baseline: float | Tensor = 0.0,
                         channel_reduction: ChannelReduction = "sum", batch_size: PositiveInt = 64,
                         libragrad: bool = False) -> Tensor:
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
        libragrad: the path's gradients through LibraGrad's rebalanced backward (Mehri, Baghshah & Pilehvar,
            "LibraGrad: Balancing Gradient Flow for Universally Better Vision Transformer Attributions", CVPR 2025;
            docs/decisions/libragrad.md).

    Run through the Captum bridge (``_captum.py``): a target that is not a class (an embedding direction, a score
    function) is scored by the bridge's forward for each path point's own image.
    """
    resolved = adapter.target(images, target)
    baselines = integration_baselines(baseline, images)
    attributions = captum_attributions(
        adapter, images, resolved, "IntegratedGradients", batch_size=batch_size,
        attribute=lambda part: {"baselines": baselines[part], "n_steps": n_steps, "method": quadrature,
                                "internal_batch_size": batch_size}, libragrad=libragrad)
    return CHANNEL_REDUCTIONS[channel_reduction](attributions)
