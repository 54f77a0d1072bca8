"""Where a batch's tokens sit: the one token geometry of recordings and of LRP relevance.

A Transformer's sequence is some prefix tokens (class, distillation, register) and then the patch
tokens of a grid (text: the tokens after the prefix); the model's output reads the last block's
tokens one way (:class:`Readout`); a hierarchical model (Swin) has stages of coarser grids, with
windowed attention laid out per block. Both a :class:`~.recording.Recording` and a
:class:`~.lrp.Relevance` hold one :class:`TokenGeometry` (``geometry``), built by the adapter from the
model's family (:meth:`~.adapter.ModelAdapter.token_geometry`), and every method reads maps, readout
rows and block matrices through it: one ``patch_map``, one ``readout_row``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from .windows import (
    Grid,
    WindowedMatrix,
    WindowLayout,
    mix_rows,
    mixing,
    to_tokens,
    tokens_in,
)


@dataclass
class Readout:
    """How the model's output reads the last block's tokens.

    Attributes:
        kind: ``token`` (a class token's output), ``avg`` (the mean of the patch tokens), ``token_avg`` (the
            class token concatenated with the patch tokens' mean, DINOv2's linear probe), ``avgmax`` (half the
            mean plus half the per-channel maximum of the patch tokens, timm's ``global_pool='avgmax'``), ``max``
            (the per-channel maximum) or ``map`` (an attention-pooling probe, SigLIP-style: a learnt query
            attending to every token).
        weights: what the readout takes from each token [B, N]: one-hot at the class token; 1 / patches
            on each patch token; half of each of those; half the mean's weights plus half the maximum's
            selection averaged over the channels (docs/decisions/readouts.md); that selection alone; the
            probe's attention averaged over its heads.
    """

    kind: Literal["token", "avg", "token_avg", "avgmax", "max", "map"]
    weights: Tensor


@dataclass
class TokenGeometry:
    """The token layout of one batch through one model.

    Attributes:
        grid: patch grid (h, w) of this batch ((T,) for text); for a hierarchical model, its first stage's
            token grid, which every map is returned on.
        num_prefix_tokens: number of non-patch tokens at the start of the sequence.
        class_token_index: position of the class token, or None for models without one.
        readout: how the output reads the last block's tokens.
        stages: the token grids of a hierarchical model's stages, first first (``(grid,)`` otherwise).
        layouts: each block's window layout (None for global attention); empty when not known.
        token_mask: for text, True at real tokens [B, T]; maps are then zero at padding and at the prefix.
    """

    grid: Grid
    num_prefix_tokens: int
    class_token_index: int | None
    readout: Readout
    stages: tuple[Grid, ...] = ()
    layouts: Sequence[WindowLayout | None] = field(default_factory=list)
    token_mask: Tensor | None = None

    def __post_init__(self) -> None:
        self.grid = tuple(self.grid)
        self.stages = self.stages or (self.grid,)

    def patch_grid(self, per_patch: Tensor) -> Tensor:
        """Per-patch values [..., patches] (the tokens after the prefix, of any stage) on the first stage's
        grid [..., h, w]; for text [B, T - prefix] -> [B, T], the prefix and padding 0.

        Values over a later stage's tokens of a hierarchical model come to the first stage's grid through
        the patch merges, each merged token's value shared equally among its inputs.
        """
        if self.token_mask is not None:
            prefix = per_patch.new_zeros(*per_patch.shape[:-1], self.num_prefix_tokens)
            return torch.cat([prefix, per_patch], -1).masked_fill(~self.token_mask, 0)
        per_patch = to_tokens(per_patch, math.prod(self.grid), self.stages)
        return per_patch.reshape(*per_patch.shape[:-1], *self.grid)

    def patch_map(self, per_token: Tensor) -> Tensor:
        """Per-token values over the whole sequence [..., N] (of any stage): the patch tokens' on the grid
        (:meth:`patch_grid`), the prefix dropped."""
        return self.patch_grid(per_token[..., self.num_prefix_tokens:])

    def grid_of(self, patches: int) -> Grid:
        """The grid of the stage with ``patches`` patch tokens."""
        return next(grid for grid in self.stages if math.prod(grid) == patches)

    def mixing(self, block: int, matrix: Tensor) -> Tensor | WindowedMatrix:
        """Block ``block``'s token-by-token matrix ([B, ..., N, N], or per window) as a factor of the token
        products (``methods/_products.py``): windowed, with its layout."""
        return mixing(self.layouts[block] if self.layouts else None, matrix)

    def readout_weights(self, like: Tensor | WindowedMatrix | None = None) -> Tensor:
        """The readout weights [B, N] (in the dtype of ``like``, when given)."""
        weights = self.readout.weights
        return weights if like is None else weights.to(like.dtype)

    def readout_rows(self, matrices: Tensor | WindowedMatrix) -> Tensor:
        """The readout's row of token-by-token matrices [B, ..., N, N] (or a block's windowed ones) ->
        [B, ..., N]; the readout weights reach an earlier stage's block through the patch merges."""
        if self.readout.kind == "token" and isinstance(matrices, Tensor):
            return matrices[..., self.class_token_index, :]
        weights = to_tokens(self.readout.weights, tokens_in(matrices), self.stages)
        return mix_rows(weights, matrices)

    def readout_row(self, matrix: Tensor | WindowedMatrix) -> Tensor:
        """The readout's row of a token-by-token matrix [B, N, N] (or a block's windowed one) over the
        patch tokens -> [B, h, w].

        For a class-token model, the class token's row; for average pooling, the mean of the patch
        tokens' rows; for an attention-pooling probe, the rows weighted by the probe's attention.
        """
        return self.patch_map(self.readout_rows(matrix))


__all__ = ["Readout", "TokenGeometry"]
