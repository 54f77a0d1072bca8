"""Control: the all-ones map (the reference row of a map that ranks nothing)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..registry import register_method


@register_method(class_specific=False, control=True, cost=0, reads="output")
def constant_baseline(adapter: ModelAdapter, images: Tensor, target=None) -> Tensor:
    """Control, not an explanation: 1 on every patch, whatever the image, model or target.

    Every protocol scores a constant map by its documented tie rule (docs/decisions/metrics.md: e.g.
    all background in the segmentation test, raster-order removal in the perturbation tests), so
    this row shows what "no information" scores. It is flagged by the model-randomisation check.
    """
    height, width = adapter.grid_size(images)
    return images.new_ones(images.shape[0], height, width)
