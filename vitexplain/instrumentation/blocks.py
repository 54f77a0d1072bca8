"""A Transformer block written out once per layout, shared by recording, token subsets and LRP.

A family describes each block (:class:`BlockParts`): its norms, its attention (:class:`AttentionParts`),
its feed-forward, its LayerScale gains and the order they come in (``layout``). :func:`block_forward`
computes the block's output from them exactly as the block's own ``forward`` does, hands the
recording fields to a sink, and does the residual adds and the LayerScale products with an
:class:`~vitexplain.instrumentation.attention.Arithmetic`, so that LRP rules reach them.

Layouts:

* ``pre_norm`` (ViT, DeiT, EVA, BEiT, transformers' ViT): x + γ₁·attn(LN₁ x), then + γ₂·mlp(LN₂ ·);
* ``res_post_norm`` (Swin V2, EVA post-norm): x + LN₁(attn(x)), then + LN₂(mlp(·));
* ``post_norm`` (BERT): h = LN₁(x + attn(x)), output = LN₂(h + mlp(h));
* ``parallel`` (ViT-22B's parallel block, timm's ``ParallelScalingBlock``): h = LN₁ x, output =
  x + γ₁·attn(h) + γ₂·mlp(h) (one LayerScale on the sum is γ₁ = γ₂; ``norm2`` unused).

Any layout but ``post_norm`` may end with a norm of the residual stream itself (:attr:`BlockParts.main_norm`:
timm's SwinV2-CR blocks, ``x = LN₃(x)`` after both adds, in the blocks its ``extra_norm`` settings pick); the block's
output is then not the sum of its input and branches, and is recorded as ``block_output``.

Windowed attention (Swin) is the same layout with :attr:`BlockParts.windows` set: the attention runs
on window batches (:mod:`.windows`).
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import Tensor, nn

from .attention import (
    NOTHING,
    PLAIN,
    Arithmetic,
    AttentionInput,
    AttentionParts,
    Recomputation,
    Sink,
    attend,
)

Layout = Literal["pre_norm", "res_post_norm", "post_norm", "parallel"]


@dataclass(frozen=True)
class BlockParts:
    """Where one Transformer block keeps its parts.

    Attributes:
        module: the block; its ``forward`` is replaced while the model is instrumented.
        attention: its attention.
        norm1, norm2: the norms of the layout (see the module docstring).
        mlp: the feed-forward branch (a module, or a callable of modules for families that split it).
        activation: the feed-forward's element-wise activation module (LRP places its rule there).
        gated_mlp: for a gated feed-forward (GLU, SwiGLU), the branch written out with its gating product
            done by the arithmetic: ``(h, arithmetic) -> branch``; used instead of ``mlp`` (also by a feed-forward
            with a bias kept apart from its Linear, added by the arithmetic as a constant offset).
        layout: ``pre_norm``, ``res_post_norm``, ``post_norm`` or ``parallel``.
        gamma1, gamma2: callables giving the LayerScale gains of the two branches, or None.
        drop1, drop2: dropouts on the two branches (eval identities; their places matter to absLRP).
        inputs: turns the block's call arguments into (tokens [B, N, C], :class:`AttentionInput`).
        output: turns the block's output tokens into what its ``forward`` returns (default: as they are).
        windows: windowed attention of a hierarchical model (see :mod:`.windows`), or None.
        main_norm: a norm of the residual stream after the block's adds (its output = main_norm(sum)), or None.
    """

    module: nn.Module
    attention: AttentionParts
    norm1: nn.Module
    norm2: nn.Module
    mlp: Callable[[Tensor], Tensor]
    activation: nn.Module | None = None
    gated_mlp: Callable[[Tensor, Arithmetic], Tensor] | None = None
    layout: Layout = "pre_norm"
    gamma1: Callable[[], Tensor] | None = None
    gamma2: Callable[[], Tensor] | None = None
    drop1: nn.Module | None = None
    drop2: nn.Module | None = None
    inputs: Callable[..., tuple[Tensor, AttentionInput]] = lambda x, *args, **kwargs: (x, AttentionInput())
    output: Callable[[Tensor, Tensor], Any] = lambda tokens, given: tokens
    windows: Any = None
    main_norm: nn.Module | None = None

    def heads_reason(self) -> str | None:
        """None when the attention branch is a plain sum over heads (each head's share can be read), else why not."""
        if self.layout == "res_post_norm":
            return "its blocks normalise the attention branch after the heads are summed (res-post-norm)"
        if self.main_norm is not None:
            return "its blocks normalise the residual stream after the branches are added"
        return self.attention.heads_reason()

    def head_projection(self) -> Tensor | None:
        """Per-head output projection [H, D, C] with the attention branch's LayerScale folded in (see
        :meth:`AttentionParts.head_projection`); None when the branch is not a plain sum over heads."""
        if self.heads_reason() is not None:
            return None
        return self.attention.head_projection(None if self.gamma1 is None else self.gamma1())


def _attention(parts: BlockParts, h: Tensor, extra: AttentionInput, arithmetic: Arithmetic, sink: Sink,
               index: int) -> Tensor:
    if parts.windows is not None:
        return parts.windows.attend(parts.attention, h, extra, arithmetic=arithmetic, sink=sink, block=index)
    return attend(parts.attention, h, extra, arithmetic=arithmetic, sink=sink, block=index)


def _branch(t: Tensor, drop: nn.Module | None, gamma: Callable[[], Tensor] | None, arithmetic: Arithmetic) -> Tensor:
    t = arithmetic.dropout(t, drop) if drop is not None else t
    return t if gamma is None else arithmetic.scale(t, gamma())


def _feed_forward(parts: BlockParts, h: Tensor, arithmetic: Arithmetic) -> Tensor:
    return parts.mlp(h) if parts.gated_mlp is None else parts.gated_mlp(h, arithmetic)


def _finished(parts: BlockParts, out: Tensor, sink: Sink, index: int) -> Tensor:
    """The block's output from the stream after its adds: the main norm's output where the block has one."""
    if parts.main_norm is None:
        if sink.wants(index, "block_output"):
            sink.put(index, block_output=out)
        return out
    out = parts.main_norm(out)
    sink.put(index, block_output=out)
    return out


def block_forward(parts: BlockParts, x: Tensor, extra: AttentionInput = AttentionInput(), *, index: int = -1,
                  arithmetic: Arithmetic = PLAIN, sink: Sink = NOTHING, detach_attention_input: bool = False) -> Tensor:
    """The block's output tokens [B, N, C] for its input tokens ``x``; recording fields go to ``sink``.

    With ``detach_attention_input`` the attention reads a detached copy of its input, so gradients
    reach it only through the residual path above.
    """
    sink.put(index, residual=x)

    def attention_of(h: Tensor) -> Tensor:
        sink.put(index, attn_input=h)
        if detach_attention_input:
            # an anchored attention is reached through its anchor: the copy then needs a gradient only for
            # q's, k's or v's, and without one no gradient is computed for them
            needed = sink.anchor(index) is None or any(sink.wants_gradient(index, name) for name in ("q", "k", "v"))
            h = h.detach().requires_grad_(torch.is_grad_enabled() and needed)
        return _attention(parts, h, extra, arithmetic, sink, index)

    if parts.layout == "pre_norm":
        attended = _branch(attention_of(parts.norm1(x)), parts.drop1, parts.gamma1, arithmetic)
        sink.put(index, attn_branch=attended)
        x = arithmetic.add(x, attended)
        h = parts.norm2(x)
        sink.put(index, mlp_residual=x, mlp_input=h)
        fed = _branch(_feed_forward(parts, h, arithmetic), parts.drop2, parts.gamma2, arithmetic)
        sink.put(index, mlp_branch=fed)
        return _finished(parts, arithmetic.add(x, fed), sink, index)
    if parts.layout == "parallel":  # both branches read the block's normed input; the MLP's is added second
        h = parts.norm1(x)
        attended = _branch(attention_of(h), parts.drop1, parts.gamma1, arithmetic)
        sink.put(index, attn_branch=attended)
        x = arithmetic.add(x, attended)
        sink.put(index, mlp_residual=x, mlp_input=h)
        fed = _branch(_feed_forward(parts, h, arithmetic), parts.drop2, parts.gamma2, arithmetic)
        sink.put(index, mlp_branch=fed)
        return _finished(parts, arithmetic.add(x, fed), sink, index)
    if parts.layout == "res_post_norm":
        attended = _branch(parts.norm1(attention_of(x)), parts.drop1, parts.gamma1, arithmetic)
        sink.put(index, attn_branch=attended)
        x = arithmetic.add(x, attended)
        sink.put(index, mlp_residual=x, mlp_input=x)
        fed = _branch(parts.norm2(_feed_forward(parts, x, arithmetic)), parts.drop2, parts.gamma2, arithmetic)
        sink.put(index, mlp_branch=fed)
        return _finished(parts, arithmetic.add(x, fed), sink, index)
    attended = _branch(attention_of(x), parts.drop1, parts.gamma1, arithmetic)
    sink.put(index, attn_branch=attended)
    h = parts.norm1(arithmetic.add(x, attended))
    sink.put(index, mlp_residual=h, mlp_input=h)
    fed = _branch(_feed_forward(parts, h, arithmetic), parts.drop2, parts.gamma2, arithmetic)
    sink.put(index, mlp_branch=fed)
    out = parts.norm2(arithmetic.add(h, fed))
    sink.put(index, block_output=out)
    return out


class _InTheBackward(Sink):
    """The sink of a block computed again in the backward (:func:`recomputed_block_forward`): it hands nothing of
    the forward over (the block's own tensors there are detached copies) but window layouts; while the backward
    computes the block again, it takes the attention's probabilities, values and output (:attr:`taken`) when the
    sink gives the block an anchor."""

    block_recomputed = True

    def __init__(self, sink: Sink):
        self.sink = weakref.ref(sink)  # the trace keeps its sink; a strong reference would tie the graph to it
        #: the attention's ``attn``, ``v`` and ``mixed`` (a fused attention's ``mixed`` alone) while the block is
        #: computed for a backward, else None
        self.taken: dict[str, Tensor] | None = None

    def wants(self, block: int, name: str) -> bool:
        return name == "mixed" and self.taken is not None

    def anchor(self, block: int) -> Tensor | None:
        return self.sink().anchor(block)

    def put(self, block: int, **tensors: Tensor) -> None:
        if self.taken is not None:
            self.taken.update((name, tensors[name]) for name in ("attn", "v", "mixed") if name in tensors)

    def layout(self, block: int, layout) -> None:
        self.sink().layout(block, layout)


class _RecomputedBlock(torch.autograd.Function):
    """A block's forward that keeps only its input for the backward and computes the block again there, in the
    context of its forward (LRP rules: :meth:`~.attention.Arithmetic.recomputing`), taking the backward through
    that graph, which is freed before the backward moves on to the block below. The same operations on the same
    input, so the same numbers (up to the rounding of the fused attention, in a forward that keeps its graph).
    Where a plain backward will come first (:attr:`~.attention.Recomputation.
    keeps_plain_graph`), the forward keeps its plain graph for that backward, which frees it as it passes.
    With an anchor (the sink reads the block's attention), the backward also passes when only the anchor is
    differentiated, and hands the probabilities and the gradients at them and at the attention's output to the
    sink (:meth:`~.attention.Sink.put_backward`)."""

    @staticmethod
    def forward(ctx, x: Tensor, anchor: Tensor | None, forward: Callable[[Tensor], Tensor], sink: _InTheBackward,
                block: int, context: Recomputation) -> Tensor:
        ctx.save_for_backward(x)
        ctx.block_forward, ctx.sink, ctx.block, ctx.context, ctx.handover = forward, sink, block, context, \
            anchor is not None
        ctx.kept = _computed(ctx, x, plain=True, fused=True) if context.keeps_plain_graph else None
        if ctx.kept is not None:
            return ctx.kept[1].detach()
        # the output as the graph would compute it (its values alone: the graph is not kept)
        with torch.enable_grad(), context(plain=True) as arithmetic:
            return forward(x.detach(), arithmetic=arithmetic).detach()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        kept, ctx.kept = ctx.kept, None  # the forward's plain graph serves the plain backward, once
        if kept is None or not ctx.context.plain_backward():
            (x,) = ctx.saved_tensors
            kept = _computed(ctx, x)
        leaf, out, taken = kept
        del kept
        taken = taken or {}
        read = [name for name in ("attn", "mixed") if name in taken and taken[name].requires_grad]
        found = torch.autograd.grad(out, [leaf, *(taken[name] for name in read)], grad, allow_unused=True)
        if ctx.handover:
            given = {name: gradient for name, gradient in zip(read, found[1:]) if gradient is not None}
            gradients = {name: given[name] if name in given else torch.zeros_like(taken[name])
                         for name in ("attn", "mixed") if name in taken}
            ctx.sink.sink().put_backward(ctx.block, {name: taken[name].detach() for name in ("attn", "v")
                                                     if name in taken}, gradients)
        return found[0], None, None, None, None, None


def _computed(ctx, x: Tensor, plain: bool = False, fused: bool = False) -> tuple[Tensor, Tensor,
                                                                                dict[str, Tensor] | None]:
    """The block's graph on a leaf copy of its input (``plain``, ``fused``: :class:`~.attention.Recomputation`):
    (leaf, output, the attention's tensors taken when the block hands them over)."""
    sink = ctx.sink
    sink.taken = {} if ctx.handover else None
    try:
        with torch.enable_grad(), ctx.context(plain, fused) as arithmetic:
            leaf = x.detach().requires_grad_(True)
            return leaf, ctx.block_forward(leaf, arithmetic=arithmetic), sink.taken
    finally:
        sink.taken = None


def recomputed_block_forward(parts: BlockParts, x: Tensor, extra: AttentionInput, *, index: int, sink: Sink,
                             context: Recomputation) -> Tensor:
    """:func:`block_forward` keeping only the block's input for the backward, where the block is computed again
    (``context``: how, :class:`~.attention.Recomputation`), so that the backward holds one block's tensors at a
    time. ``sink`` receives the block's input
    (``residual``), its window layouts and, in each backward, its attention (when it gives the block an anchor)."""
    if sink.wants(index, "residual"):
        sink.put(index, residual=x)
    quiet = _InTheBackward(sink)
    forward = functools.partial(block_forward, parts, extra=extra, index=index, sink=quiet)
    return _RecomputedBlock.apply(x, sink.anchor(index), forward, quiet, index, context)
