"""What the correlation protocols of faithfulness share: square features of the image, the forwards of many perturbed
copies of every image, and a per-image correlation that says 0 where it is undefined.

Faithfulness estimate and monotonicity correlation (``faithfulness_estimate.py``, ``monotonicity_correlation.py``)
perturb one feature at a time and correlate, over the features of an image, what the map gives each feature with what
the model does when it is perturbed; faithfulness correlation (``faithfulness_correlation.py``) does the same over
random subsets of pixels. A feature here is a ``patch_size`` x ``patch_size`` patch of the grid centred on the image
(``_regions.pixel_patches``; 1 = single pixels, all channels together), its attribution the sum of the map upsampled
bilinearly over its pixels. A correlation is undefined when either side is constant (a constant map, or a model whose
score no perturbation moves); it is scored 0 there, what a map that carries no order gets in expectation, so a
report stays a mean of finite numbers (Quantus returns NaN: docs/decisions/metrics-latec-faithfulness.md).

Copies that are not the top pixels of one ranking (random subsets; one feature under many noise draws) go through
:func:`chunked_scores`, every (image, copy) pair of the batch in chunks of ``batch_size``, each chunk made when it is
forwarded; the intact images through ``_perturb.mixed_logits``, so that through ``SharedForwards`` they are forwarded
once for every protocol. The copies are not kept for sharing: no other protocol makes them.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._perturb import mixed_logits
from ._regions import class_score, pixel_patches, region_relevance, upsampled
from .correlation import average_ranks, pearson


def patch_features(maps: Tensor, images: Tensor, patch_size: int) -> tuple[Tensor, Tensor, int]:
    """The features of every image: each pixel's feature [B, H*W] (long: the row-major patch index, shared by the
    images), each feature's attribution [B, K] (float64: the sum of the upsampled map over its pixels; 0 for every
    feature of a constant map, whose upsampling and cut border patches would otherwise make rounding or patch sizes
    an order), and K."""
    labels, count = pixel_patches(images.shape[-2], images.shape[-1], patch_size, images.device)
    relevance = region_relevance(upsampled(maps, images), labels[None], count, "sum")
    relevance = relevance.masked_fill(constant(maps)[:, None], 0.0)
    return labels.reshape(1, -1).expand(images.shape[0], -1), relevance, count


def intact_logits(forward: Callable[[Tensor], Tensor], images: Tensor, batch_size: int) -> Tensor:
    """The logits of the images themselves [B, 1, classes] (a mix that takes nothing: through ``SharedForwards``, the
    forward every protocol of the batch shares)."""
    nothing = torch.zeros(images.shape[0], images.shape[-2] * images.shape[-1], dtype=torch.long, device=images.device)
    return mixed_logits(forward, images, images[:1], nothing, torch.zeros(1, dtype=torch.long), batch_size)


def chunked_scores(forward: Callable[[Tensor], Tensor], targets: Tensor, copies: int,
                   make: Callable[[Tensor, Tensor], Tensor], batch_size: int, score: str) -> Tensor:
    """The explained class's ``score`` (``_regions.class_score``) on ``copies`` perturbed copies of each image,
    [B, copies] (float32): the (image, copy) pairs in chunks of ``batch_size``, ``make(image index [n], copy index
    [n])`` -> [n, C, H, W] building each chunk; only the scores are kept, not every class's logits."""
    batch, outputs = targets.shape[0], []
    with torch.no_grad():
        for begin in range(0, batch * copies, batch_size):
            flat = torch.arange(begin, min(begin + batch_size, batch * copies))
            image, copy = flat // copies, (flat % copies).to(targets.device)
            image = image.to(targets.device)
            outputs.append(class_score(forward(make(image, copy))[:, None], targets[image], score)[:, 0])
    return torch.cat(outputs).view(batch, copies)


def constant(maps: Tensor) -> Tensor:
    """Whether each map [B, ...] has one value everywhere [B] (bool)."""
    flat = maps.flatten(1)
    return flat.amax(1) == flat.amin(1)


def correlation(first: Tensor, second: Tensor, ranked: bool = False) -> Tensor:
    """Per row, the Pearson correlation of ``first`` and ``second`` [B, n] (Spearman's, of their average ranks, when
    ``ranked``), float64 [B]; 0 where either row is constant."""
    first, second = first.to(torch.float64), second.to(torch.float64)
    if ranked:
        first, second = average_ranks(first), average_ranks(second)
    both_vary = (first.amax(1) > first.amin(1)) & (second.amax(1) > second.amin(1))
    return torch.where(both_vary, pearson(first, second), 0.0)
