"""A model changed for the length of a block and restored exactly on exit: what a protocol that re-explains a
modified model (randomised layers, rounded or perturbed weights) runs in.

:func:`modified` is the one place this happens: ``with modified(model, change):`` applies ``change(model)`` (in
place: weights, buffers, flags) and, on exit — also after an exception — puts back every parameter and buffer
object with its own values, dtype, device and ``requires_grad``, every ``.grad``, each module's train / eval flag
and its hooks (hooks added inside the block are removed). :func:`modifier` binds it to one model, the form
:attr:`vitexplain.metrics.EvalBatch.modified` carries (a metric never receives the model object itself).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ContextManager

import torch
from torch import Tensor, nn

#: the per-module hook dictionaries restored on exit
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")

Change = Callable[[nn.Module], None]


@contextlib.contextmanager
def modified(model: nn.Module, change: Change) -> Iterator[None]:
    """Within the block ``model`` has ``change(model)`` applied; on exit (also after an exception, in ``change`` or
    in the block) everything is as it was, bitwise: parameters and buffers (the same objects, their values, dtype,
    device, ``requires_grad`` and ``.grad``), which tensors each module holds, train / eval flags, hooks.

    The values are copied once on entry (one copy of the model's tensors in memory while the block runs).
    """
    modules = list(model.modules())
    held = [(module, dict(module._parameters), dict(module._buffers), module.training,
             {name: dict(getattr(module, name)) for name in _HOOK_DICTS if hasattr(module, name)})
            for module in modules]
    #: per tensor: itself, its own data (the storage other tensors may share), a copy of its values, its flags
    tensors: dict[int, tuple[Tensor, Tensor, Tensor, bool, Tensor | None]] = {}
    with torch.no_grad():
        for _, parameters, buffers, _, _ in held:
            for tensor in (*parameters.values(), *buffers.values()):
                if tensor is not None and id(tensor) not in tensors:
                    tensors[id(tensor)] = (tensor, tensor.data, tensor.data.clone(), tensor.requires_grad,
                                           tensor.grad)
    try:
        change(model)
        yield
    finally:
        with torch.no_grad():
            for module, parameters, buffers, training, hooks in held:
                module._parameters.clear()
                module._parameters.update(parameters)
                module._buffers.clear()
                module._buffers.update(buffers)
                module.training = training
                for name, entries in hooks.items():
                    current = getattr(module, name)
                    current.clear()
                    current.update(entries)
            for tensor, own, values, requires_grad, grad in tensors.values():
                tensor.data = own          # its own storage (shared storage stays shared), then its own values
                own.copy_(values)
                if tensor.requires_grad != requires_grad:
                    tensor.requires_grad_(requires_grad)
                tensor.grad = grad


def modifier(model: nn.Module) -> Callable[[Change], ContextManager[None]]:
    """``change -> context manager``: :func:`modified` bound to ``model`` (:attr:`EvalBatch.modified`)."""
    return lambda change: modified(model, change)
