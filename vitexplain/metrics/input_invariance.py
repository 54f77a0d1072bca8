"""Input invariance (Kindermans, Hooker, Adebayo, Alber, Schütt, Dähne, Erhan & Kim, "The (Un)reliability of Saliency
Methods", in Explainable AI, LNCS 11700, 2019; arXiv:1711.00867, 2017): a constant shift of the input that the model
absorbs should not change the map.

Kindermans et al. take a network f1 and a second one f2 that differs only in its first layer's bias, so
that f2(x + c) = f1(x) for a constant shift c: the two compute the same function of their own inputs, with the same
gradients, and a method is input invariant when it gives f2 on x2 = x + c the map it gives f1 on x. The gradient
passes; gradient × input (the input changed) and integrated gradients from a zero baseline fail.

Here f2 is the model within :attr:`EvalBatch.modified` with a pre-hook that subtracts c where the images enter it
(:func:`._robustness.absorbed_shift`; Quantus's ``InputInvariance`` moves the first layer's bias instead, the same
function), so the protocol never holds the model and the model is restored bitwise after. x + c is explained with
``copy=1``: to the random control it is another image, so it draws afresh and fails, as the least stable map.

Per image: ``input_shift_change`` = ‖e2 − e1‖_2 / ‖e1‖_2, the relative change of the map (max-sensitivity's ratio,
a zero map's norm replaced by 1), and ``input_invariant`` = 1 when that change is at most ``tolerance`` (Quantus: all
elements within an absolute 1e-4 of the raw maps, which depends on the scale of a method's maps; a relative
tolerance does not). The default tolerance, 1e-3, is far above the float32 rounding of a gradient through
x + c − c (about 1e-6) and far below what gradient × input moves (of the order of |c| / |x|); a method whose map
amplifies rounding (numerical_stability's chaotic maps) can fail at it. Reported: the share of invariant images ↑
and the mean change ↓. The default shift is Quantus's, −1 (preprocessed units).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
from torch import Tensor

from ..options import Range
from ..uncertainty import Means
from ._common import check_image_batch, check_maps
from ._randomise import modifier_of
from ._robustness import absorbed_shift, explained_copies
from .base import EvalBatch, register_metric


def input_invariance(explain: Callable[..., Tensor], modified, images: Tensor, maps: Tensor, targets: Tensor, *,
                     shift: float = -1.0, tolerance: float = 1e-3) -> dict[str, Tensor]:
    """Per image the relative change of the map of ``images + shift`` under the model that absorbs the shift
    (``input_shift_change``, float64 [B]), and whether it is at most ``tolerance`` (``input_invariant``, 0 / 1).

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test (given ``copy=1`` when it takes ``copy``).
        modified: :attr:`EvalBatch.modified` (the model absorbs the shift within it, and is restored after).
        images: preprocessed images [B, C, H, W]; maps: the method's maps of them [B, h, w]; targets: classes [B].
        shift: the constant c added to every element of the images.
        tolerance: the largest relative change that counts as invariant.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    with modified(absorbed_shift(shift, images[:1].detach())):
        shifted, = explained_copies(explain, [images + shift], targets, maps, what="the shifted image")
    reference = maps.float().flatten(1)
    scale = reference.norm(dim=1)
    change = (reference - shifted.float().flatten(1)).norm(dim=1) / torch.where(scale == 0, 1, scale)
    change = change.to(torch.float64)
    return {"input_shift_change": change, "input_invariant": (change <= tolerance).to(torch.float64)}


reduce_input_invariance = Means(input_invariance="input_invariant", input_shift_change="input_shift_change")


@register_metric(
    "input_invariance",
    reduce=reduce_input_invariance,
    requires=("explain", "model"),
    higher_is_better={"input_invariance": True, "input_shift_change": False},
    cost=lambda options, method: method,      # and one forward of one image per batch (where the images enter)
    group="robustness",
    reference="quantus",
    departures="Quantus shifts the bias of the model's first module, which misses a timm ViT's patch projection (its "
               "shifted model was the original one), and tests an absolute 1e-4 on raw maps; ours subtracts the "
               "shift where the images enter (a forward pre-hook) and tests a relative change of at most 1e-3.",
)
def _compute(batch: EvalBatch, *, shift: float = -1.0,
             tolerance: Annotated[float, Range(low=0)] = 1e-3) -> dict[str, Tensor]:
    return input_invariance(batch.explain, modifier_of(batch, "input_invariance"), batch.images, batch.maps,
                            batch.targets, shift=shift, tolerance=tolerance)
