"""What the model-randomisation protocols share with the bench's sanity check: the cascade of levels, timm-style
re-initialisation, and Spearman rank correlation of maps.

Levels, top first (Adebayo et al., NeurIPS 2018, Sec. 3.1 "cascading randomization"): ``head`` (classifier
heads and the final norm), then ``block L-1`` ... ``block 0`` (one Transformer block more per level), then
``embedding`` (patch embedding, class / distillation / register tokens, position embedding): at the last level
no trained weight is left. Re-initialisation as timm initialises a ViT: matrices, tokens and position
embeddings from N(0, 0.02^2) (``trunc_normal_(std=0.02)``), biases 0, normalisation scales and layer-scale
gains 1, drawn from one ``torch.Generator`` level by level (:class:`Randomisation` re-draws levels 0 ... k
from the seed, so the model at level k depends on the seed and k only, and equals the cascade's).
Which parameters form a level is read from timm's parameter names (``blocks.<i>.``, ``head``, ``norm``,
``fc_norm``, ``attn_pool``). Decisions: docs/decisions/default-bench.md, docs/decisions/metrics-mprt.md.
"""
from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from ..seeding import seeded_draw

TOP_PREFIXES = ("head", "norm.", "fc_norm.", "attn_pool.")
INIT_STD = 0.02


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


def cascade_levels(model: nn.Module) -> list[tuple[str, list[str]]]:
    """The randomisation levels, top first: (level name, names of the parameters it re-initialises)."""
    blocks: dict[int, list[str]] = {}
    top, bottom = [], []
    for name, _ in model.named_parameters():
        found = re.match(r"blocks\.(\d+)\.", name)
        if found:
            blocks.setdefault(int(found[1]), []).append(name)
        elif name.startswith(TOP_PREFIXES):
            top.append(name)
        else:
            bottom.append(name)
    if not blocks:
        raise ValueError("model randomisation needs a timm Vision Transformer (parameters named "
                         f"blocks.<i>.*); this {type(model).__name__} has none")
    levels = [("head", top)] + [(f"block {i}", blocks[i]) for i in sorted(blocks, reverse=True)]
    return levels + [("embedding", bottom)]


def reinitialise(model: nn.Module, names: list[str], generator: torch.Generator) -> None:
    """Re-draw the named parameters as timm initialises a ViT (see the module docstring), in place."""
    parameters = dict(model.named_parameters())
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name in names:
            parameter = parameters[name]
            owner, _, leaf = name.rpartition(".")
            is_norm = "norm" in type(modules[owner]).__name__.lower()
            if parameter.ndim >= 2:
                value = nn.init.trunc_normal_(torch.empty(parameter.shape), std=INIT_STD, generator=generator)
            elif (is_norm and leaf == "weight") or leaf == "gamma":
                value = torch.ones(parameter.shape)
            else:
                value = torch.zeros(parameter.shape)
            parameter.copy_(value)


class Randomisation:
    """``change(model)`` for :attr:`EvalBatch.modified`: the cascade's levels 0 ... ``level`` (None: all of them,
    the fully random model) re-initialised from ``seed``, in place; the model of the cascade at that level,
    whatever was drawn before. After it ran, :attr:`levels` holds the names of the model's levels."""

    def __init__(self, level: int | None, seed: int):
        self.level, self.seed = level, seed
        self.levels: list[str] = []

    def __call__(self, model: nn.Module) -> None:
        levels = cascade_levels(model)
        self.levels = [name for name, _ in levels]

        def draw(generator: torch.Generator) -> Tensor:        # the draws of reinitialise, one generator throughout
            for _, names in levels[:None if self.level is None else self.level + 1]:
                reinitialise(model, names, generator)
            return torch.empty(0)

        seeded_draw(self.seed, draw)


def check_explained(maps: Tensor, like: Tensor, what: str) -> Tensor:
    """A re-explanation's maps, checked finite and of the shape of the batch's maps, on their device."""
    maps = maps.to(like.device)
    if maps.shape != like.shape:
        raise ValueError(f"explain returned maps of shape {tuple(maps.shape)} {what}, expected {tuple(like.shape)}")
    if not torch.isfinite(maps).all():
        raise ValueError(f"the maps {what} contain NaN or infinite values")
    return maps.float()


def modifier_of(batch, metric: str):
    """The batch's :attr:`EvalBatch.modified`; a batch without it (no model at hand) is refused in one line."""
    if batch.modified is None or batch.explain is None:
        raise ValueError(f"metric {metric!r} needs the model and the method, to explain the images again with "
                         "changed weights (EvalBatch.modified and explain)")
    return batch.modified
