"""Batched, seeded k-means (Lloyd's algorithm) that stays on the points' device.

One independent clustering per batch entry, vectorised over the batch: [B, P, D] points give
[B, K, D] centroids. Used by TIS (Englebert et al., ICCVW 2023, Eq. 1) and reusable by any method
that clusters activations.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..seeding import seeded_draw


def initial_indices(num_points: int, n_clusters: int, seed: int) -> Tensor:
    """Indices of the points that start as centroids [n_clusters], drawn on the CPU from ``seed``.

    A random permutation of the points, so the starting centroids are distinct points (as in the
    ``fast_pytorch_kmeans`` package the TIS authors use). With more clusters than points the
    permutation is repeated; the extra centroids then start on top of others and stay empty.
    The same seed gives the same indices on every device and for every batch entry.
    """
    order = seeded_draw(seed, lambda generator: torch.randperm(num_points, generator=generator))
    return order[torch.arange(n_clusters) % num_points]


def nearest_centroid(points: Tensor, centroids: Tensor) -> Tensor:
    """Index of each point's closest centroid in Euclidean distance [B, P] (ties: lowest index)."""
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for every centroid of a point.
    squared_norms = centroids.pow(2).sum(-1)[:, None, :]
    return torch.baddbmm(squared_norms, points, centroids.transpose(1, 2), alpha=-2).argmin(-1)


def kmeans(points: Tensor, n_clusters: int, *, seed: int = 0, max_iter: int = 100, tol: float = 1e-4) -> Tensor:
    """Cluster each batch entry's points with Lloyd's algorithm; returns the centroids [B, K, D].

    Args:
        points: [B, P, D], clustered independently per batch entry, in float32 whatever their dtype.
        n_clusters: K, the number of centroids.
        seed: seeds :func:`initial_indices`; every batch entry starts from the same point indices,
            so an entry's result does not depend on the rest of the batch. The global RNG is untouched.
        max_iter, tol: an entry stops after the first update that moves its centroids by a total
            squared distance <= ``tol``, or after ``max_iter`` updates (the defaults of the
            ``fast_pytorch_kmeans`` package used by the TIS authors). A stopped entry is frozen while
            the others go on, which keeps it independent of the batch.

    A centroid that no point chooses (possible when there are fewer distinct points than clusters)
    keeps its previous position instead of becoming NaN.
    """
    if points.ndim != 3:
        raise ValueError(f"points must be [B, P, D], got shape {tuple(points.shape)}")
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, int) or n_clusters < 1:
        raise ValueError(f"n_clusters must be a positive int, got {n_clusters!r}")
    if points.shape[1] == 0:
        raise ValueError("kmeans needs at least one point per batch entry")
    points = points.float()
    batch = points.shape[0]
    centroids = points[:, initial_indices(points.shape[1], n_clusters, seed).to(points.device)]
    cluster_ids = torch.arange(n_clusters, device=points.device)[None, :, None]
    running = torch.ones(batch, dtype=torch.bool, device=points.device)
    for _ in range(max_iter):
        members = (nearest_centroid(points, centroids)[:, None, :] == cluster_ids).float()  # [B, K, P]
        counts = members.sum(-1, keepdim=True)
        means = torch.bmm(members, points) / counts.clamp(min=1)
        updated = torch.where(counts > 0, means, centroids)
        shift = (updated - centroids).pow(2).sum((1, 2))
        centroids = torch.where(running[:, None, None], updated, centroids)
        running = running & (shift > tol)
        if not running.any():
            break
    return centroids
