"""Batched forwards of perturbed images, shared by the pixel-removal protocols (perturbation, AOPC,
insertion / deletion, ROAD, SaCo).

Every perturbed image mixes two sources pixel-wise: the pixels whose removal rank lies in the step's
range (below its count, and from its start on) come from ``second``, the others from ``first``. The
images of all steps of all images are built chunk by chunk with one ``torch.where`` each and go
through the model in chunks of ``batch_size``: no per-step Python work beyond the chunking.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..maps import min_max, resize
from ._common import removal_rank

#: makes the replacement of a chunk of (image, step) mixes: (image index [n], taken [n, 1, H, W]) -> [n, C, H, W]
Replacement = Callable[[Tensor, Tensor], Tensor]


def normalisation(images: Tensor, pixel_mean: Sequence[float] | None,
                  pixel_std: Sequence[float] | None) -> tuple[Tensor, Tensor]:
    """The per-channel mean and std the images were preprocessed with, each [1, C, 1, 1].

    ``pixel_mean`` / ``pixel_std`` have one value per channel (:attr:`vitexplain.metrics.EvalBatch.mean`
    / ``std`` in the bench); a protocol that works in pixel units refuses to guess them.
    """
    if pixel_mean is None or pixel_std is None:
        raise ValueError("this protocol works in pixel units (black pixels, pixel noise) and needs the mean and std "
                         "the images were normalised with; the batch has none (EvalBatch.mean / std)")
    mean = torch.as_tensor(pixel_mean, dtype=images.dtype, device=images.device).flatten()
    std = torch.as_tensor(pixel_std, dtype=images.dtype, device=images.device).flatten()
    if mean.numel() != images.shape[1] or std.numel() != images.shape[1]:
        raise ValueError(f"pixel_mean and pixel_std need {images.shape[1]} values (one per channel), "
                         f"got {mean.numel()} and {std.numel()}")
    return mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)


def black_pixel(images: Tensor, pixel_mean: Sequence[float] | None, pixel_std: Sequence[float] | None) -> Tensor:
    """A black pixel (0 before normalisation) in the preprocessed space, [1, C, 1, 1]."""
    mean, std = normalisation(images, pixel_mean, pixel_std)
    return -mean / std


def removal_counts(pixels: int, steps: int, device: torch.device) -> Tensor:
    """``int(pixels * k / steps)`` for k = 0 ... steps - 1, the pixel counts of Chefer et al.'s steps."""
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"n_steps must be an integer >= 2, got {steps!r}")
    return torch.tensor([int(pixels * (k / steps)) for k in range(steps)], device=device)


def ranked_by_relevance(maps: Tensor, images: Tensor, most_relevant_first: bool) -> Tensor:
    """Removal rank [B, H*W] of the pixels of the upsampled, min-max normalised maps."""
    relevance = min_max(resize(maps, images.shape[-2:]), constant=0.0)
    return removal_rank(relevance, most_relevant_first)


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def mixed_logits(forward: Callable[[Tensor], Tensor], first: Tensor, second: Tensor | Replacement, rank: Tensor,
                 counts: Tensor, batch_size: int, starts: Tensor | None = None) -> Tensor:
    """Logits of every (image, step) mix, [B, S, classes].

    Args:
        forward: images -> logits, batched (e.g. :meth:`~vitexplain.instrumentation.ModelAdapter.logits`);
            called without gradients.
        first, second: sources [B or 1, C or 1, H or 1, W or 1] (a source with batch 1 is shared by
            every image; one of them has the full H x W); ``second`` may instead be a function that makes
            it for a chunk, (image index [n], taken [n, 1, H, W]) -> [n, C, H, W], when the replacement
            depends on what is taken (ROAD imputes it from the pixels left); ``first`` then has the full H x W.
        rank: removal rank of every pixel [B, H*W] (see ``_common.removal_rank``).
        counts: at each step, pixels of rank below it are taken from ``second`` [S] (long).
        batch_size: images per forward.
        starts: at each step, pixels of rank below it stay from ``first`` [S] (long; default none): a
            step replaces the ranks in [start, count), one group of pixels (SaCo) instead of the top ones.
    """
    check_batch_size(batch_size)
    batch, steps = rank.shape[0], counts.shape[0]
    sources = (first,) if callable(second) else (first, second)
    height, width = torch.broadcast_shapes(*(source.shape[-2:] for source in sources))
    counts = counts.to(rank.device)
    starts = torch.zeros_like(counts) if starts is None else starts.to(rank.device)
    outputs = []
    with torch.no_grad():
        for begin in range(0, batch * steps, batch_size):
            flat = torch.arange(begin, min(begin + batch_size, batch * steps), device=rank.device)
            image, step = flat // steps, flat % steps
            ranks = rank[image]
            taken = ((ranks < counts[step, None]) & (ranks >= starts[step, None])).view(-1, 1, height, width)
            replacement = second(image, taken) if callable(second) else _rows(second, image)
            outputs.append(forward(torch.where(taken, replacement, _rows(first, image))))
    return torch.cat(outputs).view(batch, steps, -1)


def _rows(source: Tensor, image: Tensor) -> Tensor:
    return source if source.shape[0] == 1 else source[image]
