"""Saliency, the input gradient of the target (Simonyan, Vedaldi & Zisserman, ICLR Workshop 2014), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map


@register_method(resolution="pixel", cost=3, reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `Saliency` with its defaults (|gradient|), as LATEC calls "
                            "it. LATEC averages the channels, ours sums them: the same map times 3.")
def saliency(adapter: ModelAdapter, images: Tensor, target=None, *, absolute: bool = True,
             channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64,
             libragrad: bool = False) -> Tensor:
    """The gradient of the target logit with respect to the pixels, by Captum's ``Saliency``.

    Simonyan, Vedaldi & Zisserman, "Deep Inside Convolutional Networks: Visualising Image Classification Models and
    Saliency Maps", ICLR Workshop 2014, Sec. 3.1: w = ∂S_c/∂I at the image (Eq. 2), |w| per pixel, the maximum over
    colour channels (Sec. 3.1). The defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI:
    A Systematic Approach to Evaluating Methods and Metrics", NeurIPS 2024 Datasets and Benchmarks, code
    IML-DKFZ/latec): Captum's ``Saliency`` with its defaults (|∂S_c/∂x|), channels reduced as LATEC reduces them
    (positive part, summed; docs/decisions/latec-methods.md).

    Options:
        absolute: |∂S_c/∂x| (Captum's default, LATEC's setting) or the signed gradient.
        channel_reduction: ``positive_sum`` (LATEC's setting; with ``absolute`` it is ``abs_sum``), ``sum``,
            ``abs_sum`` or ``max_abs`` (the paper's).
        batch_size: images per forward/backward; bounds memory.
        libragrad: the gradient through LibraGrad's rebalanced backward (Mehri, Baghshah & Pilehvar, "LibraGrad:
            Balancing Gradient Flow for Universally Better Vision Transformer Attributions", CVPR 2025;
            docs/decisions/libragrad.md).
    """
    return captum_map(adapter, images, target, "Saliency", reduction=channel_reduction, batch_size=batch_size,
                      attribute={"abs": absolute}, libragrad=libragrad)
