"""The machinery every LRP rule stands on: the phases of one forward (the plain gradient beside the relevance) and
the gradient trick.

Every rule is written in Gradient×Input form: under the rules, the relevance of any tensor ``t`` of the forward
is ``t * dscore/dt``. A layer gets its rule by the "gradient trick" — its output keeps its value but hands its
gradient to a surrogate ``z`` (:func:`with_gradient_of`; :func:`proportional` scales it on the way) — or, for
the attention products, the normalised residual add and the relevance renormalisation, by a small autograd
Function here. Within :func:`both_gradients` one forward serves a plain gradient and the relevance; a block
computed plainly (for the plain gradient, or for its values alone) forms no surrogate (:func:`rules_apply`).
The z-rule divisions use Chefer et al.'s stabiliser: the denominator moved :data:`STABILISER` away from zero,
and zero where it is exactly zero; the absolute rule divides by |y| + :data:`STABILISER`, as Vukadin et al.'s
code, and by Σ|R| moved likewise.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

STABILISER = 1e-9


# -- the plain gradient beside the relevance ----------------------------------------------------
class Phase:
    """Which gradient the next backward computes through a forward that kept both graphs (:func:`both_gradients`):
    the plain gradient while ``plain`` is True, the rules' (relevance) otherwise."""

    def __init__(self) -> None:
        self.plain = False


_PHASE: contextvars.ContextVar[Phase | None] = contextvars.ContextVar("lrp_phase", default=None)
#: True while a block is computed for the plain gradient or its values alone (:class:`RestoredPhase`): only its plain
#: graph is read
_PLAIN_RECOMPUTATION: contextvars.ContextVar[bool] = contextvars.ContextVar("lrp_plain_recomputation", default=False)


def current_phase() -> Phase | None:
    """The :class:`Phase` of the :func:`both_gradients` block now (None outside one): a rule's autograd Function keeps
    it, so that its backward knows which gradient it computes."""
    return _PHASE.get()


def is_plain(phase: Phase | None) -> bool:
    """Whether a backward through a rule's output, formed in ``phase``, is the plain one of :func:`both_gradients`."""
    return phase is not None and phase.plain


@contextlib.contextmanager
def both_gradients() -> Iterator[Phase]:
    """Within the block, a forward under rules keeps the plain graph beside the rules' graph.

    Each rule's output then holds its value with both graphs, and a backward through it follows the
    plain graph or the rule's as the yielded :class:`Phase` says at the time of that backward — so one
    forward serves a plain gradient and the relevance (transformer attribution needs both). Without
    it, the plain graph of a rule's output is dropped as soon as the rule is applied.
    """
    phase = Phase()
    token = _PHASE.set(phase)
    try:
        yield phase
    finally:
        _PHASE.reset(token)


class RestoredPhase:
    """The phase of now (:attr:`phase`, None outside :func:`both_gradients`), restorable by calling this: for a
    forward computed again in a backward, which may run on another thread.

    The context yields whether the forward is plain: one computed for the plain backward, or one read for its
    values alone (``plain=True``), needs only the plain graph, so within the context the module rules stand
    aside (:func:`rules_apply`) — the plain phase's backward through a rule's output reaches only the plain
    computation of its value anyway, and a rule keeps its output's value.
    """

    def __init__(self) -> None:
        self.phase = current_phase()

    def plain_now(self) -> bool:
        """Whether the backward running now is the plain one of :func:`both_gradients`."""
        return is_plain(self.phase)

    @contextlib.contextmanager
    def __call__(self, plain: bool = False) -> Iterator[bool]:
        plain = plain or self.plain_now()
        token, plain_token = _PHASE.set(self.phase), _PLAIN_RECOMPUTATION.set(plain)
        try:
            yield plain
        finally:
            _PLAIN_RECOMPUTATION.reset(plain_token)
            _PHASE.reset(token)


def rules_apply() -> bool:
    """Whether a rule placed on a module forms its surrogate now: a gradient will be taken, and not by the plain
    backward, or a forward read for its values alone (:class:`RestoredPhase`), which read the plain graph alone."""
    return torch.is_grad_enabled() and not _PLAIN_RECOMPUTATION.get()


# -- the gradient trick and its helpers ---------------------------------------------------------
def safe_divide(numerator: Tensor, denominator: Tensor, stabiliser: float | None = None) -> Tensor:
    """numerator / denominator, the denominator moved ``stabiliser`` (default :data:`STABILISER`) away
    from zero; 0 where it is 0."""
    stabiliser = STABILISER if stabiliser is None else stabiliser
    shift = torch.copysign(torch.tensor(stabiliser, dtype=denominator.dtype), denominator)  # -0.0 is masked below
    return (numerator / (denominator + shift)).masked_fill_(denominator == 0, 0)


def stabilised_sign(value: Tensor) -> Tensor:
    """value / (|value| + ε): the absolute rule's R_y / |y| from the Gradient×Input gradient R_y / y."""
    return value / (value.abs() + STABILISER)


class _RuleGradient(torch.autograd.Function):
    """``value`` in the forward; in the backward the incoming gradient, times ``scale`` when one is given, goes
    to ``surrogate`` — or, in the plain phase of :func:`both_gradients`, unchanged to ``value``.

    ``scale=None`` with ``by_magnitude``: the scale is :func:`stabilised_sign` ``value``, computed in the backward
    from ``value`` (whose storage the next layer keeps anyway) rather than kept as a tensor of its own.
    """

    @staticmethod
    def forward(ctx, value: Tensor, surrogate: Tensor, scale: Tensor | None, phase: Phase | None,
                by_magnitude: bool = False) -> Tensor:
        ctx.phase, ctx.by_magnitude = phase, by_magnitude
        ctx.save_for_backward(value if by_magnitude else scale)
        return value.view_as(value)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        if is_plain(ctx.phase):
            return grad if ctx.needs_input_grad[0] else None, None, None, None, None
        if not ctx.needs_input_grad[1]:
            return None, None, None, None, None
        (saved,) = ctx.saved_tensors
        scale = stabilised_sign(saved) if ctx.by_magnitude else saved
        return None, grad if scale is None else grad * scale, None, None, None


def _rule_gradient(value: Tensor, surrogate: Tensor, scale: Tensor | None, by_magnitude: bool = False) -> Tensor:
    phase = current_phase()
    return _RuleGradient.apply(value if phase is not None else value.detach(), surrogate, scale, phase, by_magnitude)


def with_gradient_of(value: Tensor, surrogate: Tensor) -> Tensor:
    """``value`` in the forward, the gradient of ``surrogate`` in the backward."""
    if not torch.is_grad_enabled():
        return value
    return _rule_gradient(value, surrogate, None)


def held_constant(value: Tensor) -> Tensor:
    """``value`` with no gradient under the rules (a plain gradient still passes it in :func:`both_gradients`)."""
    return with_gradient_of(value, value.detach())


def proportional(value: Tensor, contributions: Tensor, stabiliser: float | None = None) -> Tensor:
    """z-rule gradient trick: ``value``'s relevance flows back in proportion to ``contributions``.

    ``contributions`` must be a sum of per-input contributions, linear in the inputs that should
    receive relevance (e.g. W⁺x⁺ + W⁻x⁻ for LRP-αβ); each output's relevance is shared among its
    inputs as their contributions are shared in ``contributions``.
    """
    if not torch.is_grad_enabled():
        return value
    with torch.no_grad():
        scale = safe_divide(value, contributions, stabiliser)
    return _rule_gradient(value, contributions, scale)


def passes_unchanged(value: Tensor, given: Tensor) -> Tensor:
    """Relevance of ``value`` passes unchanged to ``given`` (element by element; unstabilised, as the rule
    divides nothing: relevance cannot sit on an input that is exactly 0)."""
    return proportional(value, given, stabiliser=0.0)


class _Product(torch.autograd.Function):
    """left @ right; the backward gives each operand its share of the gradient (the whole in the plain phase)."""

    @staticmethod
    def forward(ctx, left: Tensor, right: Tensor, shares: tuple[float, float], phase: Phase | None) -> Tensor:
        ctx.rule_shares, ctx.phase = shares, phase
        # heads cut from a fused projection: copied once, not per product
        left, right = left.contiguous(), right.contiguous()
        ctx.save_for_backward(left, right)
        return left @ right

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        left, right = ctx.saved_tensors
        share_left, share_right = (1.0, 1.0) if is_plain(ctx.phase) else ctx.rule_shares
        grad_left = grad_right = None
        if ctx.needs_input_grad[0] and share_left:
            shared = grad if share_left == 1 else grad * share_left
            grad_left = (shared @ right.transpose(-2, -1)).sum_to_size(left.shape)
        if ctx.needs_input_grad[1] and share_right:
            shared = grad if share_right == 1 else grad * share_right
            grad_right = (left.transpose(-2, -1) @ shared).sum_to_size(right.shape)
        return grad_left, grad_right, None, None


def product(left: Tensor, right: Tensor, share_left: float, share_right: float) -> Tensor:
    """left @ right, each operand receiving its share of the z-rule relevance (0: held constant)."""
    if not torch.is_grad_enabled():
        return left @ right
    return _Product.apply(left, right, (share_left, share_right), current_phase())


def halved_product(left: Tensor, right: Tensor) -> Tensor:
    """left @ right, giving each operand half of the z-rule relevance (Chefer et al., Eq. 5 and code)."""
    return product(left, right, 0.5, 0.5)


class _NormalisedAdd(torch.autograd.Function):
    """a + b; backward splits relevance by the z-rule, then rescales each side per image.

    Chefer et al. (CVPR 2021), Eq. 7: R̄_a = R_a · |ΣR_a| / (|ΣR_a| + |ΣR_b|) · ΣR / ΣR_a. The sums
    run over one image (their code sums over the batch, which they run one image at a time).
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, phase: Phase | None) -> Tensor:
        ctx.phase = phase
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        if is_plain(ctx.phase):
            return grad, grad, None
        a, b = ctx.saved_tensors
        dims = tuple(range(1, grad.ndim))
        share_a = (a * grad).sum(dims, keepdim=True)
        share_b = (b * grad).sum(dims, keepdim=True)
        total = share_a + share_b
        magnitude = share_a.abs() + share_b.abs()
        factor_a = safe_divide(safe_divide(share_a.abs(), magnitude) * total, share_a)
        factor_b = safe_divide(safe_divide(share_b.abs(), magnitude) * total, share_b)
        return grad * factor_a, grad * factor_b, None


def normalised_add(a: Tensor, b: Tensor) -> Tensor:
    """a + b, its relevance split by the z-rule and each side rescaled to its share (Chefer et al., Eq. 7)."""
    if not torch.is_grad_enabled():
        return a + b
    return _NormalisedAdd.apply(a, b, current_phase())


class _RelevanceNormalisation(torch.autograd.Function):
    """Identity in the forward; the backward rescales the relevance t ⊙ grad of its input to Σ|R| = 1 per image.

    Vukadin et al.'s "relative" step (``normalize_relevance(..., SUM_TO_ONE)`` in their code), applied
    to every input of every layer under the absolute rule.
    """

    @staticmethod
    def forward(ctx, t: Tensor, phase: Phase | None) -> Tensor:
        ctx.phase = phase
        ctx.save_for_backward(t)
        return t.view_as(t)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        if is_plain(ctx.phase):
            return grad, None
        (t,) = ctx.saved_tensors
        total = (t * grad).abs().sum(tuple(range(1, grad.ndim)), keepdim=True)
        return grad * safe_divide(torch.ones_like(total), total), None


def normalise_relevance(t: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return t
    return _RelevanceNormalisation.apply(t, current_phase())


def absolute_rule(output: Tensor, linear_part: Tensor, absolute_part: Tensor) -> Tensor:
    """Vukadin et al.'s absolute-magnitude rule, in Gradient×Input form.

    ``output`` y keeps its value; in the backward R_y / |y| flows back through
    ``linear_part + absolute_part``, so an input x receives R_x = x ⊙ ∂(linear_part + absolute_part)ᵀ
    (R_y / |y|). ``linear_part`` carries the layer's Jacobian (usually y itself), ``absolute_part``
    that of the same layer with absolute weights evaluated at |x| (their code's ``output +
    abs_output``; terms without gradient, such as |b|, are left out). For a Linear:
    R_i = Σ_j (x_i w_ji + |x_i w_ji|) / |y_j| · R_j — positive contributions only, divided by the
    absolute output. The layer's inputs go through :func:`normalise_relevance` first.
    """
    if not torch.is_grad_enabled():
        return output
    return _rule_gradient(output, linear_part + absolute_part, None, by_magnitude=True)
