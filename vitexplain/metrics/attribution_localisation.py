"""Attribution localisation (Kohlbrenner, Bauer, Nakajima, Binder, Samek & Lapuschkin, "Towards Best Practice in
Explaining Neural Network Decisions with LRP", IJCNN 2020; Quantus's ``AttributionLocalisation``): the
inside-total ratio of positive relevance, optionally weighted by how small the object is.

    μ = R_in / R_tot,        μ_w = μ · S_tot / S_in   (``weighted=True``),

R_in and R_tot the positive relevance on the object and on the whole image (map upsampled bilinearly to the
image), S_in and S_tot the object's and the image's pixels. Why the weight: μ of a map that ignores the object is
about the object's share of the image, so large objects score high for free; μ_w is 1 for such a map, whatever the
object's size, and 1 / share for a perfect one.

* ``negatives="clip"`` (default): positive relevance, as the paper; ``"absolute"``: |map|, Quantus's default
  (``abs=True``, ``positive_attributions=False``). Unweighted, this is :mod:`relevance_mass_accuracy`'s ratio
  (both papers define the same one); kept as its own protocol for the weighted variant and Quantus's name.
* Quantus's weighted variant multiplies by S_in / S_tot (the paper divides), with S_tot read as
  ``x_batch[2:].size`` (the pixels of the batch's images from the third on, so its value depends on the batch);
  we follow the paper. Its ``+1e-9`` in the denominator is left out: a map with no relevance left scores as a
  constant map (μ = the mask's share, μ_w = 1; **ours**).
* Pixels in ``ignore`` count in no sum nor size; an image whose mask has no counted pixel is NaN, left out of the
  mean and counted (``undefined``; Quantus: NaN).

μ in [0, 1], μ_w in [0, S_tot / S_in]; higher is better; a map equal to the mask scores 1 (μ) and 1 / share (μ_w).
Per image ``attribution_localisation``; reported its mean over the defined images. Decisions:
docs/decisions/metrics-latec-localisation.md.
"""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ._localisation import NEGATIVES, MaskMeans, batch_truth, prepare, undefined_where_empty, uniform_share
from .base import EvalBatch, register_metric

Negatives = Literal["clip", "absolute"]


def attribution_localisation(maps: Tensor, masks: Tensor, *, weighted: bool = False, negatives: str = "clip",
                             ignore: Tensor | None = None) -> Tensor:
    """μ (or μ_w with ``weighted``) of each map [B] (float64): maps [B, h, w] upsampled to the masks [B, H, W]
    (bool); ``ignore`` [B, H, W]: pixels left out; ``negatives``: ``"clip"`` or ``"absolute"``."""
    relevance, truth, valid = prepare(maps, masks, ignore)
    relevance = NEGATIVES[negatives](relevance) * valid
    total = relevance.sum(1)
    share = uniform_share(truth, valid)
    ratio = ((relevance * truth).sum(1) / total.where(total > 0, 1.0)).where(total > 0, share)
    if weighted:
        ratio = ratio / share.where(share > 0, 1.0)
    return undefined_where_empty(ratio, truth)


reduce_attribution_localisation = MaskMeans(attribution_localisation="attribution_localisation")


@register_metric(
    "attribution_localisation",
    reduce=reduce_attribution_localisation,
    requires=("masks",),
    higher_is_better={"attribution_localisation": True},
    group="localisation",
    reference="quantus",
    departures="Quantus takes |map| by default (`negatives=\"absolute\"` here), ours the positive part, as Kohlbrenner "
               "et al. define μ. Quantus's weighted variant multiplies by the mask's size over the size of the batch "
               "from its third image on, so its value depends on the batch; ours divides by the mask's share, as the "
               "paper.",
)
def _compute(batch: EvalBatch, *, weighted: bool = False, negatives: Negatives = "clip") -> dict[str, Tensor]:
    maps, masks, ignore = batch_truth(batch)
    return {"attribution_localisation": attribution_localisation(maps, masks, weighted=weighted, negatives=negatives,
                                                                 ignore=ignore)}
