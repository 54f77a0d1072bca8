"""Correlations of maps, image by image: Pearson's r and Spearman's rank correlation (ties at their average rank),
with the cases of constant maps decided (two constant maps agree, a constant and a varying map do not).

Public: the randomisation protocols (smooth MPRT, numerical stability), the faithfulness correlations and the bench's
model-randomisation check (:mod:`vitexplain.bench.randomisation`) compare maps with these. Spearman, "The proof and
measurement of association between two things", Am. J. Psychol. 1904; as ``scipy.stats.spearmanr`` (average ranks).
"""
from __future__ import annotations

import torch
from torch import Tensor


def average_ranks(values: Tensor) -> Tensor:
    """Rank of every value in its row, 0-based, ties given their average rank (float64) [B, n]."""
    values = values.contiguous()
    ordered = values.sort(dim=1).values
    below = torch.searchsorted(ordered, values, side="left")
    through = torch.searchsorted(ordered, values, side="right")
    return (below + through - 1).double() / 2


def pearson(first: Tensor, second: Tensor) -> Tensor:
    """Pearson correlation of each pair of maps [B, ...] -> [B] (float64).

    Two constant maps give 1 (nothing to tell apart), one constant map against a varying one gives 0.
    """
    if first.shape != second.shape:
        raise ValueError(f"maps to compare must have one shape, got {tuple(first.shape)} and {tuple(second.shape)}")
    centred = [m.flatten(1).double() - m.flatten(1).double().mean(1, keepdim=True) for m in (first, second)]
    spreads = [c.square().sum(1) for c in centred]
    covariance = (centred[0] * centred[1]).sum(1)
    both_vary = (spreads[0] > 0) & (spreads[1] > 0)
    correlation = covariance / torch.where(both_vary, spreads[0] * spreads[1], 1.0).sqrt()
    none_vary = (spreads[0] == 0) & (spreads[1] == 0)
    return torch.where(both_vary, correlation.clamp(-1, 1), none_vary.double())


def spearman(first: Tensor, second: Tensor, *, absolute: bool = False) -> Tensor:
    """Spearman rank correlation of each pair of maps [B, ...] -> [B]: Pearson of their average ranks.

    Two constant maps give 1 (identical rankings), one constant map against a varying one gives 0.
    """
    if first.shape != second.shape:
        raise ValueError(f"maps to compare must have one shape, got {tuple(first.shape)} and {tuple(second.shape)}")
    first, second = first.flatten(1), second.flatten(1)
    if absolute:
        first, second = first.abs(), second.abs()
    return pearson(average_ranks(first), average_ranks(second))


__all__ = ["average_ranks", "pearson", "spearman"]
