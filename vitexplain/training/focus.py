"""The focus phase: for the first steps a model sees only a window of patch tokens around the digit."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from ..datasets.digits import CANVAS, Digits


def digit_windows(dataset: Digits, indices: Tensor, window: int, grid: int, generator: torch.Generator) -> Tensor:
    """Patch-token indices [B, window^2] (row-major in the ``grid`` x ``grid`` token grid) of a
    ``window`` x ``window`` block that holds every token the square of the canvas's digit touches,
    placed uniformly among the blocks that do, with ``generator``."""
    patch = CANVAS // grid
    corners = []
    for axis in ("y", "x"):
        start = dataset.layout[axis][indices, 0]
        first, last = start // patch, (start + dataset.layout["sizes"][indices, 0] - 1) // patch
        low, high = (last - window + 1).clamp(min=0), first.clamp(max=grid - window)
        corners.append(low + (torch.rand(len(indices), generator=generator) * (high - low + 1)).long())
    span = torch.arange(window)
    rows, cols = corners[0][:, None] + span, corners[1][:, None] + span
    return (rows[:, :, None] * grid + cols[:, None, :]).flatten(1)



class _TokenWindow(nn.Module):
    """Stands in for a timm ViT's ``patch_drop`` (applied right after the position embedding): keeps
    the prefix tokens and, of the patch tokens, those listed in ``keep`` [B, K] (all when None)."""

    def __init__(self, prefix: int):
        super().__init__()
        self.prefix = prefix
        self.keep: Tensor | None = None

    def forward(self, tokens: Tensor) -> Tensor:
        if self.keep is None:
            return tokens
        patches = tokens[:, self.prefix:].gather(1, self.keep[:, :, None].expand(-1, -1, tokens.shape[-1]))
        return torch.cat([tokens[:, :self.prefix], patches], 1)


@contextlib.contextmanager
def focused(models: list[nn.Module]) -> Iterator[Callable[[Tensor | None], None]]:
    """Inside the block the timm ViTs ``models`` see only the patch tokens last given to the yielded
    function (indices [B, K], or None for all); their own ``patch_drop`` is put back on exit."""
    saved = [model.patch_drop for model in models]
    windows = [_TokenWindow(model.num_prefix_tokens) for model in models]
    for model, window in zip(models, windows):
        model.patch_drop = window

    def keep(indices: Tensor | None) -> None:
        for window in windows:
            window.keep = indices

    try:
        yield keep
    finally:
        for model, original in zip(models, saved):
            model.patch_drop = original
