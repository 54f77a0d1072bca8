"""Guided Backpropagation (Springenberg, Dosovitskiy, Brox & Riedmiller, ICLR Workshop 2015), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map


@register_method(resolution="pixel", cost=3, reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `GuidedBackprop` as LATEC calls it, positive part per "
                            "channel as its Captum fork, summed where LATEC averages. On a timm ViT, which has no "
                            "ReLU module, both give the plain input gradient.")
def guided_backprop(adapter: ModelAdapter, images: Tensor, target=None, *,
                    channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64) -> Tensor:
    """The input gradient of the target logit with every ReLU passing back only positive gradient, by Captum's
    ``GuidedBackprop``.

    Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR Workshop 2015, Sec. 3.4 and
    Fig. 1: at a ReLU the backward signal R_i = (f_i > 0) · (R_{i+1} > 0) · R_{i+1}. Captum applies the rule to the
    model's ``nn.ReLU`` modules (hooks on them), and nowhere else: a timm ViT has GELUs and no ReLU module, so there
    the map is the plain signed gradient (docs/decisions/latec-methods.md; a test checks it); a ReLU called as a
    function (``F.relu``) is not guided either. The defaults are LATEC's setting (Klein et al., "Navigating the
    Maze of Explainable AI", NeurIPS 2024 Datasets and Benchmarks): Captum's class, channels reduced as LATEC does.

    Options:
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: images per forward/backward; bounds memory.
    """
    return captum_map(adapter, images, target, "GuidedBackprop", reduction=channel_reduction, batch_size=batch_size)
