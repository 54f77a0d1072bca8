"""A model's weights re-initialised from the top down, level by level: what the model-randomisation protocols
(smooth and efficient MPRT) and the bench's randomisation check change a model with.

Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018, Sec. 3.1 ("cascading randomization"). Which
parameters form each level, and how each is re-initialised, is the model's family's declaration
(:attr:`~.families.Family.cascade`; :mod:`.families.cascade`): :func:`randomisation_levels` finds the family of any
model vitexplain explains (a compiled model, an ``nn.Sequential`` ending in a described model) and gives its
levels, top first. :func:`reinitialise` re-draws one level in place, from one ``torch.Generator`` on the CPU (so a
seed gives the same weights on every device): matrices, tokens and position embeddings from N(0, 0.02²)
truncated at ±2 (timm's ``trunc_normal_(std=0.02)``), the ones and zeros as the level says. :class:`Randomisation`
is the ``change(model)`` of :attr:`vitexplain.metrics.EvalBatch.modified` that re-draws levels 0 ... k from a seed,
so the model at level k depends on the seed and k only, and equals the cascade's drawn level after level from
the same seed. Decisions: docs/decisions/default-bench.md, docs/decisions/metrics-mprt.md.
"""
from __future__ import annotations

import torch
from torch import nn

from ..seeding import seeded_draw
from .families import ForwardOnly, UnsupportedModelError
from .families.cascade import Level

#: the standard deviation of the drawn parameters (timm's ViT initialisation)
INIT_STD = 0.02


def randomisation_levels(model: nn.Module) -> list[Level]:
    """``model``'s cascade of levels, top first (``head``, ``block L-1`` ... ``block 0``, ``embedding``), as its
    family declares it; a model no family describes, or whose family declares no cascade, is refused in one line."""
    from . import adapter_for

    family = adapter_for(model).family
    if isinstance(family, ForwardOnly):
        raise UnsupportedModelError(f"model randomisation re-initialises a model's blocks from the top down; "
                                    f"{family.unreachable}")
    return family.randomisation_levels()


def reinitialise(level: Level, generator: torch.Generator) -> None:
    """Re-draw the parameters of ``level`` in place, in order, the drawn ones from ``generator`` (a CPU generator)."""
    with torch.no_grad():
        for _, parameter, initial in level.parameters:
            if initial == "normal":
                value = nn.init.trunc_normal_(torch.empty(parameter.shape), std=INIT_STD, generator=generator)
            else:
                value = (torch.ones if initial == "one" else torch.zeros)(parameter.shape)
            parameter.copy_(value)


class Randomisation:
    """``change(model)`` for :attr:`vitexplain.metrics.EvalBatch.modified`: the cascade's levels 0 ... ``level``
    (None: all of them, the fully random model) re-initialised from ``seed``, in place; the model of the cascade at
    that level, whatever was drawn before. After it ran, :attr:`levels` holds the names of the model's levels."""

    def __init__(self, level: int | None, seed: int):
        self.level, self.seed = level, seed
        self.levels: list[str] = []

    def __call__(self, model: nn.Module) -> None:
        levels = randomisation_levels(model)
        self.levels = [level.name for level in levels]

        def draw(generator: torch.Generator) -> torch.Tensor:     # the draws of reinitialise, one generator throughout
            for level in levels[:None if self.level is None else self.level + 1]:
                reinitialise(level, generator)
            return torch.empty(0)

        seeded_draw(self.seed, draw)


__all__ = ["INIT_STD", "Level", "Randomisation", "randomisation_levels", "reinitialise"]
