"""Input × Gradient (Shrikumar, Greenside, Shcherbina & Kundaje, arXiv 2016), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map


@register_method(resolution="pixel", cost=3, reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `InputXGradient` as LATEC calls it, each channel's positive "
                            "part kept as LATEC's Captum fork keeps it, then summed where LATEC averages (the same "
                            "map times 3).")
def input_x_gradient(adapter: ModelAdapter, images: Tensor, target=None, *,
                     channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64,
                     libragrad: bool = False) -> Tensor:
    """The image times the gradient of the target logit, x ⊙ ∂S_c/∂x, by Captum's ``InputXGradient``.

    Shrikumar, Greenside, Shcherbina & Kundaje, "Not Just a Black Box: Learning Important Features Through
    Propagating Activation Differences", arXiv 1605.01713, 2016 (the gradient times the input, Sec. 2). The
    defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI", NeurIPS 2024 Datasets and
    Benchmarks): Captum's class with its defaults, channels reduced as LATEC does (positive part, summed).

    Options:
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: images per forward/backward; bounds memory.
        libragrad: the gradient through LibraGrad's rebalanced backward (Mehri, Baghshah & Pilehvar, "LibraGrad:
            Balancing Gradient Flow for Universally Better Vision Transformer Attributions", CVPR 2025;
            docs/decisions/libragrad.md).
    """
    return captum_map(adapter, images, target, "InputXGradient", reduction=channel_reduction, batch_size=batch_size,
                      libragrad=libragrad)
