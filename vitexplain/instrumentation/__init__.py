"""The one place that knows model internals: a description per model family, and the adapter that reads it.

Methods receive a :class:`ModelAdapter` and read :class:`Recording` objects; they never touch a model.
A family (:mod:`.families`) says where a model's parts are; recording (:meth:`ModelAdapter.record`),
forwards on token subsets and the LRP rules (:mod:`.lrp`) all read that one description, and the
attention and the blocks are written out once (:mod:`.attention`, :mod:`.blocks`).
"""
from __future__ import annotations

from torch import nn

from .adapter import LayerScores, ModelAdapter, evaluation_mode
from .families import FAMILIES, Family, UnsupportedModelError
from .inputs import TokenBatch
from .recording import BLOCK_FIELDS, BlockRecord, Readout, Recording, identity_like
from .targets import Target, resolve_target, resolve_targets


def family_of(model: nn.Module) -> Family:
    """The description of ``model``'s family; :class:`UnsupportedModelError` says why none fits."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    reasons = []
    for family in FAMILIES:
        reason = family.unsupported_reason(model)
        if reason is None:
            return family(model)
        reasons.append(f"{family.name}: {reason}")
    raise UnsupportedModelError(
        f"vitexplain cannot instrument a {type(model).__name__}; it explains Vision Transformers and "
        "BERT-style text classifiers. " + "; ".join(reasons))


def adapter_for(model: nn.Module | ModelAdapter) -> ModelAdapter:
    """The adapter that instruments ``model`` (an adapter is returned as it is)."""
    if isinstance(model, ModelAdapter):
        return model
    return ModelAdapter(family_of(model))


__all__ = [
    "BLOCK_FIELDS", "BlockRecord", "FAMILIES", "Family", "LayerScores", "ModelAdapter", "Readout", "Recording", "Target", "TokenBatch",
    "UnsupportedModelError", "adapter_for", "evaluation_mode", "family_of", "identity_like", "resolve_target",
    "resolve_targets",
]
