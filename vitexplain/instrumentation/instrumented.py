"""The instrumented forward (:func:`instrumented_forward`) that recording, token subsets and LRP rules all run in.

Every Transformer block of a model (and an attention-pooling head) is computed by the written-out forward of
:mod:`.blocks`, with an :class:`~.attention.Arithmetic`, and hands what it computes to a
:class:`~.attention.Sink`.

The blocks' ``forward`` methods are replaced for the length of a ``with`` block (:class:`~.patching.ModelPatch`)
and given back on exit, also when an exception is raised.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .attention import NOTHING, PLAIN, Arithmetic, Sink, attend
from .blocks import BlockParts, block_forward, recomputed_block_forward
from .families.base import Family, ProbeParts
from .patching import ModelPatch

#: block index under which an attention-pooling head hands its attention (and a max-pooling head its selection of
#: the tokens) to a sink
READOUT = -1


@dataclass
class _State:
    """How the instrumented blocks compute during one ``with instrumented_forward(...)``."""

    arithmetic: Arithmetic
    sink: Sink
    positions: Tensor | None
    gradient_from: int | None
    detach_attention_input: bool
    separate_graphs: bool


def _instrumented_block(parts: BlockParts, index: int, state: _State, *args: Any, **kwargs: Any) -> Any:
    """A block's ``forward`` while instrumented: the written-out block on the family's call arguments."""
    x, extra = parts.inputs(*args, **kwargs)
    if state.positions is not None:
        extra.positions = state.positions
    below = state.gradient_from is not None and index < state.gradient_from
    with torch.set_grad_enabled(torch.is_grad_enabled() and not below):
        starts = (state.separate_graphs and state.gradient_from is not None and not below) or (
            index == state.gradient_from and not x.requires_grad)
        if starts and torch.is_grad_enabled():
            x = x.detach().requires_grad_(True)  # frozen weights, a cut below, or the block's own graph
        context = state.arithmetic.recomputing() if torch.is_grad_enabled() else None
        if context is None:
            out = block_forward(parts, x, extra, index=index, arithmetic=state.arithmetic, sink=state.sink,
                                detach_attention_input=state.detach_attention_input)
        else:  # under LRP rules: the block computed again in the backward (Arithmetic.recomputing)
            out = recomputed_block_forward(parts, x, extra, index=index, sink=state.sink, context=context)
    returned = parts.output(out, args[0] if args else next(iter(kwargs.values())))
    if state.sink.wants(index, "output"):
        state.sink.put(index, output=returned)
    return returned


def _instrumented_probe(parts: ProbeParts, state: _State, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """An attention-pooling head's ``forward`` while instrumented, its attention handed to the sink."""
    if parts.position is not None:
        x = state.arithmetic.offset(x, parts.position().to(x.dtype))
    out = attend(parts.attention, x, arithmetic=state.arithmetic, sink=state.sink, block=READOUT)
    if parts.mlp is not None:
        out = state.arithmetic.add(out, parts.mlp(parts.norm(out)))
    if parts.pool == "avg":
        return out.mean(1)
    return out[:, 0] if parts.pool == "token" else out


def _hand_over_selection(sink: Sink, selection: Tensor) -> None:
    """A max-pooling head's selection of the tokens (``Family.observe_pooling``) to ``sink``, if it wants it."""
    if sink.wants(READOUT, "selection"):
        sink.put(READOUT, selection=selection)


@contextlib.contextmanager
def instrumented_forward(family: Family, *, arithmetic: Arithmetic = PLAIN, sink: Sink = NOTHING,
                         positions: Tensor | None = None, gradient_from: int | None = None,
                         detach_attention_input: bool = False, separate_graphs: bool = False) -> Iterator[ModelPatch]:
    """Within the block, every Transformer block of ``family``'s model (and an attention-pooling head) computes
    through the written-out forward of :mod:`.blocks`, with ``arithmetic`` and handing what it computes to
    ``sink``; yields the :class:`ModelPatch` holding the changes, for further ones (LRP rules).

    Args:
        positions: the tokens are a subset: their sequence positions [B, N'] (prefix included).
        gradient_from: blocks below this index run without gradients and this block's input starts
            the graph (so a backward stops there); None: as the surrounding mode says.
        detach_attention_input: every attention reads a detached copy of its input.
        separate_graphs: every block from ``gradient_from`` on starts its own graph at its input, so a
            backward from a block's output reaches that block only.

    A block hands its output, as it returns it, to ``sink`` as ``output`` when the sink wants it.
    """
    state = _State(arithmetic, sink, positions, gradient_from, detach_attention_input, separate_graphs)
    with ModelPatch() as patch:
        for index, parts in enumerate(family.blocks):
            patch.replace_forward(parts.module, functools.partial(_instrumented_block, parts, index, state))
        if family.probe is not None:
            patch.replace_forward(family.probe.module, functools.partial(_instrumented_probe, family.probe, state))
        family.observe_pooling(patch, functools.partial(_hand_over_selection, sink))
        yield patch
