"""Temporary changes to a model that are undone together: the one way instrumentation touches a model."""
from __future__ import annotations

from typing import Any, Callable

from torch import nn
from torch.utils.hooks import RemovableHandle


class ModelPatch:
    """Collects forward hooks, replaced ``forward`` methods and set attributes, and undoes them all on exit.

    Use as a context manager (zennit's canonizers work the same way): on exit, also after an
    exception, every hook is removed and every replaced ``forward`` and set attribute is restored,
    last replaced first, so a module whose forward was replaced twice gets its own back.
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._forwards: list[tuple[nn.Module, Callable | None]] = []
        self._attributes: list[tuple[nn.Module, str, dict[str, Any]]] = []

    def hook(self, handle: RemovableHandle) -> None:
        """Keep a hook handle (e.g. from ``register_forward_hook``) to remove on exit."""
        self._handles.append(handle)

    def replace_forward(self, module: nn.Module, forward: Callable) -> None:
        """Make ``module.forward`` call ``forward`` until exit."""
        self._forwards.append((module, module.__dict__.get("forward")))
        module.forward = forward

    def set_attribute(self, module: nn.Module, name: str, value: Any) -> None:
        """Make ``module.<name>`` ``value`` until exit (an attribute the instance did not hold is deleted again)."""
        self._attributes.append((module, name, {name: module.__dict__[name]} if name in module.__dict__ else {}))
        setattr(module, name, value)

    def undo(self) -> None:
        for handle in self._handles:
            handle.remove()
        for module, original in reversed(self._forwards):
            if original is None:
                del module.forward
            else:
                module.forward = original
        for module, name, own in reversed(self._attributes):
            if own:
                setattr(module, name, own[name])
            else:
                delattr(module, name)
        self._handles.clear()
        self._forwards.clear()
        self._attributes.clear()

    def __enter__(self) -> ModelPatch:
        return self

    def __exit__(self, *exc_info) -> None:
        self.undo()
