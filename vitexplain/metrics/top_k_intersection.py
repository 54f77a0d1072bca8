"""Top-k intersection (Theiner, Müller-Budack & Ewerth, "Interpretable Semantic Photo Geolocation", WACV 2022,
arXiv:2104.14995, 2021; Quantus's ``TopKIntersection``): the share of the map's k most relevant pixels that lie on
the object.

    TKI = |P_top-k ∩ GT| / k,   with ``concept_influence``:  TKI · n / |GT|,

P_top-k the k pixels of highest relevance of the map upsampled bilinearly to the image, GT the foreground mask, n
the image's pixels. Why: the map binarised at a fixed budget of pixels (Theiner et al.'s "explainer mask"), so
methods are compared on the same number of pixels whatever the object's size; ``concept_influence`` divides by
the mask's share of the image, so that a large object is not an easy target (1 = as a random map).

* k = 1000 pixels by default (Quantus's); it is pixels of the image the maps are scored at, about 2 % of a
  224 × 224 image, 8 % of 112 × 112. A k above the image's pixels is refused (Quantus refuses it too).
* Pixels ranked by their raw values (Quantus's ``abs=False``), ties in raster order (``_common.removal_rank``;
  Quantus's ``np.argsort`` leaves them unspecified).
* Pixels in ``ignore`` are neither ranked nor counted (n counts the rest); on an image with fewer than k counted
  pixels all of them are taken and divided by their number (**ours**). An image whose mask has no counted pixel is
  NaN, left out of the mean and counted (``undefined``; Quantus: NaN).

In [0, 1] (without ``concept_influence``), higher is better; a map equal to a mask of at least k pixels scores 1,
its complement 0. Per image ``top_k_intersection``; reported its mean over the defined images. Decisions:
docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..options import PixelArea
from ._localisation import MaskMeans, batch_truth, prepare, top_ranked, undefined_where_empty
from .base import EvalBatch, register_metric


def top_k_intersection(maps: Tensor, masks: Tensor, *, k: int = 1000, concept_influence: bool = False,
                       ignore: Tensor | None = None) -> Tensor:
    """Top-k intersection of each map [B] (float64): maps [B, h, w] upsampled to the masks [B, H, W] (bool);
    ``ignore`` [B, H, W]: pixels left out (module docstring)."""
    pixels = masks.shape[-2] * masks.shape[-1]
    if k > pixels:
        raise ValueError(f"top_k_intersection: k={k} is more than the {pixels} pixels of a "
                         f"{masks.shape[-2]} x {masks.shape[-1]} image; give k <= {pixels}")
    relevance, truth, valid = prepare(maps, masks, ignore)
    taken = valid.sum(1).clamp(max=k)
    hits = (top_ranked(relevance, valid, taken) & truth).sum(1).to(torch.float64)
    share = hits / taken.clamp(min=1)
    if concept_influence:
        share = share * valid.sum(1) / truth.sum(1).clamp(min=1)
    return undefined_where_empty(share, truth)


reduce_top_k_intersection = MaskMeans(top_k_intersection="top_k_intersection")


@register_metric(
    "top_k_intersection",
    reduce=reduce_top_k_intersection,
    requires=("masks",),
    higher_is_better={"top_k_intersection": True},
    group="localisation",
    reference="quantus",
    departures="None in substance: as Quantus computes it (k = 1,000 pixels), ties broken in raster order (Quantus "
               "leaves them unspecified); k = H·W is allowed (Quantus refuses it).",
)
def _compute(batch: EvalBatch, *, k: PixelArea = 1000, concept_influence: bool = False) -> dict[str, Tensor]:
    maps, masks, ignore = batch_truth(batch)
    return {"top_k_intersection": top_k_intersection(maps, masks, k=k, concept_influence=concept_influence,
                                                     ignore=ignore)}
