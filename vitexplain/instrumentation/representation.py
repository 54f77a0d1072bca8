"""The representation a model's classifier reads: the input of the last linear layer of a forward, when that
layer's output is the model's output (the pre-logits)."""
from __future__ import annotations

from typing import Any, Callable

from torch import Tensor, nn

from .families.base import UnsupportedModelError


def classifier_input(model: nn.Module, forward: Callable[[], Tensor], model_name: str) -> Tensor:
    """Float32 [B, D]: the input of the last linear layer of ``model`` that ``forward()`` runs, which must compute
    the outputs ``forward`` returns from a [B, D] input; else refused in one line (two heads averaged, a scaled
    similarity, an embedding model's output), naming ``model_name``."""
    last: list[tuple[Tensor, Tensor]] = []

    def keep(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        last[:] = [(args[0], output)]

    hooks = [module.register_forward_hook(keep) for module in model.modules() if isinstance(module, nn.Linear)]
    try:
        outputs = forward()
    finally:
        for hook in hooks:
            hook.remove()
    if not last or last[0][1] is not outputs or last[0][0].dim() != 2:
        raise UnsupportedModelError(f"no linear classifier of this {model_name} computes its outputs from a "
                                    "[B, D] representation, so the representation its classifier reads is unknown")
    return last[0][0].float()
