"""Self-attention written out once, with the variants Vision Transformers use, for recording and for LRP.

A family describes where its attention keeps its parts (:class:`AttentionParts`); :func:`attend`
computes softmax(q kᵀ / √D + bias) v from them, exactly as the family's own module does, but
unfused, so that q, k, v, the scores and the probabilities can be handed to a recorder, and with the
operations that carry relevance (the two products, the softmax, the bias and gate) done by an
:class:`Arithmetic`: plainly when recording, under LRP rules in :mod:`vitexplain.instrumentation.lrp`.

Variants, all in the one function:

* projections: one fused ``qkv`` Linear (timm), a bias-free ``qkv`` plus separate q / v biases
  (EVA, BEiT), three Linears (EVA unfused, transformers), or a query from a learnt latent and a fused
  ``kv`` Linear (the attention-pooling head of SigLIP-style models); grouped-query heads repeated;
* q / k normalisation; rotary position embedding on the patch tokens (EVA02, timm's RoPE ViTs);
* scores: scaled dot products, or cosine similarity times a learnt per-head scale (Swin V2);
* an additive position bias over the tokens present (BEiT, relative-position ViTs, Swin) and masks;
* after mixing: an output norm, a sigmoid gate, the output projection.

Windowed attention (Swin) runs this same function on window batches (:mod:`.windows`).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Arithmetic:
    """The operations of a written-out forward that carry relevance, computed plainly.

    LRP rule sets subclass this and change how each operation propagates relevance backwards while
    keeping its forward value; recording uses it as it is.
    """

    #: whether the attention must be written out even when nothing of it is recorded
    explicit = False

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """A residual add (or the position-embedding add)."""
        return a + b

    def scale(self, x: Tensor, gamma: Tensor) -> Tensor:
        """LayerScale: x · γ."""
        return x * gamma

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        """q kᵀ [..., N, M] (q already scaled; ``constant_query``: q is learnt, not computed from the input)."""
        return q @ k.transpose(-2, -1)

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        """x plus a constant of the input: a position bias on the scores, a bias kept apart from its Linear."""
        return x + constant

    def softmax(self, scores: Tensor) -> Tensor:
        return scores.softmax(dim=-1)

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        """A v."""
        return attn @ v

    def normalise(self, t: Tensor) -> Tensor:
        """t / ||t|| over the last axis (cosine attention)."""
        return F.normalize(t, dim=-1)

    def gate(self, value: Tensor, gate: Tensor) -> Tensor:
        """value ⊙ gate (gated attention, GLU feed-forwards)."""
        return value * gate

    def attention_input(self, x: Tensor) -> Tensor:
        """The attention's input, read by all its projections (one layer to LRP's absolute rule)."""
        return x

    def dropout(self, t: Tensor, module: nn.Module | None) -> Tensor:
        """An eval-mode dropout of the forward (``module`` None: a position where the reference ViT has one)."""
        return t if module is None else module(t)

    def recomputing(self) -> Recomputation | None:
        """Where a block under this arithmetic is computed again in the backward instead of keeping its tensors
        (N×N matrices included) from the forward: how to compute it as this forward did (:class:`Recomputation`);
        None: the block's tensors are kept (plain arithmetic, or no gradient will pass it). See
        :func:`~.blocks.recomputed_block_forward`."""
        return None


class Recomputation(Protocol):
    """How a block is computed again in the backward (:meth:`Arithmetic.recomputing`).

    Called, it gives the context that computes the block as its forward did (an autograd backward may run on
    another thread), yielding the arithmetic to compute it with; ``plain=True`` for a computation whose plain
    graph alone is read (the forward's values, a plain backward's gradient), with ``fused=True`` its attention by
    PyTorch's fused kernel (the forward whose graph is kept for the plain backward, which reads the gradient at
    the attention's output A·v alone).
    """

    #: whether a plain backward will pass the block after the forward; its forward then keeps the plain graph for
    #: it (that backward computes nothing again), freed as that backward passes the block
    keeps_plain_graph: bool

    def plain_backward(self) -> bool:
        """Whether the backward passing the block now is that plain one."""

    def __call__(self, plain: bool = False, fused: bool = False) -> contextlib.AbstractContextManager[Arithmetic]:
        ...


PLAIN = Arithmetic()


class Sink:
    """Receives what a written-out forward computes; the base class keeps nothing."""

    #: the forward handing over is a block's computed again in the backward (:func:`~.blocks.recomputed_block_forward`),
    #: whose attention then keeps its matrices in that block's graph, freed with it
    block_recomputed = False

    def wants(self, block: int, name: str) -> bool:
        return False

    def wants_gradient(self, block: int, name: str) -> bool:
        """Whether the gradient of block's ``name`` is wanted (however it is delivered)."""
        return False

    def put(self, block: int, **tensors: Tensor) -> None:
        pass

    def anchor(self, block: int) -> Tensor | None:
        """A leaf requiring a gradient when block's scores and probabilities are to be handed over in the
        backward (:meth:`put_backward`) rather than kept from the forward; None otherwise.

        The attention then saves q, k and v instead of an N×N matrix and computes its probabilities
        again as the backward passes it; it depends on the anchor (adding nothing to it), so a backward
        to the anchor passes every such attention even where its input is detached."""
        return None

    def put_backward(self, block: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        """Block's ``attn_logits`` and ``attn`` and their gradients, as the backward passes its attention
        (only for blocks with an :meth:`anchor`). Under an arithmetic that computes the block again
        (:meth:`Arithmetic.recomputing`): ``attn`` and ``v`` and the gradients at ``attn`` and at the attention's
        output ``mixed`` (A·v, [B, H, N, D]), in each backward under that arithmetic."""

    def layout(self, block: int, layout) -> None:
        """A windowed block's :class:`~.windows.WindowLayout` for this forward (how its windows map to tokens)."""


NOTHING = Sink()


@dataclass(frozen=True)
class AttentionParts:
    """Where one attention module keeps its parts (only what the module has is given).

    Attributes:
        module: the module; its ``forward`` is replaced while the model is instrumented.
        num_heads: H (query heads).
        head_dim: D.
        scale: the factor of q kᵀ (1/√D); unused with ``logit_scale``.
        proj: the output projection from the concatenated heads to the width (None when the caller
            projects, as transformers' BERT self-attention).
        qkv: one Linear giving q, k and v (heads laid out as [3, H, D]).
        qkv_bias: the bias added to a bias-free ``qkv`` (EVA, BEiT: q bias, zeros, v bias), a callable
            returning it, as those modules build it on each call.
        query, key, value: three Linears instead of ``qkv``.
        kv: one Linear giving k and v, with ``latent`` the learnt queries fed to ``query`` (attention pooling).
        kv_heads: heads of k and v when fewer than H (grouped-query attention; repeated to H).
        q_norm, k_norm: per-head norms of q and k.
        rope_prefix: with rotary embeddings, the leading tokens that do not rotate (None: no RoPE).
        rotate_half: RoPE layout (rotate halves instead of interleaved pairs).
        position_bias: callable giving the additive bias over the whole sequence [1 or B, H, N, N].
        logit_scale: cosine attention: callable giving the per-head scale of the cosine scores [H, 1, 1].
        output_norm: norm of the concatenated heads before the projection.
        gate: Linear of a sigmoid gate applied to the concatenated heads.
        attn_drop, proj_drop: the module's dropouts (identities in eval mode; their places matter to absLRP).
    """

    module: nn.Module
    num_heads: int
    head_dim: int
    scale: float
    proj: nn.Module | None
    qkv: nn.Linear | None = None
    qkv_bias: Callable[[], Tensor] | None = None
    query: nn.Linear | None = None
    key: nn.Linear | None = None
    value: nn.Linear | None = None
    kv: nn.Linear | None = None
    latent: Tensor | None = None
    kv_heads: int | None = None
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    rope_prefix: int | None = None
    rotate_half: bool = False
    position_bias: Callable[[], Tensor] | None = None
    logit_scale: Callable[[], Tensor] | None = None
    output_norm: nn.Module | None = None
    gate: nn.Linear | None = None
    attn_drop: nn.Module | None = None
    proj_drop: nn.Module | None = None

    @property
    def projections(self) -> tuple[nn.Linear, ...]:
        """The Linears that read the attention's input (one layer to LRP's absolute rule)."""
        found = (self.qkv, self.key, self.value, self.kv) if self.latent is not None else (
            self.qkv, self.query, self.key, self.value, self.kv, self.gate)
        return tuple(linear for linear in found if linear is not None)

    def heads_reason(self) -> str | None:
        """None when the output is a plain sum over heads of a Linear projection, else what stands in the way."""
        if self.proj is None or not isinstance(self.proj, nn.Linear):
            return "its attention's output projection is not a Linear"
        if self.gate is not None:
            return "its attention gates the heads' output"
        if not _is_identity(self.output_norm):
            return (f"its attention normalises the heads' output ({type(self.output_norm).__name__}) "
                    "before projecting it")
        return None

    def head_projection(self, gamma: Tensor | None = None) -> Tensor | None:
        """The output projection per head [H, D, C] (``gamma`` — a LayerScale gain — folded in), so that
        ``v_h @ result[h]`` is head h's share of the branch; None when the output is not a plain sum
        over heads (:meth:`heads_reason`)."""
        if self.heads_reason() is not None:
            return None
        with torch.no_grad():
            weight = self.proj.weight  # [C, H*D]
            per_head = weight.t().reshape(self.num_heads, self.head_dim, weight.shape[0])
            return per_head if gamma is None else per_head * gamma


#: the largest logit scale of Swin V2's cosine attention, log(1 / 0.01): the temperature τ stays above 0.01
MAX_LOGIT_SCALE = math.log(1.0 / 0.01)


def clamped_logit_scale(attn: nn.Module) -> Callable[[], Tensor]:
    """Swin V2's per-head scale of the cosine scores [H, 1, 1]: exp(min(``attn.logit_scale``, log 100)), i.e. 1/τ of
    Liu et al. (Swin Transformer V2, CVPR 2022, Eq. 2) with τ > 0.01, as timm's (V2, V2-CR) and torchvision's modules
    clamp it; the parameter is read on each call, in whatever shape the module keeps it ([H, 1, 1] or [H])."""
    return lambda: torch.clamp(attn.logit_scale, max=MAX_LOGIT_SCALE).exp().reshape(-1, 1, 1)


def _is_identity(module: nn.Module | None) -> bool:
    return module is None or isinstance(module, nn.Identity)


@dataclass
class AttentionInput:
    """What one call of an attention sees besides its input tokens.

    Attributes:
        rope: rotary sin/cos table of the rotating tokens ([N', dim] or with leading batch / head axes).
        bias: an additive bias over the whole sequence shared by the blocks [1 or B, H, N, N] (BEiT, relative
            position ViTs), added to the attention's own ``position_bias``.
        mask: attention mask: additive float, or boolean (True = attend), broadcastable to the scores.
        positions: for a token subset, the sequence positions of the tokens present [B, N'] (prefix
            included), used to cut ``position_bias``; None when the whole sequence is present.
        grid: for windowed attention, the token grid (h, w) the tokens lie on (row-major).
    """

    rope: Tensor | None = None
    bias: Tensor | None = None
    mask: Tensor | None = None
    positions: Tensor | None = None
    grid: tuple[int, int] | None = None


def _heads(t: Tensor, heads: int) -> Tensor:
    """[B, N, heads·D] -> [B, heads, N, D]."""
    batch, tokens, _ = t.shape
    return t.reshape(batch, tokens, heads, -1).transpose(1, 2)


def project(parts: AttentionParts, x: Tensor, extra: AttentionInput,
            arithmetic: Arithmetic = PLAIN) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [B, H, N, D] of the tokens ``x`` [B, N, C]: projections, biases, q/k norms, RoPE, repeated kv heads.

    q is before the 1/√D scale.
    """
    heads, kv_heads = parts.num_heads, parts.kv_heads or parts.num_heads
    if parts.latent is not None:
        q = _heads(parts.query(parts.latent.expand(x.shape[0], -1, -1)), heads)
        k, v = _heads(parts.kv(x), 2 * kv_heads).chunk(2, dim=1)
    elif parts.qkv is not None:
        fused = parts.qkv(x)
        if parts.qkv_bias is not None:
            fused = arithmetic.offset(fused, parts.qkv_bias())
        batch, tokens, _ = fused.shape
        q, k, v = fused.reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q, k, v = _heads(parts.query(x), heads), _heads(parts.key(x), kv_heads), _heads(parts.value(x), kv_heads)
    if parts.q_norm is not None:
        q = parts.q_norm(q)
    if parts.k_norm is not None:
        k = parts.k_norm(k)
    if parts.rope_prefix is not None and extra.rope is not None:
        q, k = (_rotate(t, extra.rope, parts.rope_prefix, parts.rotate_half).type_as(v) for t in (q, k))
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    return q, k, v


def _rotate(t: Tensor, rope: Tensor, prefix: int, half: bool) -> Tensor:
    """RoPE on the tokens after the first ``prefix`` (timm's ``apply_rot_embed_cat``)."""
    from timm.layers import apply_rot_embed_cat

    return torch.cat([t[:, :, :prefix], apply_rot_embed_cat(t[:, :, prefix:], rope, half=half)], dim=2)


def cut_bias(bias: Tensor, positions: Tensor | None) -> Tensor:
    """A bias over the whole sequence [1 or B, H, N, N] cut to the tokens at ``positions`` [B, N'] -> [B, H, N', N']."""
    bias = bias if bias.ndim == 4 else bias[None]
    if positions is None:
        return bias
    rows = positions[:, None, :, None]
    cols = positions[:, None, None, :]
    full = bias.expand(positions.shape[0], *bias.shape[1:])
    return full[torch.arange(positions.shape[0], device=bias.device)[:, None, None, None],
                torch.arange(bias.shape[1], device=bias.device)[None, :, None, None], rows, cols]


def additive_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A mask as additive scores: float masks as they are, boolean ones (True = attend) as 0 / the dtype's lowest
    value."""
    if mask is None or mask.dtype.is_floating_point:
        return mask if mask is None else mask.to(dtype)
    if mask.dtype != torch.bool:
        raise TypeError(f"cannot record attention under a {mask.dtype} attention mask")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def _scores(arithmetic: Arithmetic, q_scaled: Tensor, k_scored: Tensor, bias: Tensor | None, mask: Tensor | None,
            constant_query: bool = False) -> Tensor:
    """The scores before the softmax: q kᵀ (q already scaled), plus the position bias and the mask."""
    logits = arithmetic.scores(q_scaled, k_scored, constant_query=constant_query)
    if bias is not None:
        logits = arithmetic.offset(logits, bias)
    return logits if mask is None else logits + mask


def _fused(q_scaled: Tensor, k_scored: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None) -> Tensor:
    """softmax(q kᵀ + bias + mask) v by PyTorch's fused attention (no N×N matrix kept for the backward)."""
    both = bias if mask is None else (mask if bias is None else bias + mask)
    return F.scaled_dot_product_attention(q_scaled, k_scored, v, attn_mask=both, scale=1.0)


class _RecomputedAttention(torch.autograd.Function):
    """softmax(scores) v whose backward computes the scores and probabilities again, written out, and hands
    them and their gradients to the sink.

    The forward is the fused attention of a block that records nothing, keeping q, k and v for the
    backward, not an N×N matrix. Plain arithmetic in eval mode (attention dropout is the identity), as
    recording runs; the backward's gradients are those of the written-out attention.
    """

    @staticmethod
    def forward(ctx, q_scaled: Tensor, k_scored: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
                anchor: Tensor, sink: Sink, block: int) -> Tensor:
        ctx.save_for_backward(q_scaled, k_scored, v, bias, mask)
        ctx.sink, ctx.block = weakref.ref(sink), block  # a strong one would tie the graph to what the sink keeps
        return _fused(q_scaled, k_scored, v, bias, mask)

    @staticmethod
    def backward(ctx, grad_mixed: Tensor) -> tuple[Tensor | None, ...]:
        q_scaled, k_scored, v, bias, mask = ctx.saved_tensors
        sink, needs = ctx.sink(), ctx.needs_input_grad
        logits_gradient = sink.wants_gradient(ctx.block, "attn_logits")
        with torch.enable_grad():  # the scores' and the softmax's own backward, as in the written-out graph
            leaves = {position: None if t is None else t.detach().requires_grad_(needs[position])
                      for position, t in ((0, q_scaled), (1, k_scored), (3, bias))}
            logits = _scores(PLAIN, leaves[0], leaves[1], leaves[3], mask)
            differentiable = {position: t for position, t in leaves.items() if t is not None and t.requires_grad}
            if logits_gradient and not differentiable:
                logits.requires_grad_(True)
            attn = PLAIN.softmax(logits)
        grads: list[Tensor | None] = [None] * 8  # one per input of forward
        gradients = {"attn": grad_mixed @ v.transpose(-2, -1)}
        if needs[2]:
            grads[2] = attn.detach().transpose(-2, -1) @ grad_mixed
        handed = {"attn": attn.detach()}
        if sink.wants(ctx.block, "attn_logits"):
            handed["attn_logits"] = logits.detach()
        wrt = ([logits] if logits_gradient else []) + list(differentiable.values())
        del logits  # the softmax's backward reads its output: the scores are kept only where asked for
        if not logits_gradient:  # handed over before the softmax's backward: fewer N×N matrices at once
            sink.put_backward(ctx.block, handed, gradients)
        if wrt:
            found = list(torch.autograd.grad(attn, wrt, gradients["attn"]))
            if logits_gradient:
                gradients["attn_logits"] = found.pop(0)
            for position, gradient in zip(differentiable, found):
                grads[position] = gradient
        if logits_gradient:
            sink.put_backward(ctx.block, handed, gradients)
        return tuple(grads)


def attend(parts: AttentionParts, x: Tensor, extra: AttentionInput = AttentionInput(), *,
           arithmetic: Arithmetic = PLAIN, sink: Sink = NOTHING, block: int = -1) -> Tensor:
    """The attention's output for tokens ``x`` [B, N, C], as the module computes it.

    Hands ``q``, ``k``, ``v``, ``attn_logits`` and ``attn`` of block ``block`` to ``sink`` when it wants
    them; when it wants neither the scores nor the probabilities and the arithmetic is plain, they are
    never materialised (PyTorch's fused attention runs instead). When the sink gives the block an
    :meth:`~Sink.anchor`, the scores and probabilities reach it in the backward instead
    (:meth:`~Sink.put_backward`), and no N×N matrix is kept from the forward.
    """
    q, k, v = project(parts, arithmetic.attention_input(x), extra, arithmetic)
    biases = [cut_bias(b, extra.positions) for b in (parts.position_bias and parts.position_bias(), extra.bias)
              if b is not None]
    bias = sum(biases[1:], biases[0]) if biases else None
    mask = additive_mask(extra.mask, q.dtype)
    anchor = sink.anchor(block)
    explicit = arithmetic.explicit or sink.wants(block, "attn_logits") or sink.wants(block, "attn")
    if parts.logit_scale is not None:  # cosine scores: q and k are recorded as projected, not normalised
        q_scaled, k_scored = arithmetic.normalise(q) * parts.logit_scale(), arithmetic.normalise(k)
    else:
        q_scaled, k_scored = q * parts.scale, k
    if anchor is not None and not sink.block_recomputed:
        sink.put(block, q=q, k=k, v=v)
        mixed = _RecomputedAttention.apply(q_scaled, k_scored, v, bias, mask, anchor, sink, block)
    elif explicit:
        logits = _scores(arithmetic, q_scaled, k_scored, bias, mask, constant_query=parts.latent is not None)
        attn = arithmetic.dropout(arithmetic.softmax(logits), parts.attn_drop)
        mixed = arithmetic.mix(attn, v)
        sink.put(block, q=q, k=k, v=v, attn_logits=logits, attn=attn, mixed=mixed)
    else:
        if any(sink.wants(block, name) for name in ("q", "k", "v")):
            sink.put(block, q=q, k=k, v=v)
        mixed = _fused(q_scaled, k_scored, v, bias, mask)
        if sink.wants(block, "mixed"):
            sink.put(block, mixed=mixed)
    out = mixed.transpose(1, 2).reshape(x.shape[0], mixed.shape[2], -1)
    if parts.output_norm is not None:
        out = parts.output_norm(out)
    if parts.gate is not None:
        out = arithmetic.gate(out, parts.gate(x).sigmoid())  # the gate reads the attention's input
    if parts.proj is not None:
        out = parts.proj(out)
    return out if parts.proj_drop is None else arithmetic.dropout(out, parts.proj_drop)
