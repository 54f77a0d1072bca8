"""Operation rules: the residual and position-embedding adds, attention products, scales, gates and dropouts of the
written-out blocks and attention (:mod:`vitexplain.instrumentation.blocks`,
:mod:`vitexplain.instrumentation.attention`) under a rule set.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import Tensor

from . import core


class AddRule:
    """A residual add under a rule: ``z`` (plain z-rule, Gradient×Input), ``normalised`` or ``absolute``."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        return operator.add(a, b)


class NormalisedAdd(AddRule):
    """Chefer et al.'s Eq. 7: the z-rule, then each side rescaled to its share |ΣR_a| / (|ΣR_a| + |ΣR_b|) of ΣR."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        return core.normalised_add(a, b)


class AbsoluteAdd(AddRule):
    """a + b under the absolute rule: R_a = (a + |a|) / |a + b| · R, each side rescaled to Σ|R| = 1."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        a, b = core.normalise_relevance(a), core.normalise_relevance(b)
        total = a + b
        return core.absolute_rule(total, total, a.abs() + b.abs())


def absolute_position(output: Tensor, patches: Tensor, num_prefix_tokens: int) -> Tensor:
    """The position-embedding add y = x + p under the absolute rule, applied at the module that follows it.

    The patch embeddings x receive (x + |x|) / |y| · R_y. The prefix tokens' relevance is dropped here,
    as Vukadin et al. drop the class token's right below this add; their renormalisation over all
    tokens is left to the patch convolution's input (it changes only a per-image factor).
    """
    patches = patches.reshape(output.shape[0], -1, output.shape[-1]).detach()
    kept = F.pad(1 + patches.sign(), (0, 0, num_prefix_tokens, 0))
    return core.with_gradient_of(output, output * (core.stabilised_sign(output) * kept).detach())


class AttentionRule:
    """The attention's products, softmax and constant offsets under a rule; the base class is Chefer et al.'s.

    Relevance of the probabilities passes unchanged to the scores; both products (q·kᵀ and A·v) give
    each operand half of the z-rule (Eq. 5 with the code's ``/ 2``) — but a learnt query (an
    attention-pooling head's) is a constant, so q·kᵀ is then a linear map of k, which takes all the
    relevance (the z-rule of a Linear); a constant added to a tensor (a
    position bias, a q / v bias kept apart from its Linear), like a Linear's bias under α1β0, takes
    none (the tensor without it gets all).
    """

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        if constant_query:
            return q.detach() @ k.transpose(-2, -1)
        return core.halved_product(q, k.transpose(-2, -1))

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return core.proportional(x + constant, x)

    def softmax(self, scores: Tensor) -> Tensor:
        return core.passes_unchanged(scores.softmax(dim=-1), scores)

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return core.halved_product(attn, v)

    def normalise(self, t: Tensor) -> Tensor:
        return core.passes_unchanged(F.normalize(t, dim=-1), t)

    def input(self, x: Tensor) -> Tensor:
        """The attention's input, read by all its projections."""
        return x


class ConstantAttention(AttentionRule):
    """Ali et al.'s AH-rule: the attention probabilities are constants, so A·v sends all relevance to v."""

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        return core.product(q, k.transpose(-2, -1), 0, 0)

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return x + constant

    def softmax(self, scores: Tensor) -> Tensor:
        return core.held_constant(scores.softmax(dim=-1))

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return core.product(attn, v, 0, 1)

    def normalise(self, t: Tensor) -> Tensor:
        return F.normalize(t, dim=-1)


class TaylorAttention(AttentionRule):
    """AttnLRP's attention (Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
    Transformers", ICML 2024).

    Softmax: the Taylor expansion at its input, bias term absorbed (Prop. 3.1), R_s = s ⊙ (R_A − A ΣR_A) over
    each row, which is exactly Gradient×Input through the softmax; both products: the ε-rule then the uniform
    rule, half of the relevance to each operand (Prop. 3.3: the base class's halved products); a constant added
    (position bias, a q / v bias kept apart from its Linear): the ε-rule, the constant absorbing its share;
    q / k normalisation: the identity rule (Prop. 3.4).
    """

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return x + constant

    def softmax(self, scores: Tensor) -> Tensor:
        return scores.softmax(dim=-1)


class _AbsoluteProduct(torch.autograd.Function):
    """left @ right under the absolute rule (:func:`.core.absolute_rule`, ``|left| @ |right|`` the absolute part), its
    magnitudes taken again in the backward instead of being kept: per block an attention map fewer."""

    @staticmethod
    def forward(ctx, left: Tensor, right: Tensor, phase: core.Phase | None) -> Tensor:
        ctx.phase = phase
        product = left @ right
        ctx.save_for_backward(left, right, product)
        return product

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        left, right, product = ctx.saved_tensors
        absolute = not core.is_plain(ctx.phase)
        if absolute:
            grad = grad * core.stabilised_sign(product)
        grad_left = grad_right = None
        if ctx.needs_input_grad[0]:
            grad_left = grad @ right.transpose(-2, -1)
            if absolute:
                grad_left = grad_left + left.sign() * (grad @ right.abs().transpose(-2, -1))
            grad_left = grad_left.sum_to_size(left.shape)
        if ctx.needs_input_grad[1]:
            grad_right = left.transpose(-2, -1) @ grad
            if absolute:
                grad_right = grad_right + right.sign() * (left.abs().transpose(-2, -1) @ grad)
            grad_right = grad_right.sum_to_size(right.shape)
        return grad_left, grad_right, None


class _AbsoluteSoftmax(torch.autograd.Function):
    """The softmax over the last dimension under the absolute rule (:meth:`AbsoluteAttention.softmax`):
    R_s = (s A + |s| softmax(|s|)) / A · R_A, so the gradient reaching s is g ⊙ sign(A) ⊙ (A + sign(s)
    softmax(|s|)); A and softmax(|s|) are computed again from s in the backward instead of being kept."""

    @staticmethod
    def forward(ctx, scores: Tensor, phase: core.Phase | None) -> Tensor:
        ctx.phase = phase
        ctx.save_for_backward(scores)
        return scores.softmax(dim=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (scores,) = ctx.saved_tensors
        probabilities = scores.softmax(dim=-1)
        if core.is_plain(ctx.phase):
            return probabilities * (grad - (grad * probabilities).sum(-1, keepdim=True)), None
        grad = grad * core.stabilised_sign(probabilities)
        return grad * (probabilities + scores.sign() * scores.abs().softmax(dim=-1)), None


class AbsoluteAttention(AttentionRule):
    """Vukadin et al.'s absolute rule on the products, the softmax (row max and sum constant) and the offsets."""

    @staticmethod
    def _product(left: Tensor, right: Tensor) -> Tensor:
        left, right = core.normalise_relevance(left), core.normalise_relevance(right)
        if not torch.is_grad_enabled():
            return left @ right
        return _AbsoluteProduct.apply(left, right, core.current_phase())

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        return self._product(q.detach() if constant_query else q, k.transpose(-2, -1))

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        x = core.normalise_relevance(x)
        total = x + constant
        return core.absolute_rule(total, x, x.abs())

    def softmax(self, scores: Tensor) -> Tensor:
        """Their ``SoftmaxAttention``: exp(s - max) / Σ with max and Σ detached, so the Jacobian is diag(A);
        the absolute version is the softmax of |s|: R_s = (s A + |s| softmax(|s|)) / A · R_A."""
        scores = core.normalise_relevance(scores)
        if not torch.is_grad_enabled():
            return scores.softmax(dim=-1)
        return _AbsoluteSoftmax.apply(scores, core.current_phase())

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return self._product(attn, v)

    def input(self, x: Tensor) -> Tensor:
        return core.normalise_relevance(x)


class ScaleRule:
    """LayerScale x·γ: Gradient×Input through a diagonal linear map (the z-rule)."""

    def __call__(self, x: Tensor, gamma: Tensor) -> Tensor:
        return x * gamma


class AbsoluteScale(ScaleRule):
    """LayerScale as a diagonal Linear under the absolute rule (γ taken in absolute value, like a weight)."""

    def __call__(self, x: Tensor, gamma: Tensor) -> Tensor:
        x = core.normalise_relevance(x)
        output = x * gamma
        return core.absolute_rule(output, output, x.abs() * gamma.detach().abs())


class GateRule:
    """A gating product value ⊙ gate (GLU feed-forwards, gated attention): the gate is held constant and the
    value takes all relevance (the "signal-take-all" rule of Arras et al., 2017, for LSTM gates)."""

    def __call__(self, value: Tensor, gate: Tensor) -> Tensor:
        if core.current_phase() is not None:  # the plain gradient reaches the gate too
            return core.with_gradient_of(value * gate, value * gate.detach())
        return value * gate.detach()


class UniformGate(GateRule):
    """AttnLRP's uniform rule for an element-wise product of two inputs (Prop. 3.2): value and gate each take
    half of the relevance (LXT's ``divide_gradient(..., 2)`` after a gated feed-forward's product)."""

    def __call__(self, value: Tensor, gate: Tensor) -> Tensor:
        gated = value * gate
        return core.with_gradient_of(gated, gated / 2)


def absolute_passthrough(x: Tensor) -> Tensor:
    """An eval-mode dropout (the identity) under the absolute rule: R kept, doubled, where x > 0, dropped
    where x < 0, after x's relevance is rescaled to Σ|R| = 1."""
    x = core.normalise_relevance(x)
    return core.absolute_rule(x, x, x.abs())
