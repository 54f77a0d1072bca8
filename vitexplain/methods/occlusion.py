"""Occlusion (Zeiler & Fergus, ECCV 2014), through Captum."""
from __future__ import annotations

import math

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PixelLength, PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map


def _windows(options: dict) -> float:
    """Forwards per image at 224 × 224 px: Captum's window positions per side, squared, and the image itself."""
    window = min(options["window"], 224)
    return (math.ceil((224 - window) / options["stride"]) + 1) ** 2 + 1


@register_method(resolution="pixel", cost=_windows, reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `Occlusion` with LATEC's 50 px window over all channels, "
                            "stride 25 and baseline 0, positive part per channel, summed where LATEC averages. A "
                            "window larger than the image is cut to it, where Captum (and so LATEC) refuses it.")
def occlusion(adapter: ModelAdapter, images: Tensor, target=None, *, window: PixelLength = 50,
              stride: PixelLength = 25, baseline: float = 0.0, channel_reduction: Reduction = "positive_sum",
              batch_size: PositiveInt = 64) -> Tensor:
    """The drop of the target logit when a square window of the image is replaced by a baseline, by Captum's
    ``Occlusion``, averaged over the windows that cover each pixel.

    Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014, Sec. 4.2: a grey square
    slid over the image, the classifier's output recorded at each position. Captum's ``Occlusion`` gives each
    pixel the mean of S_c(x) - S_c(x with the window at baseline) over the windows that cover it, the windows
    covering every channel at once, one more window aligned with the far edge where the stride does not reach it.
    The defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI", NeurIPS 2024 Datasets
    and Benchmarks, code IML-DKFZ/latec, for 224 px images): 50 px windows, stride 25, baseline 0, channels
    reduced as LATEC does (positive part, summed). A window larger than the image is cut to the image's side
    (Captum refuses it); one window then covers the whole image and the map is flat.

    Options:
        window: the side of the square window, in pixels (50 in LATEC's setting).
        stride: the step between windows, in pixels (25 in LATEC's setting).
        baseline: the value the window is set to (0, the mean colour in normalised space, in LATEC's setting).
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: occluded images per forward; bounds memory.
    """
    channels, height, width = images.shape[1:]
    shape = (channels, min(window, height), min(window, width))
    return captum_map(adapter, images, target, "Occlusion", reduction=channel_reduction, batch_size=batch_size,
                      attribute={"sliding_window_shapes": shape, "strides": (channels, stride, stride),
                                 "baselines": baseline, "perturbations_per_eval": 1})
