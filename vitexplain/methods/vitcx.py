"""ViT-CX: Causal Explanation of Vision Transformers (Xie, Li, Cao & Zhang, IJCAI 2023)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter, Recording
from ..maps import min_max
from ..options import NonNegative, PositiveInt, Score, block_index
from ..registry import register_method
from ..seeding import seeded_draw
from ._pixel import chunks, interpolation_matrix, mask_major_pairs, resize_by_factors


def patch_feature_maps(record: Recording, layer: int, features: str) -> Tensor:
    """The frontal slices of the patch-embedding tensor: one map per embedding dimension [B, D, h, w] (on
    the block's own stage grid for a hierarchical model)."""
    block = record.blocks[block_index("layer", layer, len(record.blocks))]
    geometry = record.geometry
    tokens = (block.attn_input if features == "attn_input" else block.output)[:, geometry.num_prefix_tokens:]
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], *geometry.grid_of(tokens.shape[1])).float()


def upsampled_ranges(maps: Tensor, rows: Tensor, cols: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Min and max [B, D] of every map after the bilinear resize, resizing ``chunk`` maps at a time."""
    flat = maps.flatten(0, 1)
    low, high = [], []
    for part in chunks(flat.shape[0], chunk):
        resized = resize_by_factors(flat[part], rows, cols).flatten(1)
        low.append(resized.amin(1))
        high.append(resized.amax(1))
    return torch.cat(low).view(maps.shape[:2]), torch.cat(high).view(maps.shape[:2])


def mask_cosine_similarity(maps: Tensor, low: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Cosine similarity [B, D, D] of the image-size masks M_c = (up(a_c) - min) / (max - min).

    Computed exactly without building the masks: the resize is U = rows ⊗ cols, so
    <up(a_c), up(a_d)> = Σ a_c ⊙ (rowsᵀrows · a_d · colsᵀcols) and Σ up(a_c) = (rowsᵀ1)ᵀ a_c (colsᵀ1);
    subtracting the minima expands the inner products; the 1/(max - min) scales cancel in the cosine.
    Constant maps (zero masks) have similarity 0 to everything.
    """
    a, rows, cols, low = maps.double(), rows.double(), cols.double(), low.double()
    inner = torch.einsum("bchw,bdhw->bcd", a, (rows.T @ rows) @ a @ (cols.T @ cols))
    totals = torch.einsum("h,bchw,w->bc", rows.sum(0), a, cols.sum(0))
    pixels = rows.shape[0] * cols.shape[0]
    centred = (inner - low[:, None, :] * totals[:, :, None] - low[:, :, None] * totals[:, None, :]
               + pixels * low[:, :, None] * low[:, None, :])
    norms = centred.diagonal(dim1=1, dim2=2).clamp(min=0).sqrt()
    denominator = norms[:, :, None] * norms[:, None, :]
    return torch.where(denominator > 0, centred / denominator, torch.zeros_like(centred)).float()


def complete_linkage(distance: Tensor, threshold: float) -> Tensor:
    """Agglomerative clustering with complete linkage, one per batch entry, stopped at ``threshold``.

    Repeatedly merges the two closest clusters while their distance (the largest distance between
    their members) is below ``threshold``, as ``sklearn.cluster.AgglomerativeClustering(linkage=
    "complete", distance_threshold=threshold)``. Batched: each step merges one pair in every entry
    that still has a pair below the threshold.

    Args:
        distance: symmetric pairwise distances [B, D, D].

    Returns:
        labels [B, D]: each item's cluster, named by the smallest index among its members.
    """
    batch, size, _ = distance.shape
    dist = (distance + distance.transpose(1, 2)) / 2
    dist.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    labels = torch.arange(size, device=distance.device).repeat(batch, 1)
    entries = torch.arange(batch, device=distance.device)
    for _ in range(size - 1):
        best, flat = dist.flatten(1).min(1)
        merging = best < threshold
        if not merging.any():
            break
        b, first, second = entries[merging], flat[merging] // size, flat[merging] % size
        keep, gone = torch.minimum(first, second), torch.maximum(first, second)
        merged = torch.maximum(dist[b, keep], dist[b, gone])
        dist[b, keep] = merged
        dist[b, :, keep] = merged
        dist[b, keep, keep] = float("inf")
        dist[b, gone] = float("inf")
        dist[b, :, gone] = float("inf")
        labels[b] = torch.where(labels[b] == gone[:, None], keep[:, None], labels[b])
    return labels


def cluster_maps(maps: Tensor, scale: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Token-grid maps z_K = Σ_{c∈K} a_c · scale_c of each cluster [B, K, h, w], and cluster counts [B].

    Clusters are numbered in the order of their smallest member. The sum of a cluster's normalised
    masks is up(z_K) minus a constant, so min-max normalising up(z_K) gives the cluster's mask.
    """
    batch, size, height, width = maps.shape
    representative = labels == torch.arange(size, device=labels.device)
    rank = (representative.cumsum(1) - 1).gather(1, labels)
    counts = representative.sum(1)
    weighted = (maps * scale[:, :, None, None]).flatten(2)
    summed = weighted.new_zeros(batch, int(counts.max()), height * width)
    summed.scatter_add_(1, rank[:, :, None].expand_as(weighted), weighted)
    return summed.view(batch, -1, height, width), counts


def mask_noise(seed: int, first: int, last: int, shape: tuple[int, ...], max_masks: int,
               device: torch.device) -> Tensor:
    """Standard normal noise ε_i for masks first..last [n, *shape]; ε_i depends only on (seed, i).

    Every mask index has its own generator, seeded from ``seed`` by one that draws ``max_masks`` seeds,
    so an image's noise does not depend on the batch or on ``batch_size``. All are CPU generators, so
    the noise does not depend on the device either; the masks' noise crosses to ``device`` together.
    """
    seeds = seeded_draw(seed, lambda generator: torch.randint(0, 2**62, (max_masks,), generator=generator))
    return torch.stack([seeded_draw(int(seeds[i]), lambda generator: torch.randn(shape, generator=generator))
                        for i in range(first, last + 1)]).to(device)


@register_method(resolution="pixel", cost=400,
                 precision_caveats={"bfloat16 weights": 0.033, "float16 weights": 0.897}, reads="tokens")
def vitcx(adapter: ModelAdapter, images: Tensor, target=None, *, layer: int = -1,
          features: Literal["attn_input", "output"] = "attn_input", distance_threshold: NonNegative = 0.1,
          noise_std: NonNegative = 0.1, score: Score = "probability", batch_size: PositiveInt = 64,
          seed: int = 0) -> Tensor:
    """ViT-CX: masks from patch embeddings, clustered, scored by their causal impact on the target.

    Xie, Li, Cao & Zhang, "ViT-CX: Causal Explanation of Vision Transformers", IJCAI 2023, Sec. 3,
    as implemented in the authors' code (vaynexie/CausalX-ViT), which the TIS benchmark ran:

    1. Mask generation: the patch embeddings of one layer form a [D, h, w] tensor; each frontal slice
       (embedding dimension) is bilinearly resized to the image and min-max normalised to [0, 1].
    2. Mask aggregation: agglomerative clustering of the masks with complete linkage on the cosine
       distance 1 - cos, merging while the distance is below δ (``distance_threshold``, 0.1); each
       cluster's mask is the min-max normalised sum of its members.
    3. Causal impact scoring with noise: with ε_i ~ N(0, σ²) per pixel and channel (σ = 0.1) and p the
       target score, s_i = p(x ⊙ M_i + ε_i ⊙ (1 - M_i)) - p(x + ε_i ⊙ (1 - M_i)) + p(x).
    4. Pixel-coverage-bias correction: S = 1/N Σ_i s_i · M_i ⊘ Σ_j M_j (N = number of cluster masks);
       pixels that no mask covers get 0.

    Features, exact image-size masks without storing them, noise: docs/decisions/baselines-perturbation.md.

    Options:
        layer: block whose patch tokens make the masks (-1 = last).
        features: ``attn_input`` (the block's LayerNorm-ed input, the authors' target layer) or
            ``output`` (the block's output).
        distance_threshold: δ, clusters closer than this (in cosine distance) are merged.
        noise_std: σ of the noise that replaces the masked-out content.
        score: p, ``probability`` (the authors' softmax), ``logit`` or ``log_probability``.
        batch_size: images per forward (two per mask, so at least two); bounds memory.
        seed: seeds the noise.
    """
    record = adapter.record(images, target, blocks=(layer,), fields=("attn_input",) if features == "attn_input" else (
        "residual", "attn_branch", "mlp_branch"))
    maps = patch_feature_maps(record, layer, features)
    batch, channels, height, width = images.shape
    rows = interpolation_matrix(maps.shape[2], height, device=images.device)
    cols = interpolation_matrix(maps.shape[3], width, device=images.device)
    low, high = upsampled_ranges(maps, rows, cols, chunk=max(1, 3 * batch_size))
    scale = torch.where(high > low, 1 / (high - low), torch.zeros_like(high))
    labels = complete_linkage(1 - mask_cosine_similarity(maps, low, rows, cols), distance_threshold)
    clusters, counts = cluster_maps(maps, scale, labels)

    clean = record.target.score(record.logits, score).float()
    saliency = torch.zeros(batch, height, width, device=images.device)
    coverage = torch.zeros_like(saliency)
    image_idx, mask_idx = mask_major_pairs(counts)
    for part in chunks(len(image_idx), max(1, batch_size // 2)):
        img, msk = image_idx[part], mask_idx[part]
        first, last = int(msk[0]), int(msk[-1])
        masks = min_max(resize_by_factors(clusters[img, msk], rows, cols), constant=0.0)
        noise = mask_noise(seed, first, last, (channels, height, width), maps.shape[1], images.device)[msk - first]
        filler = (noise_std * noise * (1 - masks[:, None])).to(images.dtype)
        inputs = images[img]
        logits = adapter.logits(torch.cat([inputs * masks[:, None].to(images.dtype) + filler, inputs + filler]))
        masked, reference = record.target.select(img.repeat(2)).score(logits, score).float().chunk(2)
        saliency.index_add_(0, img, (masked - reference + clean[img])[:, None, None] * masks)
        coverage.index_add_(0, img, masks)
    covered = torch.where(coverage > 0, saliency / torch.where(coverage > 0, coverage, 1), torch.zeros_like(saliency))
    return covered / counts[:, None, None]
