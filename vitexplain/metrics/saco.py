"""SaCo: the Salience-guided Faithfulness Coefficient (Wu, Kang, Tang, Hong & Yan, CVPR 2024, "On the
Faithfulness of Vision Transformer Explanations", Algorithm 1).

Cumulative removal (perturbation test, insertion / deletion) mixes the effect of every group of
pixels removed so far and uses only the ranking of the map. SaCo removes each group on its own and
asks whether the map's salience values predict the groups' effects, pair by pair:

* the map M(x, y) is upsampled bilinearly to the image; its pixels, sorted by decreasing salience,
  are split into K groups G_1 ... G_K of (nearly) equal size (K = 10 in the paper): group k holds the
  ranks ``int(H * W * (k - 1) / K)`` up to ``int(H * W * k / K)``;
* ∇pred(x, G_k) = p(y | x) - p(y | R(x, G_k)), where R(x, G_k) replaces the pixels of G_k (all
  channels) by the per-sample mean (one value, the image's mean over channels and pixels, the
  ``mean`` baseline of :mod:`vitexplain.metrics.insertion_deletion`) and y is the explained class;
* for every pair i < j (G_i more salient), the weight s(G_i) - s(G_j) counts for the map when
  ∇pred(x, G_i) >= ∇pred(x, G_j) and against it otherwise:
  SaCo = sum_{i<j} ±(s(G_i) - s(G_j)) / sum_{i<j} |s(G_i) - s(G_j)|, in [-1, 1], as the authors'
  ``compute_SaCo`` (adreamwu/SaCo) computes it from s(G_k) and ∇pred(x, G_k), which it leaves to the user.

Ours (docs/decisions/metrics.md): s(G_k) is the *mean* salience of G_k, not the sum. SaCo is unchanged
by a common factor, so the two agree whenever K divides H * W; otherwise the groups differ by one
pixel and the sum would count that pixel as salience (a constant map would score non-zero). A map
whose groups all have the same salience (a constant map) has no weight at all and scores 0 (the
authors' code raises). Ties are ranked in raster order, as in every protocol here.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..maps import resize
from ..options import AtLeastTwo, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets, removal_rank
from ._perturb import mixed_logits, removal_counts
from .base import Curves, EvalBatch, register_metric
from .insertion_deletion import baseline_images


def saco(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *, n_groups: int = 10,
         batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image SaCo and the probability drop of every group.

    Args:
        forward, images, maps, batch_size: as in :func:`vitexplain.metrics.perturbation.perturbation_test`.
        targets: class whose probability is followed (the explained class) [B].
        n_groups: K, the number of salience groups.

    Returns:
        ``saco`` [B] and ``group_drop`` [B, K] (∇pred of the groups, most salient first).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    pixels = images.shape[-2] * images.shape[-1]
    if n_groups > pixels:
        raise ValueError(f"n_groups must be an integer from 2 to the number of pixels ({pixels}), got {n_groups!r}")
    # on the CPU: see mixed_logits
    bounds = torch.cat([removal_counts(pixels, n_groups), torch.tensor([pixels])])
    salience = resize(maps, images.shape[-2:]).flatten(1).to(torch.float64)
    rank = removal_rank(salience, most_relevant_first=True)
    group = torch.bucketize(rank, bounds[1:-1].to(images.device), right=True)
    sizes = torch.bincount(group[0], minlength=n_groups)
    group_salience = torch.zeros(len(images), n_groups, dtype=torch.float64, device=images.device)
    group_salience = group_salience.scatter_add_(1, group, salience) / sizes
    # step 0 leaves the image whole; step k replaces group k (ranks bounds[k - 1] to bounds[k])
    starts, counts = torch.cat([bounds[:1], bounds[:-1]]), torch.cat([bounds[:1], bounds[1:]])
    logits = mixed_logits(forward, images, baseline_images(images, "mean"), rank, counts, batch_size, starts=starts)
    probability = logits.float().softmax(-1).gather(2, targets[:, None, None].expand(-1, n_groups + 1, 1))[..., 0]
    drop = probability[:, :1] - probability[:, 1:]
    return {"saco": faithfulness_coefficient(group_salience, drop).float(), "group_drop": drop}


def faithfulness_coefficient(salience: Tensor, drop: Tensor) -> Tensor:
    """SaCo of groups ordered by decreasing salience: their salience and probability drop [B, K] -> [B]."""
    gap = salience[:, :, None] - salience[:, None, :]
    weight = torch.where(drop[:, :, None] >= drop[:, None, :], gap, -gap)
    weight = weight * torch.ones_like(gap[0], dtype=torch.bool).triu(1)
    total = weight.abs().sum((1, 2))
    return torch.where(total > 0, weight.sum((1, 2)) / total, torch.zeros_like(total))


reduce_saco = Means(saco="saco")


@register_metric(
    "saco",
    reduce=reduce_saco,
    higher_is_better={"saco": True},
    cost=lambda options, method: options["n_groups"] + 1,
    group="faithfulness",
    curves=Curves(lambda options, points: [(k + 0.5) / options["n_groups"] for k in range(points)],
                  "salience group, at its middle as a share of the pixels ranked most salient first",
                  {"group_drop": "probability drop when that group alone is replaced by the image's mean"}),
)
def _compute(batch: EvalBatch, *, n_groups: AtLeastTwo = 10,
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return saco(batch.logits, batch.images, batch.maps, batch.targets, n_groups=n_groups, batch_size=batch_size)
