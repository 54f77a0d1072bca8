"""What a method asks a recording for (:meth:`~.adapter.ModelAdapter.record`), checked before the model runs."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from .families import ForwardOnly
from .families.base import Family, UnsupportedModelError
from .layer_scores import LayerScores, refuse_layer_scores
from .recording import BLOCK_FIELDS, HEAD_FIELDS


def requested(family: Family, fields: Collection[str] | Mapping[str, Collection[int] | None] | None,
              grads: Collection[str] | Mapping[str, Collection[int] | None], stop_gradient: Sequence[str],
              layer_scores: LayerScores | None) -> tuple[dict[str, Collection[int] | None], bool]:
    """The fields whose gradients are wanted (each with its blocks, None: all) and whether the images' own gradient
    (``"input"``) is; what cannot be recorded of ``family``'s model refused in one line."""
    if set(stop_gradient) - {"attn_input"}:
        raise ValueError(f"stop_gradient supports only 'attn_input', got {sorted(stop_gradient)}")
    if isinstance(family, ForwardOnly):
        raise UnsupportedModelError(f"record reads the model's blocks; {family.unreachable}")
    wanted = dict(grads) if isinstance(grads, Mapping) else {name: None for name in grads}
    input_grad = wanted.pop("input", False) is not False
    for name in set(wanted) | set(fields or ()):
        if name not in BLOCK_FIELDS + HEAD_FIELDS:
            raise ValueError(f"cannot record {name!r}; choose from {list(BLOCK_FIELDS + HEAD_FIELDS) + ['input']}")
    refuse_layer_scores(layer_scores, set(wanted) | set(fields or ()), input_grad, family.probe, family.readout)
    return wanted, input_grad
