"""Normalised AOPC: the AOPC of a map placed between the lowest and the highest AOPC any removal order reaches on
the same image (Edin, Motzfeldt, Christensen, Ruotsalo, Maaløe & Maistro, "Normalized AOPC: Fixing Misleading
Faithfulness Metrics for Feature Attribution Explainability", ACL 2025; authors' code JoakimEdin/naopc).

AOPC's range depends on the model and the input: a drop of 0.3 is the best any order can do on one image and
a poor one on another. The paper therefore rescales each input's AOPC by its bounds over all orderings π of the
features,

    NAOPC(e) = (AOPC(π_e) - min_π AOPC(π)) / (max_π AOPC(π) - min_π AOPC(π)),

so 1 is the best order there is and 0 the worst. The exact bounds need all 2^N subsets (the authors' exact variant
stops at 12 features); for longer inputs the paper approximates them by **beam search** (``naopc_beam`` in its code,
``approx_pertubation_solver_callable``), which is what is implemented:

* features = the ``patch_size`` x ``patch_size`` patches of a grid centred on the image (``_regions.pixel_patches``;
  **ours**: the paper's features are tokens, an image's would be its 50,176 pixels, whose orders no search covers).
  ``patch_size=None`` (default) takes ceil(shorter side / 7) px: 49 patches, a ViT-B/16's 7 x 7 tokens at 112 px and
  the grid of Selectivity (:mod:`vitexplain.metrics.selectivity`). The map ranks them by its sum over each patch
  (upsampled bilinearly; ties: the lower patch first), as Region Perturbation does;
* the AOPC of an order is AOPC's own arithmetic (:func:`vitexplain.metrics.aopc.drops_along`): the explained class's
  softmax probability with the first k patches black (0 before normalisation), drop_k = p(x) - p(x^(k)),
  AOPC = 1/N Σ_{k=0}^{N-1} drop_k, one patch per level. (The authors' code sums k = 1 ... N; the all-removed level is
  the same for every order and the k = 0 level is 0, so the normalised value is the same either way.)
* bounds: the authors' beam search, both directions at once. A beam holds orders of the first t features and their
  cumulative drop Σ_{k=1}^{t} drop_k; each step extends every order of the beam by every remaining feature, scores the
  distinct sets once (one forward each), and keeps the ``beam_size`` best (largest sum for the upper bound, smallest
  for the lower), ties in the order the candidates were made (beam order, then feature index: Python's stable
  ``sorted`` in their code). After N - 1 steps the last feature closes each order; the best order of each beam is
  scored again by the AOPC above, which gives the bounds (their ``get_bounds`` does the same). ``beam_size`` = 5,
  their ``Aopc.evaluate`` default.

The map's AOPC may fall outside approximate bounds (an order the beam missed), so NAOPC is not clipped to [0, 1]. An
image whose every order has the same AOPC (upper = lower: the model ignores the removal) scores 0.5 (**ours**: no
order is better than another; the paper's formula divides by zero). Per image: ``naopc``, ``aopc``, ``lower``,
``upper``; reported: their means (``naopc`` ↑, ``aopc`` ↑; the bounds have no direction).

Cost: about 2 x beam_size x N^2 / 2 forwards per image (11,800 at 49 patches), batched in chunks of ``batch_size``
with the candidates of every image of the batch together.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..options import PixelLength, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel
from ._regions import pixel_patches, pixel_rank, region_relevance, upsampled
from .aopc import drops_along
from .base import EvalBatch, register_metric

#: patches per side of the default grid
GRID = 7


def naopc(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
          pixel_mean: Sequence[float], pixel_std: Sequence[float], patch_size: int | None = None, beam_size: int = 5,
          batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image normalised AOPC of the maps' patch order, and the AOPC and its beam-searched bounds.

    Args:
        forward: images -> logits, batched, called without gradients.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: the explained class of each image [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (black = 0 before it).
        patch_size: side of the patches (the features) in pixels; None: ceil(shorter side / 7).
        beam_size: orders kept per direction at each step of the search.
        batch_size: perturbed images per forward.

    Returns:
        ``naopc``, ``aopc``, ``lower``, ``upper``: [B] each.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    height, width = images.shape[-2:]
    size = math.ceil(min(height, width) / GRID) if patch_size is None else patch_size
    labels, count = pixel_patches(height, width, size, images.device)
    options = dict(pixel_mean=pixel_mean, pixel_std=pixel_std, batch_size=batch_size)

    def aopc_of(order_rank: Tensor) -> Tensor:     # per patch its place in the order [B, N] -> AOPC [B]
        rank = order_rank.gather(1, labels.flatten()[None].expand(order_rank.shape[0], -1))
        return drops_along(forward, images, rank, torch.arange(count), targets, **options)["probability_drop"].mean(1)

    rank = pixel_rank(region_relevance(upsampled(maps, images), labels[None], count, "sum"), labels[None], True)
    found = aopc_of(_patch_rank(rank, labels, count))
    upper_order, lower_order = _beam_bounds(forward, images, targets, labels, count, beam_size, **options)
    upper, lower = aopc_of(upper_order), aopc_of(lower_order)
    span = upper - lower
    normalised = torch.where(span != 0, (found - lower) / torch.where(span != 0, span, 1.0), 0.5)
    return {"naopc": normalised, "aopc": found, "lower": lower, "upper": upper}


def _patch_rank(rank: Tensor, labels: Tensor, count: int) -> Tensor:
    """Each patch's rank [B, N] from its pixels' (all equal) [B, H*W]."""
    return rank.new_zeros(rank.shape[0], count).scatter_(1, labels.flatten()[None].expand_as(rank), rank)


def _beam_bounds(forward: Callable[[Tensor], Tensor], images: Tensor, targets: Tensor, labels: Tensor, count: int,
                 beam_size: int, *, pixel_mean: Sequence[float], pixel_std: Sequence[float],
                 batch_size: int) -> tuple[Tensor, Tensor]:
    """The best orders the beam search finds, highest cumulative drop first and lowest, as each patch's place in the
    order [B, N] (long)."""
    batch, device = images.shape[0], images.device
    black = black_pixel(images, pixel_mean, pixel_std)
    pixels = labels.flatten()
    directions = 2                                  # 0: the upper bound (largest drops), 1: the lower
    removed = torch.zeros(batch, directions, 1, count, dtype=torch.bool, device=device)
    order = torch.zeros(batch, directions, 1, count, dtype=torch.long, device=device)   # place of each patch
    total = torch.zeros(batch, directions, 1, dtype=torch.float64, device=device)
    with torch.no_grad():
        intact = _probabilities(forward, images, black, pixels, torch.arange(batch, device=device),
                                torch.zeros(batch, count, dtype=torch.bool, device=device), targets, batch_size)
    for step in range(count - 1):
        beams = removed.shape[2]
        # candidate (beam w, feature f) in the order the authors' code makes them: w first, then f
        new = removed[:, :, :, None, :] | torch.eye(count, dtype=torch.bool, device=device)      # [B, 2, w, f, N]
        allowed = ~removed                                                                      # [B, 2, w, f]
        new, allowed = new.reshape(batch, directions, beams * count, count), allowed.reshape(batch, directions, -1)
        image = torch.arange(batch, device=device)[:, None, None].expand(-1, directions, beams * count)
        sets, inverse = torch.unique(torch.cat([image[allowed][:, None], new[allowed].long()], 1), dim=0,
                                     return_inverse=True)
        with torch.no_grad():
            probability = _probabilities(forward, images, black, pixels, sets[:, 0], sets[:, 1:].bool(), targets,
                                         batch_size)
        drop = torch.full(allowed.shape, math.nan, dtype=torch.float64, device=device)
        drop[allowed] = intact[sets[inverse, 0]] - probability[inverse]
        score = total.repeat_interleave(count, dim=2) + drop                                    # [B, 2, w * f]
        key = torch.stack([-score[:, 0], score[:, 1]], 1).masked_fill(~allowed, math.inf)
        kept = key.sort(dim=2, stable=True).indices[:, :, :beam_size]
        kept = kept[:, :, :min(beam_size, int(allowed.sum(2).max()))]
        valid = allowed.gather(2, kept)
        parent = kept // count
        feature = kept % count
        removed = new.gather(2, kept[..., None].expand(-1, -1, -1, count))
        order = order.gather(2, parent[..., None].expand(-1, -1, -1, count))
        order = order.scatter(3, feature[..., None], step)
        total = score.gather(2, kept).masked_fill(~valid, math.nan)
        removed = removed & valid[..., None] | ~valid[..., None]       # an empty slot takes no further candidate
    best = order[:, :, 0].clone()                                      # the first slot is the best (sorted)
    last = ~removed[:, :, 0]
    best[last] = count - 1
    return best[:, 0], best[:, 1]


def _probabilities(forward: Callable[[Tensor], Tensor], images: Tensor, black: Tensor, pixels: Tensor, image: Tensor,
                   removed: Tensor, targets: Tensor, batch_size: int) -> Tensor:
    """Softmax probability of the explained class with the ``removed`` patches [n, N] of images ``image`` [n]
    black [n] (float64), in chunks of ``batch_size``."""
    height, width = images.shape[-2:]
    found = []
    for begin in range(0, image.shape[0], batch_size):
        rows = image[begin:begin + batch_size]
        taken = removed[begin:begin + batch_size][:, pixels].view(-1, 1, height, width)
        logits = forward(torch.where(taken, black.to(images.dtype), images[rows])).float()
        found.append(logits.log_softmax(-1).gather(1, targets[rows, None])[:, 0].exp().double())
    return torch.cat(found) if found else images.new_zeros(0, dtype=torch.float64)


reduce_naopc = Means(naopc="naopc", aopc="aopc", lower="lower", upper="upper")


def _cost(options: dict, method_passes: float) -> float:
    side = math.ceil(224 / (options["patch_size"] or math.ceil(224 / GRID)))
    n, beam = side * side, options["beam_size"]
    return 3 * n + 1 + 2 * sum(min(beam, math.perm(n, step)) * (n - step) for step in range(n - 1))


@register_metric(
    "naopc",
    reduce=reduce_naopc,
    higher_is_better={"naopc": True, "aopc": True},
    cost=_cost,
    group="faithfulness",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength | None = None, beam_size: PositiveInt = 5,
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return naopc(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean, pixel_std=batch.std,
                 patch_size=patch_size, beam_size=beam_size, batch_size=batch_size)
