"""Products of per-block token-mixing matrices, read at the readout row: the one helper of rollout-style methods.

Rollout, GAE, transformer attribution, TokenTM, GradToken, TAM and Beyond Intuition each multiply
one matrix per block (attention, gradient-weighted attention, relevance …, usually plus the identity
of the skip connection) and read one row of the product: the class token's, or more generally the
readout's (:class:`~vitexplain.instrumentation.Readout`). Pushing that row down through the blocks
costs O(N²) per block instead of the O(N³) of forming the product, and never builds an N×N product.

A layer is a token-by-token matrix [B, N, N], a diagonal given as its vector [B, N], or a block's
windowed attention (:meth:`~vitexplain.instrumentation.BlockRecord.mixing`: ``left(rows)`` /
``right(columns)``). On a hierarchical model (Swin) the layers of later stages act on fewer tokens:
between stages the vectors cross the patch merges, each merged token shared equally among its 2×2
inputs (``stages``; docs/decisions/families.md, "Hierarchical models").
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..instrumentation import TokenGeometry
from ..instrumentation.windows import Grid, to_tokens, tokens_in


def _left(rows: Tensor, layer: Any, residual: bool, normalise: bool) -> Tensor:
    """rows [B, R, N] times one layer (plus the identity when ``residual``; rows normalised when ``normalise``)."""
    if not isinstance(layer, Tensor):
        return layer.left(rows, residual=residual, normalise=normalise)
    if layer.ndim == 2:  # a diagonal
        return rows * (layer[:, None] + 1 if residual else layer[:, None])
    if normalise:
        rows = rows / (layer.sum(-1) + (1 if residual else 0))[:, None]
    mixed = torch.matmul(rows, layer)
    return rows + mixed if residual else mixed


def _right(columns: Tensor, layer: Any, residual: bool) -> Tensor:
    """One layer (plus the identity when ``residual``) times columns [B, N, R]."""
    if not isinstance(layer, Tensor):
        return layer.right(columns, residual=residual)
    if layer.ndim == 2:
        return columns * (layer[:, :, None] + 1 if residual else layer[:, :, None])
    mixed = torch.matmul(layer, columns)
    return columns + mixed if residual else mixed


def push_rows(rows: Tensor, layers: Sequence[Any], *, residual: bool = True, normalise: bool = False,
              stages: Sequence[Grid] = ()) -> Tensor:
    """Row vectors through the product of per-block layers given in block order: rows (L_last ⋯ L_first).

    Args:
        rows: [B, N] or [B, R, N] row vectors (e.g. the readout weights, or one per head).
        layers: per-block matrices M_b (first block first); each factor is I + M_b with ``residual``, else M_b.
        normalise: each factor is row-normalised, (M_b + I) / rowsum (attention rollout).
        stages: a hierarchical model's stage grids (``record.geometry.stages``), for the patch merges between
            layers of different stages.

    Returns:
        rows · L_last ⋯ L_first, shaped as ``rows`` but over the first layer's tokens.
    """
    single = rows.ndim == 2
    rows = rows[:, None] if single else rows
    for layer in reversed(layers):
        rows = _pushed(rows, layer, residual, normalise, stages)
    return rows[:, 0] if single else rows


def _pushed(rows: Tensor, layer: Any, residual: bool, normalise: bool, stages: Sequence[Grid]) -> Tensor:
    """rows [B, R, N'] (over a later stage's tokens, or the layer's) brought to the layer's tokens and times it."""
    return _left(to_tokens(rows, tokens_in(layer), stages), layer, residual, normalise)


def push_columns(columns: Tensor, layers: Sequence[Any], *, residual: bool = True,
                 stages: Sequence[Grid] = ()) -> Tensor:
    """The product of per-block layers (first block first) times column vectors: (L_first ⋯ L_last) · columns.

    ``columns`` [B, N] or [B, N, R]; each factor is I + M_b with ``residual``, else M_b; ``stages`` as
    for :func:`push_rows` (a merge's transpose shares a merged token's column among its inputs).
    """
    single = columns.ndim == 2
    columns = columns[..., None] if single else columns
    for layer in reversed(layers):
        columns = _right(to_tokens(columns, tokens_in(layer), stages, dim=-2), layer, residual)
    return columns[..., 0] if single else columns


def readout_map(geometry: TokenGeometry, layers: Sequence[Any], *, residual: bool = True,
                normalise: bool = False) -> Tensor:
    """The readout's row of the product of per-block layers, over the patch tokens on the grid [B, h, w].

    For a class-token model this is the class token's row of L_last ⋯ L_first (Chefer et al.'s and
    Abnar & Zuidema's read-out); for pooled readouts the readout weights' row. ``geometry``: the
    recording's or the relevance's (:class:`~vitexplain.instrumentation.TokenGeometry`).
    """
    rows = push_rows(geometry.readout_weights(layers[-1]), layers, residual=residual, normalise=normalise,
                     stages=geometry.stages)
    return geometry.patch_map(rows)


class ReadoutFold:
    """:func:`readout_map`'s row pushed through the layers one at a time, the last block's first, as a
    backward visits the blocks: a reduction for ``record(reduce=)`` that keeps one row [B, N] instead of
    every block's layer.

    ``fold(geometry, block, layer)`` takes block ``block``'s layer, for each of ``blocks`` (the readout's weights
    start the row at the last); :meth:`map` is then ``readout_map(geometry, layers)`` — the same operations in
    the same order, so the same numbers. The blocks must come last first, each once (the order in which a backward
    reaches them: each block's attention waits for the gradient of the block above).
    """

    def __init__(self, blocks: range, *, residual: bool = True, normalise: bool = False):
        self.residual, self.normalise = residual, normalise
        self.first, self.next_block = blocks.start, blocks.stop - 1
        self.rows: Tensor | None = None

    def __call__(self, geometry: TokenGeometry, block: int, layer: Any) -> None:
        if block != self.next_block:
            raise RuntimeError(f"the readout row is folded from the last block down, but block {block} came when "
                               f"block {self.next_block} was due")
        rows = geometry.readout_weights(layer)[:, None] if self.rows is None else self.rows
        self.rows = _pushed(rows, layer, self.residual, self.normalise, geometry.stages)
        self.next_block -= 1

    def map(self, geometry: TokenGeometry) -> Tensor:
        """The readout's row of the whole product over the patch tokens on the grid [B, h, w]."""
        if self.next_block != self.first - 1:
            raise RuntimeError(f"the readout row was folded down to block {self.next_block + 1}, not to block "
                               f"{self.first}")
        return geometry.patch_map(self.rows[:, 0])
