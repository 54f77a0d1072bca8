"""The model in eval mode, gradient checkpointing off, for the length of a block: how every pass on it runs."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from .patching import ModelPatch

#: the flags by which timm (``set_grad_checkpointing``) and transformers (``gradient_checkpointing_enable``) make
#: a module recompute its forward in the backward
CHECKPOINTING_FLAGS = ("grad_checkpointing", "gradient_checkpointing")


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Put every module in eval mode with gradient checkpointing off, and give each its own flags back afterwards.

    Checkpointing runs a forward again in the backward, where the recording (and LRP's rules) would meet it a
    second time; it only trades memory for time, so the values are the same without it.
    """
    flags = [(module, module.training) for module in model.modules()]
    with ModelPatch() as patch:
        for module in model.modules():
            for name in CHECKPOINTING_FLAGS:
                if getattr(module, name, None) is True:
                    patch.set_attribute(module, name, False)
        model.eval()
        try:
            yield
        finally:
            for module, training in flags:
                module.training = training
