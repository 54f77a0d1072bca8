"""Sparseness: the Gini index of the map (Chalasani et al., ICML 2020), as run by TIS (Englebert et al.,
ICCVW 2023, supplementary material).

TIS Sec. 4.2: "For Sparseness, in the case of negative values, we shifted the minimum value to zero
before applying the metric", pointing to oliviaguest/gini. With x the map's n values in ascending
order (index i = 1 ... n), after a shift and + 1e-7 (no zeros):

    G = sum_i (2 i - n - 1) x_i / (n * sum_i x_i)          in [0, 1), higher = sparser.

Choices of the reference code (``metrics/sparseness.py`` and ``evaluate.py`` of
aenglebert/Transformer_Input_Sampling):

* the map is the one upsampled bilinearly to the image (``evaluate.py`` resizes every map to the
  image before any metric);
* ``shift="always"`` (default): the minimum is subtracted whatever its sign, which is what the TIS
  code runs (``shift: true``); ``shift="negative"`` subtracts it only when negative, as
  oliviaguest/gini and the paper's sentence say.

Computed in float64. Higher is reported as better (more concise maps); TIS uses it as an indicator
rather than a ranking.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..maps import resize
from ..uncertainty import Means
from ._common import check_maps
from .base import EvalBatch, register_metric

Shift = Literal["always", "negative"]


def gini_sparseness(maps: Tensor, image_size: tuple[int, int] | None = None, *, shift: str = "always") -> Tensor:
    """Gini index of each map [B], after bilinear upsampling to ``image_size`` when given."""
    maps = check_maps(maps)
    if image_size is not None:
        maps = resize(maps, image_size)
    values = maps.flatten(1).to(torch.float64)
    lowest = values.min(1, keepdim=True).values
    values = values - (lowest if shift == "always" else lowest.clamp(max=0))
    values = (values + 1e-7).sort(1).values
    n = values.shape[1]
    index = torch.arange(1, n + 1, device=values.device, dtype=torch.float64)
    return ((2 * index - n - 1) * values).sum(1) / (n * values.sum(1))


reduce_sparseness = Means(sparseness="sparseness")


@register_metric(
    "sparseness",
    reduce=reduce_sparseness,
    higher_is_better={"sparseness": True},
    group="complexity",
    reference=("latec", "quantus"),
    departures="Quantus (and so LATEC) takes |map| before the Gini index; ours follows TIS's code, the map upsampled "
               "and its minimum subtracted (`shift=\"always\"`), so a map positive everywhere scores sparser than "
               "there; `shift=\"negative\"` leaves such a map as it is.",
)
def _compute(batch: EvalBatch, *, shift: Shift = "always") -> dict[str, Tensor]:
    return {"sparseness": gini_sparseness(batch.maps, tuple(batch.images.shape[-2:]), shift=shift)}
