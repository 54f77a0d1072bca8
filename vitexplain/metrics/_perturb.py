"""Batched forwards of perturbed images, shared by the pixel-removal protocols (perturbation, AOPC,
insertion / deletion, ROAD, SaCo).

Every perturbed image mixes two sources pixel-wise: the pixels whose removal rank lies in the step's
range (below its count, and from its start on) come from ``second``, the others from ``first``. The
images of all steps of all images are built chunk by chunk with one ``torch.where`` each and go
through the model in chunks of ``batch_size``: no per-step Python work beyond the chunking.

Given a :class:`SharedForwards` as its forward (what the bench's scoring of one batch and :func:`vitexplain.evaluate`
hand the protocols as :attr:`EvalBatch.logits`, kept on their call), :func:`mixed_logits` forwards an image once
however many protocols ask for it: a step that takes nothing is its first source, a step that
takes every pixel is its second, and a call that repeats an earlier one (AOPC's removal is the perturbation
test's positive one) returns the earlier logits. Sameness is decided by exact equality of the sources, ranks
and steps, never by a fingerprint. The steps are kept and sorted on the CPU, so sharing asks the device
nothing but the equality of sources and ranks. A protocol that changes the
model's weights for a while must not score perturbed images while they are changed (none does: smooth /
efficient MPRT and numerical stability only explain the changed model).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


def removal_counts(pixels: int, steps: int) -> Tensor:
    """``int(pixels * k / steps)`` for k = 0 ... steps - 1, the pixel counts of Chefer et al.'s steps (on the CPU,
    as :func:`mixed_logits` keeps them)."""
    return torch.tensor([int(pixels * (k / steps)) for k in range(steps)])


def ranked_by_relevance(maps: Tensor, images: Tensor, most_relevant_first: bool) -> Tensor:
    """Removal rank [B, H*W] of the pixels of the upsampled, min-max normalised maps."""
    relevance = min_max(resize(maps, images.shape[-2:]), constant=0.0)
    return removal_rank(relevance, most_relevant_first)


def mixed_logits(forward: Callable[[Tensor], Tensor], first: Tensor, second: Tensor | Replacement, rank: Tensor,
                 counts: Tensor, batch_size: int, starts: Tensor | None = None) -> Tensor:
    """Logits of every (image, step) mix, [B, S, classes].

    Args:
        forward: images -> logits, batched (e.g. :meth:`~vitexplain.instrumentation.ModelAdapter.logits`);
            called without gradients. A :class:`SharedForwards` forwards each distinct image once.
        first, second: sources [B or 1, C or 1, H or 1, W or 1] (a source with batch 1 is shared by
            every image; one of them has the full H x W); ``second`` may instead be a function that makes
            it for a chunk, (image index [n], taken [n, 1, H, W]) -> [n, C, H, W], when the replacement
            depends on what is taken (ROAD imputes it from the pixels left); ``first`` then has the full H x W.
        rank: removal rank of every pixel [B, H*W] (see ``_common.removal_rank``).
        counts: at each step, pixels of rank below it are taken from ``second`` [S] (long).
        batch_size: images per forward.
        starts: at each step, pixels of rank below it stay from ``first`` [S] (long; default none): a
            step replaces the ranks in [start, count), one group of pixels (SaCo) instead of the top ones.

        ``counts`` and ``starts`` are kept on the CPU (given there, they cost no wait for the device).
    """
    counts = counts.cpu()
    starts = torch.zeros_like(counts) if starts is None else starts.cpu()
    if isinstance(forward, SharedForwards):
        return forward.logits(_Mix(forward.forward, first, second, rank, counts, starts, batch_size))
    return _Mix(forward, first, second, rank, counts, starts, batch_size).logits(torch.arange(counts.shape[0]))


@dataclass(frozen=True, eq=False)
class _Mix:
    """One call of :func:`mixed_logits`."""

    forward: Callable[[Tensor], Tensor]
    first: Tensor
    second: Tensor | Replacement
    rank: Tensor
    counts: Tensor      # on the CPU, as starts
    starts: Tensor
    batch_size: int

    @property
    def dtype(self) -> torch.dtype:
        """The mixed images' dtype (``torch.where``'s promotion of the two sources)."""
        return self.first.dtype if callable(self.second) else torch.promote_types(self.first.dtype, self.second.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of one mixed image, (C, H, W)."""
        sources = (self.first,) if callable(self.second) else (self.first, self.second)
        return tuple(torch.broadcast_shapes(*(source.shape[1:] for source in sources)))

    def logits(self, steps: Tensor) -> Tensor:
        """Logits of the mixes of every image at ``steps`` (CPU indices into counts / starts) [B, len(steps),
        classes]."""
        height, width = self.shape[-2:]
        batch, chosen = self.rank.shape[0], steps.shape[0]
        counts, starts = self.counts[steps].to(self.rank.device), self.starts[steps].to(self.rank.device)
        outputs = []
        with torch.no_grad():
            for begin in range(0, batch * chosen, self.batch_size):
                flat = torch.arange(begin, min(begin + self.batch_size, batch * chosen), device=self.rank.device)
                image, step = flat // chosen, flat % chosen
                ranks = self.rank[image]
                taken = ((ranks < counts[step, None]) & (ranks >= starts[step, None])).view(-1, 1, height, width)
                replacement = self.second(image, taken) if callable(self.second) else _rows(self.second, image)
                outputs.append(self.forward(torch.where(taken, replacement, _rows(self.first, image))))
        return torch.cat(outputs).view(batch, chosen, -1)

    def repeats(self, other: _Mix) -> bool:
        """Whether ``other`` makes exactly the same images with the same forward (the steps compared first, on
        the CPU, so that most calls differ without a wait for the device)."""
        return (self.forward == other.forward and not callable(self.second) and not callable(other.second)
                and _same(self.counts, other.counts) and _same(self.starts, other.starts)
                and _same(self.first, other.first) and _same(self.second, other.second)
                and _same(self.rank, other.rank))


@dataclass(eq=False)
class SharedForwards:
    """``forward`` (images -> logits), through which :func:`mixed_logits` forwards each distinct image once (see
    the module docstring); called, it is ``forward``.

    For one batch of images: what it keeps (each source's logits, each earlier call's) goes with it."""

    forward: Callable[[Tensor], Tensor]
    sources: list[tuple[Callable[[Tensor], Tensor], Tensor, Tensor]] = field(default_factory=list)
    calls: list[tuple[_Mix, Tensor]] = field(default_factory=list)

    def __call__(self, images: Tensor) -> Tensor:
        return self.forward(images)

    def logits(self, mix: _Mix) -> Tensor:
        for earlier, logits in self.calls:
            if earlier.repeats(mix):
                return logits
        counts, starts = mix.counts, mix.starts         # which steps are which, decided on the CPU
        untouched = counts <= starts                    # the step takes nothing: the first source
        height, width = mix.shape[-2:]
        whole = (starts <= 0) & (counts >= height * width)   # the step takes every pixel: the second source
        if callable(mix.second):
            whole = torch.zeros_like(untouched)
        rest = (~(untouched | whole)).nonzero()[:, 0]
        parts = [(rest, mix.logits(rest))] if rest.numel() else []
        for where, source in ((untouched, mix.first), (whole, mix.second)):
            if where.any():
                found = self.source_logits(mix, source)
                parts.append((where.nonzero()[:, 0], found[:, None].expand(-1, int(where.sum()), -1)))
        batch, classes = mix.rank.shape[0], parts[0][1].shape[-1]
        logits = parts[0][1].new_empty(batch, mix.counts.shape[0], classes)
        for steps, values in parts:
            logits[:, steps.to(logits.device)] = values
        self.calls.append((mix, logits))
        return logits

    def source_logits(self, mix: _Mix, source: Tensor) -> Tensor:
        """The logits of each of ``source``'s images as a whole mix [B or 1, classes], forwarded once per batch."""
        for forward, known, logits in self.sources:
            if forward == mix.forward and _same(known, source):
                return logits
        with torch.no_grad():
            logits = torch.cat([mix.forward(source[begin:begin + mix.batch_size].expand(-1, *mix.shape)
                                            .to(mix.dtype).contiguous())
                                for begin in range(0, source.shape[0], mix.batch_size)])
        self.sources.append((mix.forward, source, logits))
        return logits


def _same(a: Tensor, b: Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))


def _rows(source: Tensor, image: Tensor) -> Tensor:
    return source if source.shape[0] == 1 else source[image]
