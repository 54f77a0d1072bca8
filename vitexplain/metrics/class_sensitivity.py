"""Class sensitivity: GradToken's multi-class visualisation (Cheng et al., Neural Networks 2024, Sec. 4.3.2,
Fig. 8) made a number.

GradToken shows, on images holding objects of two classes, that a reliable explanation "should
differ for classes that have different semantics" and highlight each class's own object. Its paper
gives no number, so vitexplain defines one on images with two labelled objects A and B (masks M_A,
M_B at image resolution):

* E_A, E_B = the method's maps for class A and class B, each upsampled bilinearly to the image and
  min-max normalised per image (as in the segmentation test), so the score does not change when a
  map is shifted or scaled by a positive factor;
* own share of A:  s_A = sum(E_A * M_A) / (sum(E_A * M_A) + sum(E_A * M_B)), likewise s_B with
  E_B; 0.5 when the map has no mass on either object (a constant map included);
* class sensitivity = (s_A + s_B) / 2, in [0, 1]; 1 = each map lies only on its own object.

A class-agnostic method (the same map for both classes) scores exactly 0.5 whatever the objects
(s_A + s_B = 1), so values above 0.5 measure how much the maps follow the class.

Per image: ``first_share`` (s_A), ``second_share`` (s_B) and ``class_sensitivity``; reported: their
means over images (higher is better).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import min_max, resize
from ..uncertainty import Means
from ._common import check_maps
from .base import EvalBatch, register_metric


def _own_share(relevance: Tensor, own: Tensor, other: Tensor) -> Tensor:
    on_own = (relevance * own).sum(1)
    on_other = (relevance * other).sum(1)
    total = on_own + on_other
    return torch.where(total > 0, on_own / torch.where(total > 0, total, 1.0), 0.5)


def class_sensitivity(first_maps: Tensor, second_maps: Tensor, first_masks: Tensor,
                      second_masks: Tensor) -> dict[str, Tensor]:
    """Per-image own shares of the two classes' maps (see the module docstring).

    Args:
        first_maps, second_maps: maps [B, h, w] explaining class A and class B of each image.
        first_masks, second_masks: the objects' masks [B, H, W] (bool).
    """
    for name, masks in (("first_masks", first_masks), ("second_masks", second_masks)):
        if masks.dim() != 3 or masks.shape != first_masks.shape:
            raise ValueError(f"{name} must have shape [B, H, W] like first_masks, got {tuple(masks.shape)}")
    size = tuple(first_masks.shape[-2:])
    batch = first_masks.shape[0]

    def normalised(maps: Tensor, what: str) -> Tensor:
        maps = check_maps(maps.to(first_masks.device), batch, what=what)
        return min_max(resize(maps, size), constant=0.0).flatten(1)

    own_a, own_b = first_masks.flatten(1).float(), second_masks.flatten(1).float()
    first = _own_share(normalised(first_maps, "explanation map of the first object"), own_a, own_b)
    second = _own_share(normalised(second_maps, "explanation map of the second object"), own_b, own_a)
    return {"first_share": first, "second_share": second, "class_sensitivity": (first + second) / 2}


reduce_class_sensitivity = Means(class_sensitivity="class_sensitivity", first_share="first_share",
                                 second_share="second_share")


@register_metric(
    "class_sensitivity",
    reduce=reduce_class_sensitivity,
    requires=("masks", "second", "explain"),
    higher_is_better={"class_sensitivity": True, "first_share": True, "second_share": True},
    cost=lambda options, method: method,
    group="class sensitivity",
)
def _compute(batch: EvalBatch) -> dict[str, Tensor]:
    second = batch.truth["second"]
    second_maps = batch.explain(batch.images, second["targets"])
    return class_sensitivity(batch.maps, second_maps, batch.truth["masks"], second["masks"])
