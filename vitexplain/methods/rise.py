"""RISE: Randomized Input Sampling for Explanation (Petsiuk, Das & Saenko, BMVC 2018)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt, Probability, Score
from ..registry import register_method
from ..seeding import seeded_draw
from ._pixel import chunks, interpolation_matrix, mask_major_pairs


def random_grids(n_masks: int, grid_size: int, p1: float, image_size: tuple[int, int], seed: int,
                 device: torch.device) -> tuple[Tensor, Tensor]:
    """The random part of RISE's masks: binary grids [N, s, s] and crop shifts [N, 2] (rows, columns).

    Each grid cell is 1 with probability p1; a shift is uniform in [0, C) per axis, C = ceil(size / s).
    Drawn once from ``seed`` (on the CPU, then moved to ``device``), so every image of every batch, on
    every device, gets the same masks.
    """
    def draw(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        grids = (torch.rand(n_masks, grid_size, grid_size, generator=generator) < p1).float()
        shifts = torch.stack([torch.randint(0, math.ceil(size / grid_size), (n_masks,), generator=generator)
                              for size in image_size], dim=1)
        return grids, shifts

    return seeded_draw(seed, draw, device)


def grid_masks(grids: Tensor, shifts: Tensor, image_size: tuple[int, int]) -> Tensor:
    """RISE masks [n, H, W] in [0, 1]: each grid bilinearly upsampled to (s+1)·C and cropped at its shift.

    The upsample-then-crop is one matrix product per mask: the crop keeps the rows ``shift + 0..H-1``
    of the 1-D interpolation matrix of each axis, so the (s+1)·C image is never built.
    """
    grid_size = grids.shape[-1]
    factors = []
    for axis, size in enumerate(image_size):
        cell = math.ceil(size / grid_size)
        full = interpolation_matrix(grid_size, (grid_size + 1) * cell, device=grids.device)
        factors.append(full[shifts[:, axis, None] + torch.arange(size, device=grids.device)])  # [n, size, s]
    rows, cols = factors
    return rows @ grids @ cols.transpose(1, 2)


@register_method(resolution="pixel", cost=lambda o: o["n_masks"], reads="output")
def rise(adapter: ModelAdapter, images: Tensor, target=None, *, n_masks: PositiveInt = 4000,
         grid_size: PositiveInt = 7, p1: Probability = 0.5, score: Score = "probability", batch_size: PositiveInt = 64,
         seed: int = 0) -> Tensor:
    """RISE: the target score of randomly masked images, averaged over masks, per pixel.

    Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models",
    BMVC 2018. Sec. 3: the importance of pixel λ is E[f(I ⊙ M) | M(λ) = 1] (Eq. 1), estimated by
    Monte Carlo as S(λ) ≈ 1 / (E[M] · N) Σ_i f(I ⊙ M_i) · M_i(λ) with E[M] = p1 (Eq. 6). Mask
    generation (Sec. 3, "Mask generation"): N binary s×s grids with cells set to 1 with probability
    p1, bilinearly upsampled to (s+1)·C with C = ceil(H / s), and cropped to H×W at a random shift in
    [0, C) per axis.

    The masks depend only on ``seed`` and the image size, not on the batch or ``batch_size``; how they
    are upsampled and applied: docs/decisions/baselines-perturbation.md.

    Options:
        n_masks: N (4000 in the paper for ResNet50 and in the TIS benchmark).
        grid_size: s, the grid side (7 in the paper; the TIS benchmark used 8).
        p1: probability that a grid cell is kept (0.5 in the paper; the TIS benchmark used 0.1).
        score: f, ``probability`` (softmax, as the paper and the authors' code), ``logit`` (what the
            TIS benchmark's wrapper passed) or ``log_probability``.
        batch_size: masked images per forward; bounds memory (masks are built per batch).
        seed: seeds the grids and shifts (drawn on the CPU: the same masks on every device).
    """
    resolved = adapter.target(images, target)
    batch, _, height, width = images.shape
    grids, shifts = random_grids(n_masks, grid_size, p1, (height, width), seed, images.device)
    saliency = torch.zeros(batch, height, width, device=images.device)
    image_idx, mask_idx = mask_major_pairs(torch.full((batch,), n_masks, device=images.device))
    for part in chunks(len(image_idx), batch_size):
        img, msk = image_idx[part], mask_idx[part]
        first, last = int(msk[0]), int(msk[-1])
        masks = grid_masks(grids[first:last + 1], shifts[first:last + 1], (height, width))[msk - first]
        logits = adapter.logits(images[img] * masks[:, None].to(images.dtype))
        scores = resolved.select(img).score(logits, score).float()
        saliency.index_add_(0, img, scores[:, None, None] * masks)
    return saliency / (n_masks * p1)
