"""Control: a seeded random map (the reference row that any real explanation must beat)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..registry import register_method
from ..seeding import seeded_draw


@register_method(class_specific=False, control=True, cost=0, reads="output", fresh_per_copy=True)
def random_baseline(adapter: ModelAdapter, images: Tensor, target=None, *, seed: int = 0) -> Tensor:
    """Control, not an explanation: uniform noise U[0, 1) on the patch grid, ignoring the model.

    One map is drawn from ``seed`` (on the CPU, so every device gets the same one) and given to every
    image, so a map depends neither on the image, the model, the target, the batch nor the device. In
    the bench tables it is the chance level of every protocol; in the model-randomisation check it must
    be flagged (its maps do not change when the model does).

    Re-explained by a stability protocol for the k-th perturbed copy of an image (max-sensitivity, numerical
    stability), it is drawn afresh from a seed derived from ``seed`` and k (``fresh_per_copy``): a map unrelated to
    its image is unrelated to the copy too, so it is the least stable map there is, not a perfectly stable one
    (docs/decisions/metric-trust.md).
    """
    height, width = adapter.grid_size(images)
    noise = seeded_draw(seed, lambda generator: torch.rand(height, width, generator=generator), images.device)
    return noise.expand(images.shape[0], height, width).clone()
