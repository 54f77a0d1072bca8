"""What Grad-ECLIP and CLIP Surgery share: one instrumented forward that keeps what some attentions compute, in the
graph (q, k, v, their output per head, the branch), and every token read through the model's head.

Neither method changes the model: the forward is the adapter's instrumented one (the model's own blocks written
out, every change undone on exit, also after an exception); Grad-ECLIP's ``heads="one"`` only computes the last
attention's scores differently in that written-out forward (:class:`OneHead`), and CLIP Surgery's v-v path is
computed beside the forward from what it keeps (methods/clip_surgery.py).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator, Mapping

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter, Readout, TokenGeometry, evaluation_mode
from ..instrumentation.attention import Arithmetic, Sink
from ..instrumentation.instrumented import READOUT
from ..instrumentation.targets import TargetLike
from ..instrumentation.windows import WindowLayout, stage_grids

__all__ = ["READOUT", "OneHead", "Taken", "geometry_of", "read_each", "taking"]


class Taken(Sink):
    """Keeps, as computed (in the graph), the tensors named in ``wanted`` (block index, or ``READOUT`` for an
    attention-pooling head -> names: ``q``, ``k``, ``v``, ``attn_logits``, ``attn``, ``mixed`` (the attention's
    output per head, A·v [B, H, N, D]), ``residual``, ``attn_branch``, ``block_output``), and every windowed
    block's layout."""

    def __init__(self, wanted: Mapping[int, Collection[str]]):
        self.wanted = {block: set(names) for block, names in wanted.items()}
        #: block -> name -> tensor
        self.taken: dict[int, dict[str, Tensor]] = {block: {} for block in wanted}
        #: block -> its window layout (windowed blocks only)
        self.layouts: dict[int, WindowLayout] = {}

    def wants(self, block: int, name: str) -> bool:
        return name in self.wanted.get(block, ())

    def put(self, block: int, **tensors: Tensor) -> None:
        for name, tensor in tensors.items():
            if self.wants(block, name):
                self.taken[block][name] = tensor

    def layout(self, block: int, layout: WindowLayout) -> None:
        self.layouts[block] = layout


class OneHead(Arithmetic):
    """The attention scores of one head over all channels, softmax(q kᵀ / √(H·D)), given to every head (so each
    head's A·v is that one head's output over its channels): the last attention as Grad-ECLIP's released code
    computes it. Asked only of the attentions whose scores are written out (those a :class:`Taken` wants ``attn``
    of); the others stay fused."""

    def __init__(self, scale: float, heads: int, head_dim: int):
        #: what turns the per-head q kᵀ · ``scale`` (the attention's own 1/√D) into q kᵀ / √(H·D)
        self.factor = 1 / (scale * math.sqrt(heads * head_dim))

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        merged = (q @ k.transpose(-2, -1)).sum(-3, keepdim=True) * self.factor
        return merged.expand(*q.shape[:-1], k.shape[-2])


@contextlib.contextmanager
def taking(adapter: ModelAdapter, images: Tensor, target: TargetLike, wanted: Mapping[int, Collection[str]], *,
           arithmetic: Arithmetic | None = None, gradient: bool = False) -> Iterator[tuple[Tensor, Taken]]:
    """One forward of ``images`` for ``target`` (a call on the model, :meth:`ModelAdapter.call`) in eval mode and
    float32, the blocks written out (:meth:`ModelAdapter.instrumented`): yields (outputs, the :class:`Taken` holding
    what ``wanted`` names). With ``gradient``, the graph starts at the last block's input (blocks below run without
    gradients), so a backward from the outputs reaches the last block and an attention-pooling head only; the
    model is restored when the block exits."""
    sink = Taken(wanted)
    with adapter.call(images, target) as call:
        instrumented = adapter.instrumented(sink=sink, arithmetic=arithmetic or Arithmetic(),
                                            gradient_from=adapter.num_blocks - 1 if gradient else None)
        with evaluation_mode(adapter.model), torch.set_grad_enabled(gradient), instrumented:
            yield adapter.forward(call.inputs), sink


def geometry_of(adapter: ModelAdapter, images: Tensor, sink: Taken) -> TokenGeometry:
    """Where the tokens of the forward ``sink`` watched sit (grid, prefix, stages of a windowed model), for
    ``patch_map`` (its readout is not read)."""
    grid = adapter.grid_size(images)
    layouts = [sink.layouts.get(index) for index in range(adapter.num_blocks)]
    return TokenGeometry(grid=grid, num_prefix_tokens=adapter.num_prefix_tokens,
                         class_token_index=adapter.class_token_index,
                         readout=Readout(adapter.readout, torch.empty(0)), stages=stage_grids(layouts, grid),
                         layouts=layouts)


def read_each(adapter: ModelAdapter, tokens: Tensor) -> Tensor:
    """Each of ``tokens`` [B, P, C] (last-block outputs, batch first) read by the model's head as if the whole
    sequence were copies of it -> [B, P, D]: the final norm, then whatever the readout takes of identical tokens
    (the class token, their mean or maximum, an attention pool's one value) is the token, then the projection or
    classifier — CLIP's ``ln_post(x) @ proj`` of every token."""
    batch, count, width = tokens.shape
    copies = tokens.reshape(batch * count, 1, width).expand(-1, adapter.num_prefix_tokens + 1, -1)
    if adapter.sequence_first:
        copies = copies.transpose(0, 1)
    with adapter.call(reads_target=False), evaluation_mode(adapter.model), torch.no_grad():
        return adapter.head(copies).reshape(batch, count, -1)
