"""What one forward under LRP rules leaves for :func:`~.propagation.relevance` to read: the :class:`Trace`.

The written-out blocks and attention hand their tensors to a sink (:class:`~..attention.Sink`); the
trace's sink keeps the attention probabilities and the residual stream (from the block the backward
starts at on), an attention-pooling head's attention and each windowed block's layout. The patch
embedding's output, the last block's output and the pixel rule are put there by the placement
(:mod:`.placement`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from ..adapter import READOUT
from ..attention import Sink
from ..windows import WindowLayout
from . import rules as r


@dataclass
class Trace:
    """Tensors of one forward under :func:`~.placement.lrp_rules`, whose relevance
    :func:`~.propagation.relevance` reads.

    Attributes:
        attn: attention probabilities of every block [B, H, N, N], as they enter A·v.
        residuals: every block's input, then the last block's output [B, N, C].
        patches: the patch embedding's output, before prefix tokens and position embedding.
        readout_attn: an attention-pooling head's probabilities [B, H, latents, N], when the model has one.
        readout_selection: a max-pooling head's selection of the tokens it pools [B, N'], when the model has one.
        pixel_rule: the pixel rule placed (its bounds, for the z^B rule).
        layouts: windowed blocks' window layouts (hierarchical models), by block.
    """

    attn: dict[int, Tensor] = field(default_factory=dict)
    residuals: dict[int, Tensor] = field(default_factory=dict)
    patches: Tensor | None = None
    readout_attn: Tensor | None = None
    readout_selection: Tensor | None = None
    pixel_rule: r.ModuleRule | None = None
    layouts: dict[int, WindowLayout] = field(default_factory=dict)


class TraceSink(Sink):
    """Keeps the attention and the residual stream of the blocks from ``first`` on (and the pooling head's)."""

    def __init__(self, trace: Trace, first: int = 0):
        self.trace = trace
        self.first = first

    def wants(self, block: int, name: str) -> bool:
        if block == READOUT:
            return name in ("attn", "selection")
        return name in ("attn", "residual") and block >= self.first

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == READOUT:
            self.trace.readout_attn = tensors.get("attn", self.trace.readout_attn)
            self.trace.readout_selection = tensors.get("selection", self.trace.readout_selection)
            return
        if "attn" in tensors:
            self.trace.attn[block] = tensors["attn"]
        if "residual" in tensors:
            self.trace.residuals[block] = tensors["residual"]

    def layout(self, block: int, layout: WindowLayout) -> None:
        self.trace.layouts[block] = layout
