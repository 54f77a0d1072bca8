"""What one forward under LRP rules leaves for :func:`~.propagation.relevance` to read: the :class:`Trace`.

The written-out blocks and attention hand their tensors to a sink (:class:`~..attention.Sink`); the
trace's sink keeps the residual stream (from the block the backward starts at on), an attention-pooling
head's attention and each windowed block's layout. The patch embedding's output, the last block's output
and the pixel rule are put there by the placement (:mod:`.placement`). A block's attention probabilities
are not kept from the forward: they are computed again as the backward passes the block
(:meth:`~..attention.Arithmetic.recomputing`), and what is read there is collected by the trace's
:class:`AttentionReadings`.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..attention import Sink
from ..instrumented import READOUT
from ..windows import WindowLayout
from . import rules as r


class AttentionReadings:
    """What :func:`~.propagation.relevance` reads at the attention of some blocks, collected as each backward
    passes them: the relevance of the probabilities R_A = A ⊙ ∂R/∂A under the rules and, beside it within
    :func:`~.rules.both_gradients`, the plain gradient ∂y/∂A — or only what ``reduce`` makes of the two.

    The plain backward runs first and leaves each block the plain gradient at its attention's output A·v
    ([B, H, N, D], not N×N); the relevance's backward then forms ∂y/∂A = ∂y/∂(A·v) · vᵀ (A·v's backward),
    so no block's N×N matrices outlive its backward unless they are kept unreduced.

    Args:
        blocks: the blocks whose attention is read.
        phase: the :class:`~.rules.Phase` of both gradients (None: the relevance alone).
        reduce: ``(geometry, block, relevance, gradient) -> value``, run in the relevance's backward as it
            passes each block (the last first), its value kept in :attr:`reduced`; ``gradient`` None without
            ``phase``. None: the relevance and gradient are kept whole, in :attr:`relevance` and :attr:`gradients`.
        device: where the anchor leaf lives.
    """

    def __init__(self, blocks: Collection[int], phase: r.Phase | None,
                 reduce: Callable[[Any, int, Tensor, Tensor | None], Any] | None, device: torch.device):
        self.blocks, self.phase, self.reduce = set(blocks), phase, reduce
        #: a leaf every read attention takes as an input: a backward to it passes each of them
        self.anchor = torch.zeros((), device=device, requires_grad=True)
        #: the token geometry, for ``reduce`` (set after the forward)
        self.geometry: Any = None
        self.relevance: dict[int, Tensor] = {}
        self.gradients: dict[int, Tensor] = {}
        self.reduced: dict[int, Any] = {}
        self._plain_outputs: dict[int, Tensor] = {}

    def put(self, block: int, attn: Tensor | None, v: Tensor | None, grad_attn: Tensor | None, grad_mixed: Tensor,
            layout: WindowLayout | None) -> None:
        """Block's probabilities and values and the gradients at the probabilities and at A·v, from a backward (the
        plain one, whose forward ran PyTorch's fused attention, hands over the gradient at A·v alone)."""
        if self.phase is not None and self.phase.plain:
            self._plain_outputs[block] = grad_mixed
            return
        found = {"attn": attn * grad_attn}
        if self.phase is not None:
            plain = self._plain_outputs.pop(block, None)
            found["grad"] = torch.zeros_like(attn) if plain is None else plain @ v.contiguous().transpose(-2, -1)
        self.read(block, found, layout)

    def read(self, block: int, found: dict[str, Tensor], layout: WindowLayout | None) -> None:
        """Block's relevance (``attn``) and plain gradient (``grad``, within :func:`~.rules.both_gradients`) at its
        probabilities: laid out as recorded, then reduced or kept."""
        if layout is not None:  # a windowed block's per window, as recorded
            found = {name: layout.recorded({"attn": value})["attn"] for name, value in found.items()}
        if self.reduce is not None:
            self.reduced[block] = self.reduce(self.geometry, block, found["attn"], found.get("grad"))
            return
        self.relevance[block] = found["attn"]
        if "grad" in found:
            self.gradients[block] = found["grad"]


@dataclass
class Trace:
    """Tensors of one forward under :func:`~.placement.lrp_rules`, whose relevance
    :func:`~.propagation.relevance` reads.

    Attributes:
        readings: what is read at the attention of the blocks asked for (:class:`AttentionReadings`; None:
            nothing), set before the forward.
        attention: those blocks' attention probabilities, by block, where the forward keeps every block's graph
            (``recompute=False``; else they are computed again in the backward and not kept here).
        residuals: every block's input, then the last block's output [B, N, C].
        patches: the patch embedding's output, before prefix tokens and position embedding.
        readout_attn: an attention-pooling head's probabilities [B, H, latents, N], when the model has one.
        readout_selection: a max-pooling head's selection of the tokens it pools [B, N'], when the model has one.
        pixel_rule: the pixel rule placed (its bounds, for the z^B rule).
        layouts: windowed blocks' window layouts (hierarchical models), by block.
        sink: the sink the forward handed its tensors to (which hands the attention to ``readings`` in the backward).
    """

    readings: AttentionReadings | None = None
    attention: dict[int, Tensor] = field(default_factory=dict)
    residuals: dict[int, Tensor] = field(default_factory=dict)
    patches: Tensor | None = None
    readout_attn: Tensor | None = None
    readout_selection: Tensor | None = None
    pixel_rule: r.ModuleRule | None = None
    layouts: dict[int, WindowLayout] = field(default_factory=dict)
    sink: Sink | None = None


class TraceSink(Sink):
    """Keeps the residual stream of the blocks from ``first`` on and the pooling head's attention; the attention
    of the blocks the trace's readings ask for it hands to them in the backward (``recompute``, each block
    computed again there) or keeps from the forward (:attr:`Trace.attention`)."""

    def __init__(self, trace: Trace, first: int = 0, recompute: bool = True):
        self.trace = trace
        self.first = first
        self.recompute = recompute
        trace.sink = self  # the attention holds its sink weakly; the trace keeps it for the backward

    def _read(self, block: int) -> bool:
        readings = self.trace.readings
        return readings is not None and block in readings.blocks

    def wants(self, block: int, name: str) -> bool:
        if block == READOUT:
            return name in ("attn", "selection")
        if name == "attn":
            return not self.recompute and self._read(block)
        return name == "residual" and block >= self.first

    def anchor(self, block: int) -> Tensor | None:
        return self.trace.readings.anchor if self.recompute and self._read(block) else None

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == READOUT:
            self.trace.readout_attn = tensors.get("attn", self.trace.readout_attn)
            self.trace.readout_selection = tensors.get("selection", self.trace.readout_selection)
            return
        if "residual" in tensors:
            self.trace.residuals[block] = tensors["residual"]
        if "attn" in tensors and self.wants(block, "attn"):
            self.trace.attention[block] = tensors["attn"]

    def put_backward(self, block: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        self.trace.readings.put(block, tensors.get("attn"), tensors.get("v"), gradients.get("attn"),
                                gradients["mixed"], self.trace.layouts.get(block))

    def layout(self, block: int, layout: WindowLayout) -> None:
        self.trace.layouts[block] = layout
