"""Batched forwards of perturbed images, shared by the perturbation, AOPC and insertion/deletion tests.

Every perturbed image mixes two sources pixel-wise: the pixels whose removal rank is below the
step's count come from ``second``, the others from ``first``. The images of all steps of all images
are built chunk by chunk with one ``torch.where`` each and go through the model in chunks of
``batch_size``: no per-step Python work beyond the chunking.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ._common import minmax, removal_rank, upsample


def black_pixel(images: Tensor, pixel_mean: Sequence[float] | None, pixel_std: Sequence[float] | None) -> Tensor:
    """A black pixel (0 before normalisation) in the preprocessed space, [1, C, 1, 1].

    ``pixel_mean`` / ``pixel_std`` are the normalisation the images were preprocessed with, one
    value per channel (:attr:`vitexplain.metrics.EvalBatch.mean` / ``std`` in the bench).
    """
    if pixel_mean is None or pixel_std is None:
        raise ValueError("removing pixels (setting them to black) needs the mean and std the images were normalised "
                         "with; the batch has none (EvalBatch.mean / std)")
    mean = torch.as_tensor(pixel_mean, dtype=images.dtype, device=images.device).flatten()
    std = torch.as_tensor(pixel_std, dtype=images.dtype, device=images.device).flatten()
    if mean.numel() != images.shape[1] or std.numel() != images.shape[1]:
        raise ValueError(f"pixel_mean and pixel_std need {images.shape[1]} values (one per channel), "
                         f"got {mean.numel()} and {std.numel()}")
    return (-mean / std).view(1, -1, 1, 1)


def removal_counts(pixels: int, steps: int, device: torch.device) -> Tensor:
    """``int(pixels * k / steps)`` for k = 0 ... steps - 1, the pixel counts of Chefer et al.'s steps."""
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"n_steps must be an integer >= 2, got {steps!r}")
    return torch.tensor([int(pixels * (k / steps)) for k in range(steps)], device=device)


def ranked_by_relevance(maps: Tensor, images: Tensor, most_relevant_first: bool) -> Tensor:
    """Removal rank [B, H*W] of the pixels of the upsampled, min-max normalised maps."""
    relevance = torch.nan_to_num(minmax(upsample(maps, images.shape[-2:])), nan=0.0)
    return removal_rank(relevance, most_relevant_first)


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def mixed_logits(forward: Callable[[Tensor], Tensor], first: Tensor, second: Tensor, rank: Tensor, counts: Tensor,
                 batch_size: int) -> Tensor:
    """Logits of every (image, step) mix, [B, S, classes].

    Args:
        forward: images -> logits, batched (e.g. :meth:`~vitexplain.instrumentation.ModelAdapter.logits`);
            called without gradients.
        first, second: sources [B or 1, C or 1, H or 1, W or 1] (a source with batch 1 is shared by
            every image; one of them has the full H x W).
        rank: removal rank of every pixel [B, H*W] (see ``_common.removal_rank``).
        counts: number of pixels taken from ``second`` at each step [S] (long).
        batch_size: images per forward.
    """
    check_batch_size(batch_size)
    batch, steps = rank.shape[0], counts.shape[0]
    height, width = torch.broadcast_shapes(first.shape[-2:], second.shape[-2:])
    counts = counts.to(rank.device)
    outputs = []
    with torch.no_grad():
        for start in range(0, batch * steps, batch_size):
            flat = torch.arange(start, min(start + batch_size, batch * steps), device=rank.device)
            image, step = flat // steps, flat % steps
            taken = (rank[image] < counts[step, None]).view(-1, 1, height, width)
            mixed = torch.where(taken, _rows(second, image), _rows(first, image))
            outputs.append(forward(mixed))
    return torch.cat(outputs).view(batch, steps, -1)


def _rows(source: Tensor, image: Tensor) -> Tensor:
    return source if source.shape[0] == 1 else source[image]
