"""The catalogue of example models: each family's tiny randomly initialised builds, declared on the family
(:attr:`~.base.Family.example_models`), and the sizes they share.

The support matrix (:mod:`vitexplain.support`) runs every method on each, and the tests enrol them, so a family is
covered by both as soon as it declares its examples.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

#: the tiny timm ViTs' size (32 px images, 8 px patches, two blocks)
TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10)
#: the tiny Swins: 32 px images, 4 px patches, two stages of two blocks, 2×2 windows, so that both stages have several
#: windows and their odd blocks shift them
TINY_SWIN = dict(img_size=32, patch_size=4, embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=2,
                 num_classes=10)
#: the tiny transformers image encoders' size (as :data:`TINY`, in transformers' words)
TINY_TRANSFORMERS = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                         intermediate_size=96)


def image() -> Tensor:
    """The one 32 px input image every image example is explained on."""
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class Example:
    """A tiny randomly initialised model of a family and its input.

    Attributes:
        label: its name in the support matrix (a column) and in test reports.
        make: builds the model with random weights; keyword arguments change its settings (the tests' variants).
        inputs: the input it is explained on.
    """

    label: str
    make: Callable[..., nn.Module]
    inputs: Callable[[], Any] = image

    def build(self) -> tuple[nn.Module, Any]:
        """The model (seeded, in eval mode) and its input."""
        torch.manual_seed(0)
        return self.make().eval(), self.inputs()


def timm_tiny(architecture: str, settings: dict[str, Any] = TINY, **arguments) -> Callable[..., nn.Module]:
    """A builder of timm's ``architecture`` at the tiny size ``settings``, ``arguments`` (then the caller's) over it."""
    def make(**overrides) -> nn.Module:
        import timm

        return timm.create_model(architecture, pretrained=False, **{**settings, **arguments, **overrides})

    return make


__all__ = ["TINY", "TINY_SWIN", "TINY_TRANSFORMERS", "Example", "image", "timm_tiny"]
