"""What the mask-based localisation protocols of Quantus's catalogue share: the map upsampled to the masks, the pixels
that count, the top-ranked pixels, and a mean that leaves out the images a mask cannot score.

Shared by ``relevance_mass_accuracy``, ``relevance_rank_accuracy``, ``top_k_intersection``,
``attribution_localisation`` and ``localisation_auc`` (docs/decisions/metrics-latec-localisation.md):

* the map is upsampled bilinearly (``align_corners=False``) to the masks' size, as every protocol here reads a
  token map (:func:`vitexplain.maps.resize`), and scored in float64 on the maps' device;
* pixels in ``ignore`` (``EvalBatch.truth["ignore"]``, e.g. VOC's void borders) are out of every count: not
  relevance, not mask, not ranked;
* an image whose mask has no counted pixel has no localisation to score: its value is NaN, and :class:`MaskMeans`
  leaves it out of the mean and counts it (``undefined``), as Quantus returns NaN for an empty mask.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..maps import resize
from ..uncertainty import Means
from ._common import check_maps, removal_rank
from .pointing_game import mask_regions

#: what the mass ratios do with negative relevance: ``"clip"`` keeps the positive part (the papers' positive
#: relevance), ``"absolute"`` takes magnitudes (Quantus's ``abs=True``)
NEGATIVES = {"clip": lambda relevance: relevance.clamp(min=0), "absolute": torch.abs}


def prepare(maps: Tensor, masks: Tensor, ignore: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The maps upsampled to the masks' size, flat in float64 [B, H*W], the masks and the counted pixels as flat
    bools [B, H*W], all on the maps' device."""
    masks = torch.as_tensor(masks)
    if masks.dim() != 3:
        raise ValueError(f"masks must have shape [B, H, W], got {tuple(masks.shape)}")
    maps = check_maps(maps, masks.shape[0])
    truth = mask_regions(masks, tuple(masks.shape[-2:]), maps.device).flatten(1)
    if ignore is None:
        valid = torch.ones_like(truth)
    else:
        ignore = torch.as_tensor(ignore)
        if ignore.shape != masks.shape:
            raise ValueError(f"ignore must have the masks' shape {tuple(masks.shape)}, got {tuple(ignore.shape)}")
        valid = ~ignore.to(maps.device).bool().flatten(1)
    relevance = resize(maps, masks.shape[-2:]).flatten(1).to(torch.float64)
    return relevance, truth & valid, valid


def batch_truth(batch) -> tuple[Tensor, Tensor, Tensor | None]:
    """A batch's maps, its masks (checked against the images' size, on the maps' device) and its ``ignore``."""
    masks = mask_regions(batch.truth["masks"], tuple(batch.images.shape[-2:]), batch.maps.device)
    return batch.maps, masks, batch.truth.get("ignore")


def top_ranked(relevance: Tensor, valid: Tensor, counts: Tensor) -> Tensor:
    """[B, n] bool: each image's ``counts[b]`` counted pixels of highest relevance, ties in raster order
    (:func:`._common.removal_rank`); pixels not counted rank after every counted one."""
    ranked = torch.where(valid, relevance, float("-inf"))
    return removal_rank(ranked) < counts[:, None]


def uniform_share(truth: Tensor, valid: Tensor) -> Tensor:
    """[B] float64: the share of the counted pixels on the mask, what a constant map puts there."""
    return truth.sum(1).to(torch.float64) / valid.sum(1).clamp(min=1).to(torch.float64)


def undefined_where_empty(values: Tensor, truth: Tensor) -> Tensor:
    """``values`` with NaN where the mask has no counted pixel."""
    return torch.where(truth.any(1), values, float("nan"))


class MaskMeans(Means):
    """:class:`~vitexplain.uncertainty.Means` over the images whose value is defined (not NaN: a mask with no counted
    pixel), plus ``undefined``: how many were left out. Without NaN it is the plain mean, bit for bit, and the
    bootstrap resamples it as one; with NaN, per resample (``per_image`` None)."""

    def __call__(self, values: dict[str, Tensor]) -> dict[str, float]:
        reported, undefined = {}, 0
        for number, key in self.numbers.items():
            value = values[key].to(torch.float64)
            defined = ~value.isnan()
            reported[number] = value[defined].mean().item() if defined.any() else float("nan")
            undefined = max(undefined, int((~defined).sum()))
        return {**reported, "undefined": undefined}

    def per_image(self, values: dict[str, Tensor]) -> dict[str, Tensor] | None:
        found = super().per_image(values)
        if found is None or any(value.isnan().any() for value in found.values()):
            return None
        return {**found, "undefined": torch.zeros_like(next(iter(found.values())))}     # none is left out
