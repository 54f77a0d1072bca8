"""Windowed attention of hierarchical models (Swin), on top of :mod:`.attention`, and the geometry of their stages.

A Swin block attends within windows: its token grid is cyclically shifted (every other block), padded to
a multiple of the window, cut into windows, and each window attends to itself — with a relative position
bias and, where the shift wraps regions of the image together, an additive mask that keeps them apart.
:class:`Windows` (a family's description of one block's windows) runs the one written-out attention
(:func:`~.attention.attend`) on the batch of windows, so recording, every LRP rule set and plain forwards
all compute it the same way. The partition is a gather of the tokens into window slots
(:class:`WindowLayout`), exactly the module's roll, pad and cut; its reverse gathers them back.

What a windowed block records: ``attn`` / ``attn_logits`` per window, [B, H, windows, T, T] (T tokens per
window), and q / k / v in token order [B, H, N, D]; :class:`WindowLayout` maps window slots to tokens.
Token-by-token products read such an attention as a block-diagonal matrix (:class:`WindowedMatrix`),
never building the N×N matrix.

Stages: between stages, patch merging turns each 2×2 group of tokens into one token, so each stage has
its own token grid (first stage first: :func:`stage_grids`). Values over a later stage's tokens come back
to an earlier stage's grid by :func:`to_tokens`: each merged token's value is shared equally among its
real inputs (relevance and products: :func:`spread`), or copied to each of them (features). Maps are
returned on the first stage's grid (docs/decisions/families.md, "Hierarchical models").
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
from torch import Tensor

from .attention import (
    NOTHING,
    PLAIN,
    Arithmetic,
    AttentionInput,
    AttentionParts,
    Sink,
    attend,
)

Grid = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class WindowLayout:
    """How one windowed block's tokens sit in its windows, for one token grid.

    Attributes:
        grid: the block's token grid (h, w).
        window: window size (wh, ww).
        shift: cyclic shift (sh, sw) applied before the partition (0 for unshifted blocks).
        slots: [windows, T] the token (row-major index on ``grid``) in each window slot, -1 at padding.
        mask: the additive attention mask of the windows [windows, T, T] (shifted blocks), or None.
    """

    grid: Grid
    window: Grid
    shift: Grid
    slots: Tensor
    mask: Tensor | None = None
    #: [N] the slot (index over windows × T) holding each token
    token_slots: Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        flat = self.slots.flatten()
        real = flat >= 0
        where = torch.empty(self.tokens, dtype=torch.long, device=flat.device)
        where[flat[real]] = torch.arange(flat.numel(), device=flat.device)[real]
        object.__setattr__(self, "token_slots", where)

    @classmethod
    def build(cls, grid: Grid, window: Grid, shift: Grid, device: torch.device | None = None) -> WindowLayout:
        """The layout of a grid rolled by -``shift``, padded at the bottom / right to whole windows and cut."""
        height, width = grid
        rows = math.ceil(height / window[0]) * window[0]
        cols = math.ceil(width / window[1]) * window[1]
        i = torch.arange(rows, device=device)[:, None]
        j = torch.arange(cols, device=device)[None, :]
        tokens = ((i + shift[0]) % height) * width + (j + shift[1]) % width
        tokens = torch.where((i < height) & (j < width), tokens, -1)
        slots = tokens.reshape(rows // window[0], window[0], cols // window[1], window[1]).permute(0, 2, 1, 3)
        return cls(tuple(grid), tuple(window), tuple(shift), slots.reshape(-1, window[0] * window[1]))

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_windows(self) -> int:
        return self.slots.shape[0]

    @property
    def window_tokens(self) -> int:
        return self.slots.shape[1]

    @property
    def padding(self) -> bool:
        """Whether the windows hold padding slots (the grid is not a multiple of the window)."""
        return self.slots.numel() > self.tokens

    @property
    def padded_grid(self) -> Grid:
        return tuple(math.ceil(size / window) * window for size, window in zip(self.grid, self.window))

    @property
    def connected(self) -> Tensor:
        """[windows, T, T] True where a query slot attends a key slot (same window, not masked apart)."""
        if self.mask is None:
            return torch.ones(self.num_windows, self.window_tokens, self.window_tokens, dtype=torch.bool,
                              device=self.slots.device)
        return self.mask == 0

    # -- tokens <-> window slots ------------------------------------------------------------------
    def windows_of(self, values: Tensor, dim: int = -1) -> Tensor:
        """Per-token values (tokens along ``dim``) in window slots: that axis becomes [windows, T]; 0 at padding."""
        dim = dim % values.ndim
        if self.padding:
            values = torch.cat([values, values.new_zeros(*values.shape[:dim], 1, *values.shape[dim + 1:])], dim)
        index = torch.where(self.slots >= 0, self.slots, self.tokens).flatten()  # padding: the zero appended
        return values.index_select(dim, index).unflatten(dim, self.slots.shape)

    def tokens_of(self, values: Tensor, dim: int = -2) -> Tensor:
        """Per-slot values (windows at ``dim``, slots at ``dim`` + 1) -> per-token values along ``dim``."""
        dim = dim % values.ndim
        return values.flatten(dim, dim + 1).index_select(dim, self.token_slots)

    def partition(self, x: Tensor) -> Tensor:
        """Tokens [B, N, C] -> windows [B·windows, T, C] (padding slots zero)."""
        return self.windows_of(x, dim=1).flatten(0, 1)

    def reverse(self, windows: Tensor, batch: int) -> Tensor:
        """Windows [B·windows, T, C] -> tokens [B, N, C] (padding slots dropped)."""
        return self.tokens_of(windows.unflatten(0, (batch, self.num_windows)), dim=1)

    # -- what a windowed block records ------------------------------------------------------------
    def recorded(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Recorded tensors of the window batch in the recording's layout: ``attn`` / ``attn_logits``
        [B·windows, H, T, T] -> [B, H, windows, T, T]; ``q`` / ``k`` / ``v`` [B·windows, H, T, D] -> [B, H, N, D]."""
        found = dict(tensors)
        for name, tensor in tensors.items():
            if name in ("attn", "attn_logits"):
                found[name] = tensor.unflatten(0, (-1, self.num_windows)).transpose(1, 2)
            elif name in ("q", "k", "v"):
                per_window = tensor.unflatten(0, (-1, self.num_windows)).transpose(1, 2)  # [B, H, windows, T, D]
                found[name] = self.tokens_of(per_window, dim=2)
        return found


@dataclass(frozen=True)
class Windows:
    """A family's description of one block's windowed attention.

    Attributes:
        window: window size (wh, ww) as the block uses it.
        shift: the block's cyclic shift (sh, sw); (0, 0) for unshifted blocks.
        mask: ``(padded grid, device, dtype) -> [windows, T, T]`` the block's own additive shift mask, or None.
    """

    window: Grid
    shift: Grid
    mask: Callable[[Grid, torch.device, torch.dtype], Tensor | None] = lambda padded, device, dtype: None

    def layout(self, grid: Grid, device: torch.device, dtype: torch.dtype) -> WindowLayout:
        """The layout of a token grid (h, w), with the block's mask for it."""
        plain = WindowLayout.build(grid, self.window, self.shift, device=device)
        mask = self.mask(plain.padded_grid, device, dtype) if any(self.shift) else None
        return plain if mask is None else replace(plain, mask=mask)

    def attend(self, parts: AttentionParts, x: Tensor, extra: AttentionInput, *, arithmetic: Arithmetic = PLAIN,
               sink: Sink = NOTHING, block: int = -1) -> Tensor:
        """The windowed attention's output for tokens ``x`` [B, N, C] on the grid ``extra.grid``, as the
        module computes it: the window batch through :func:`~.attention.attend`, the shift mask added."""
        layout = self.layout(extra.grid, x.device, x.dtype)
        sink.layout(block, layout)
        mask = None if layout.mask is None else layout.mask.repeat(x.shape[0], 1, 1)[:, None]
        out = attend(parts, layout.partition(x), replace(extra, mask=mask, grid=None), arithmetic=arithmetic,
                     sink=sink, block=block)
        return layout.reverse(out, x.shape[0])


class WindowedMatrix:
    """A token-by-token matrix that is block-diagonal over a block's windows, for the token products.

    ``matrix`` is [B, ..., windows, T, T] (a windowed attention, fused or per head); the N×N matrix it
    stands for, over the token slots (padding slots are not tokens), is never built.
    """

    def __init__(self, matrix: Tensor, layout: WindowLayout):
        self.matrix, self.layout = matrix, layout

    @property
    def tokens(self) -> int:
        return self.layout.tokens

    @property
    def dtype(self) -> torch.dtype:
        return self.matrix.dtype

    def rows(self, rows: Tensor) -> Tensor:
        """rows [B, N] times the matrix -> [B, ..., N]."""
        windowed = self.layout.windows_of(rows.to(self.dtype))  # [B, windows, T]
        windowed = windowed.reshape(rows.shape[0], *(1,) * (self.matrix.ndim - 4), *windowed.shape[1:])
        return self.layout.tokens_of(torch.matmul(windowed.unsqueeze(-2), self.matrix)[..., 0, :])

    def left(self, rows: Tensor, *, residual: bool, normalise: bool) -> Tensor:
        """rows [B, R, N] times the matrix [B, windows, T, T] (plus the identity; rows normalised as
        :func:`~vitexplain.methods._products.push_rows` does, over the token columns)."""
        if normalise:
            sums = self.layout.tokens_of((self.matrix * (self.layout.slots >= 0).to(self.dtype)[:, None, :]).sum(-1))
            rows = rows / (sums + (1 if residual else 0))[:, None]
        mixed = self.layout.tokens_of(torch.einsum("brwt,bwts->brws", self.layout.windows_of(rows), self.matrix))
        return rows + mixed if residual else mixed

    def right(self, columns: Tensor, *, residual: bool) -> Tensor:
        """The matrix [B, windows, T, T] (plus the identity) times columns [B, N, R]."""
        windowed = self.layout.windows_of(columns, dim=1)  # [B, windows, T, R]
        mixed = self.layout.tokens_of(torch.matmul(self.matrix, windowed), dim=1)
        return columns + mixed if residual else mixed


def mixing(layout: WindowLayout | None, matrix: Tensor) -> Tensor | WindowedMatrix:
    """A block's token-by-token matrix as a factor of the products: the matrix itself for global
    attention, or its windows with their layout."""
    return matrix if layout is None else WindowedMatrix(matrix, layout)


def tokens_in(layer: Any) -> int:
    """The number of tokens a product factor acts on (a matrix [B, N, N], a diagonal [B, N] or a windowed one)."""
    return layer.shape[-1] if isinstance(layer, Tensor) else layer.tokens


def mix_rows(rows: Tensor, matrix: Tensor | WindowedMatrix) -> Tensor:
    """Row vectors [B, N] times token-by-token matrices [B, ..., N, N] (or windowed ones) -> [B, ..., N]."""
    if not isinstance(matrix, Tensor):
        return matrix.rows(rows)
    shape = (rows.shape[0],) + (1,) * (matrix.ndim - 3) + (1, rows.shape[-1])
    return torch.matmul(rows.to(matrix.dtype).reshape(shape), matrix)[..., 0, :]


# -- stages -----------------------------------------------------------------------------------------
def stage_grids(layouts: Sequence[WindowLayout | None], grid: Grid) -> tuple[Grid, ...]:
    """The token grids of a model's stages, first first, from its blocks' layouts (one stage, ``grid``,
    for a model without windows)."""
    found = tuple(dict.fromkeys(layout.grid for layout in layouts if layout is not None))
    return found or (tuple(grid),)


def merged(grid: Grid) -> Grid:
    """The grid after patch merging (2×2 groups, odd sizes padded)."""
    return tuple((size + 1) // 2 for size in grid)


def spread(values: Tensor, fine: Grid, *, dim: int = -1, share: bool = True) -> Tensor:
    """Values over merged tokens (along ``dim``, on ``merged(fine)``) -> over their inputs on ``fine``.

    ``share``: each merged token's value is shared equally among its real 2×2 inputs (padding takes none),
    so totals are kept; else it is copied to each input (nearest upsampling, for features).
    """
    coarse = merged(fine)
    values = values.movedim(dim, -1)
    if share:
        counts = [torch.clamp(size - 2 * torch.arange(half, device=values.device), max=2)
                  for size, half in zip(fine, coarse)]
        values = values / (counts[0][:, None] * counts[1][None, :]).flatten().to(values.dtype)
    grid = values.unflatten(-1, coarse).repeat_interleave(2, -2).repeat_interleave(2, -1)
    return grid[..., :fine[0], :fine[1]].flatten(-2).movedim(-1, dim)


def to_tokens(values: Tensor, count: int, stages: Sequence[Grid], *, dim: int = -1, share: bool = True) -> Tensor:
    """Values over one stage's tokens (along ``dim``) brought to the stage with ``count`` tokens, an
    earlier one, through the patch merges between them (:func:`spread`); unchanged when already there."""
    counts = [math.prod(grid) for grid in stages]
    size = values.shape[dim]
    while size != count:
        if size not in counts[1:] or count not in counts[:counts.index(size)]:
            raise ValueError(f"cannot bring values over {size} tokens to {count} tokens: the stages have "
                             f"{counts} tokens")
        stage = counts.index(size)
        values = spread(values, stages[stage - 1], dim=dim, share=share)
        size = counts[stage - 1]
    return values


__all__ = ["Grid", "WindowLayout", "WindowedMatrix", "Windows", "merged", "mix_rows", "mixing", "spread",
           "stage_grids", "to_tokens", "tokens_in"]
