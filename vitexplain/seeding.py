"""Seeded random numbers that are the same on every device: drawn on the CPU, then moved.

One seed must give one map whether the images are on the CPU or on a GPU. A generator on the
images' device would not: a CUDA generator runs Philox and the CPU one the Mersenne Twister, so the
same seed draws different numbers (RISE's maps on CPU and CUDA correlated at r = 0.33). Every method
and metric that draws random numbers therefore draws them here, from a CPU generator of its own
(the caller's global random state is never read or advanced), and moves them to the device once.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

Drawn = TypeVar("Drawn", Tensor, tuple[Tensor, ...])


def seeded_draw(seed: int, draw: Callable[[torch.Generator], Drawn], device: torch.device | str = "cpu") -> Drawn:
    """``draw(generator)`` with a fresh CPU generator seeded with ``seed``; its tensor (or tuple of
    tensors) moved to ``device``. ``draw`` makes every random call with ``generator=generator`` and
    no ``device``; draw what a call needs at once, so it crosses to the device once."""
    drawn = draw(torch.Generator(device="cpu").manual_seed(seed))
    if isinstance(drawn, tuple):
        return tuple(tensor.to(device) for tensor in drawn)
    return drawn.to(device)


def derived_seed(seed: int, *keys: int) -> int:
    """A seed of its own for every ``(seed, *keys)``: numpy's ``SeedSequence`` of them (``seed`` taken modulo 2^64,
    so a negative seed works too) as a 32-bit integer. Independent streams, the same on every run and machine."""
    import numpy as np

    return int(np.random.SeedSequence((seed % 2 ** 64, *keys)).generate_state(1)[0])
