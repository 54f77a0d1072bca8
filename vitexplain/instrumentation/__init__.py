"""The one place that knows model internals: a description per model family, and the adapter that reads it.

Methods receive a :class:`ModelAdapter` and read :class:`Recording` objects; they never touch a model.
A family (:mod:`.families`) says where a model's parts are; recording (:meth:`ModelAdapter.record`),
forwards on token subsets and the LRP rules (:mod:`.lrp`) all read that one description, and the
attention and the blocks are written out once (:mod:`.attention`, :mod:`.blocks`).
"""
from __future__ import annotations

import sys

from torch import nn

from .adapter import ModelAdapter, evaluation_mode
from .families import (
    Family,
    ForwardOnly,
    UnsupportedModelError,
    register_family,
    served_families,
)
from .geometry import Readout, TokenGeometry
from .inputs import TokenBatch
from .layer_scores import LayerScores
from .recording import BLOCK_FIELDS, BlockRecord, Recording, identity_like
from .targets import Target, resolve_target, resolve_targets


def uncompiled(model: nn.Module) -> nn.Module:
    """``model`` out of ``torch.compile``'s wrapper (its ``_orig_mod``): explanations replace the forwards of
    its modules, which compiled code would not see, so they run the original module eagerly."""
    compiled = sys.modules.get("torch._dynamo.eval_frame")  # imported by torch.compile
    while compiled is not None and isinstance(model, compiled.OptimizedModule):
        model = model._orig_mod
    return model


def _served() -> str:
    return ", ".join(family.name for family in served_families())


def _kind(model: nn.Module) -> type[Family] | None:
    """The family that knows ``model``'s kind, if any (whether or not it covers the model's settings)."""
    return next((family for family in served_families() if family.recognises(model)), None)


def family_of(model: nn.Module) -> Family:
    """The description of ``model``'s family (of its original module, if compiled); :class:`UnsupportedModelError`
    says in one line why none fits: the one reason of the family that knows its kind, then the families served."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model = uncompiled(model)
    kind = _kind(model)
    if kind is None:
        raise UnsupportedModelError(f"{type(model).__name__} is none of the models vitexplain instruments "
                                    f"({_served()})")
    reason = kind.unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModelError(f"vitexplain cannot instrument this {type(model).__name__}: {reason}; "
                                    f"it instruments {_served()}")
    return kind(model)


def _inner(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The module a family may describe — ``model``, or the last module of an ``nn.Sequential`` (nested ones too)
    — and the modules that run before it."""
    model = uncompiled(model)
    if isinstance(model, nn.Sequential) and len(model):
        inner, before = _inner(model[-1])
        return inner, [*model[:-1], *before]
    return model, []


def adapter_for(model: nn.Module | ModelAdapter, *, classes: bool | None = None) -> ModelAdapter:
    """The adapter that explains ``model`` (an adapter is returned as it is, or anew when ``classes`` is given).

    The model is instrumented through its family's description; a compiled model through its original
    module; an ``nn.Sequential`` whose last module a family describes through that module, the modules
    before it running first as preprocessing. A model no family instruments is explained through its forward
    alone (:class:`ForwardOnly`), which serves the methods that read only the outputs.

    Args:
        classes: whether the outputs are class logits; None decides from the model (a classifier head is,
            a projection to an embedding is not: :attr:`Family.head_reason`).
    """
    if isinstance(model, ModelAdapter):
        if classes is None:
            return model
        model = model.model
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model = uncompiled(model)
    inner, before = _inner(model)
    if _kind(inner) is None:
        family: Family = ForwardOnly(model, unreachable=f"{type(model).__name__} has none that vitexplain can reach "
                                                        f"(it instruments {_served()})")
        before = []
    else:
        try:
            family = family_of(inner)
        except UnsupportedModelError as refusal:
            family, before = ForwardOnly(model, unreachable=str(refusal)), []
    family.classes = classes
    return ModelAdapter(family, model=model, preprocessing=nn.Sequential(*before) if before else None)


__all__ = [
    "BLOCK_FIELDS", "BlockRecord", "Family", "ForwardOnly", "LayerScores", "ModelAdapter", "Readout", "Recording",
    "register_family", "served_families", "Target", "TokenBatch", "TokenGeometry", "UnsupportedModelError",
    "adapter_for", "evaluation_mode", "family_of", "identity_like", "resolve_target", "resolve_targets",
]
