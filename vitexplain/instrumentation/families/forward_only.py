"""Any differentiable image model, known only by its forward: images [B, C, H, W] in, scores [B, K] out.

The description a model gets when no family instruments it (a ResNet, a ConvNeXt, a ViT with a part no
family covers, any module mapping images to scores). It knows the forward, the input checks and the
outputs, nothing inside, so only the methods that read the outputs alone (and their gradients with
respect to the images) explain it; the others are refused, saying why (:attr:`ForwardOnly.unreachable`).
"""
from __future__ import annotations

from torch import Tensor, nn

from ..blocks import BlockParts
from .base import Family, PatchTokensOnly, UnsupportedModelError, wrong_channels
from .examples import Example


def _resnet18(**overrides) -> nn.Module:
    from torchvision.models import resnet18

    return resnet18(weights=None, **{"num_classes": 10, **overrides})


class ForwardOnly(PatchTokensOnly, Family):
    """A model described by its forward alone (see the module docstring); ``unreachable`` says why nothing
    inside it can be read (the reason a family that knows its kind gives, or that no family knows it)."""

    name = "any image classifier (its outputs only)"
    example_models = (Example("torchvision ResNet-18 (outputs only)", _resnet18),)

    def __init__(self, model: nn.Module, *, unreachable: str):
        super().__init__(model)
        self.unreachable = unreachable

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        return True

    def block_modules(self):
        return ()

    def block(self, module: nn.Module) -> BlockParts:
        raise UnsupportedModelError(self.unreachable)

    @property
    def patch_size(self) -> tuple[int, int]:
        """No patches: the grid of token-level maps (the controls) is the pixels."""
        return 1, 1

    @property
    def in_channels(self) -> None:
        """Not known from the outside (see :meth:`forward`)."""
        return None

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        return tuple(images.shape[-2:])

    def token_subsets_reason(self) -> str:
        return self.unreachable

    def forward(self, images: Tensor) -> Tensor:
        """The model's scores [B, K]: its output tensor, or the ``logits`` of an output object (transformers).

        The channels a model takes are not known from outside, so they are not checked before it runs; when
        it fails on images whose channels its first convolution does not take, that is said instead of
        torch's error (any other failure is the model's own)."""
        try:
            outputs = self.model(images)
        except RuntimeError as error:
            first = next(((name, module) for name, module in self.model.named_modules()
                          if isinstance(module, nn.Conv2d)), None)
            if first is not None and first[1].in_channels != images.shape[1]:
                raise ValueError(wrong_channels(first[1].in_channels, images.shape,
                                                f" (its first convolution, {first[0]}, does)")) from error
            raise
        outputs = getattr(outputs, "logits", outputs)
        if not isinstance(outputs, Tensor) or outputs.ndim != 2 or outputs.shape[0] != images.shape[0]:
            found = f"shape {tuple(outputs.shape)}" if isinstance(outputs, Tensor) else f"a {type(outputs).__name__}"
            raise UnsupportedModelError(f"{type(self.model).__name__} returns {found} for {images.shape[0]} images; "
                                        "vitexplain explains a model returning scores [B, K] "
                                        "(wrap it in one that does)")
        return outputs
