"""What the protocols that explain a changed model share (smooth / efficient MPRT, numerical stability, input
invariance): the refusal of a batch without the model, and the check of a re-explanation's maps.

The model is changed only through :attr:`EvalBatch.modified`; which layers a randomisation re-initialises is the
model family's declaration (:mod:`vitexplain.instrumentation.randomisation`), the correlations of maps are
:mod:`.correlation`.
"""
from __future__ import annotations

import torch
from torch import Tensor


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
