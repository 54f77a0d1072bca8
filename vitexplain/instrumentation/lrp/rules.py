"""LRP rules as objects: each changes how one kind of layer passes relevance back, keeping its forward value.

Every rule is written in Gradient×Input form: under the rules, the relevance of any tensor ``t`` of
the forward is ``t * dscore/dt``. A layer gets its rule by the "gradient trick" — its output keeps
its value but hands its gradient to a surrogate ``z`` (:func:`with_gradient_of`; :func:`proportional`
scales it on the way) — or, for the attention products, the normalised residual add and the relevance
renormalisation, by a small autograd Function. Linear maps without a bias (reshapes, token selection,
rotary embeddings, average pooling, the distilled head's average) need no rule: Gradient×Input through
them is already the z-rule. Where no gradient is taken (blocks below the lowest one a caller reads) the
rules compute nothing beyond the forward. Within :func:`both_gradients` one forward serves a plain
gradient and the relevance; a block computed plainly (for the plain gradient, or for its values alone) forms no
surrogate (:func:`rules_apply`).

Module rules (:class:`ModuleRule`) are placed on modules; operation rules (:class:`AddRule`,
:class:`AttentionRule`, ...) are the operations of the written-out blocks and attention. The rule
sets of :mod:`.composites` say which rule each part gets. The z-rule divisions use Chefer et al.'s
stabiliser: the denominator moved 1e-9 away from zero, and zero where it is exactly zero; the
absolute rule divides by |y| + 1e-9, as Vukadin et al.'s code, and by Σ|R| moved likewise.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..patching import ModelPatch

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
        self.phase = _PHASE.get()

    def plain_now(self) -> bool:
        """Whether the backward running now is the plain one of :func:`both_gradients`."""
        return _plain_phase(self.phase)

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


def _plain_phase(phase: Phase | None) -> bool:
    return phase is not None and phase.plain


# -- the gradient trick and its helpers ---------------------------------------------------------
def safe_divide(numerator: Tensor, denominator: Tensor, stabiliser: float | None = None) -> Tensor:
    """numerator / denominator, the denominator moved ``stabiliser`` (default :data:`STABILISER`) away
    from zero; 0 where it is 0."""
    stabiliser = STABILISER if stabiliser is None else stabiliser
    shift = torch.copysign(torch.tensor(stabiliser, dtype=denominator.dtype), denominator)  # -0.0 is masked below
    return (numerator / (denominator + shift)).masked_fill_(denominator == 0, 0)


def _sign_of(value: Tensor) -> Tensor:
    """value / (|value| + ε): the absolute rule's R_y / |y| from the Gradient×Input gradient R_y / y."""
    return value / (value.abs() + STABILISER)


class _RuleGradient(torch.autograd.Function):
    """``value`` in the forward; in the backward the incoming gradient, times ``scale`` when one is given, goes
    to ``surrogate`` — or, in the plain phase of :func:`both_gradients`, unchanged to ``value``.

    ``scale=None`` with ``by_magnitude``: the scale is :func:`_sign_of` ``value``, computed in the backward from
    ``value`` (whose storage the next layer keeps anyway) rather than kept as a tensor of its own.
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
        if _plain_phase(ctx.phase):
            return grad if ctx.needs_input_grad[0] else None, None, None, None, None
        if not ctx.needs_input_grad[1]:
            return None, None, None, None, None
        (saved,) = ctx.saved_tensors
        scale = _sign_of(saved) if ctx.by_magnitude else saved
        return None, grad if scale is None else grad * scale, None, None, None


def _rule_gradient(value: Tensor, surrogate: Tensor, scale: Tensor | None, by_magnitude: bool = False) -> Tensor:
    phase = _PHASE.get()
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
        share_left, share_right = (1.0, 1.0) if _plain_phase(ctx.phase) else ctx.rule_shares
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
    return _Product.apply(left, right, (share_left, share_right), _PHASE.get())


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
        if _plain_phase(ctx.phase):
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
        if _plain_phase(ctx.phase):
            return grad, None
        (t,) = ctx.saved_tensors
        total = (t * grad).abs().sum(tuple(range(1, grad.ndim)), keepdim=True)
        return grad * safe_divide(torch.ones_like(total), total), None


def normalise_relevance(t: Tensor) -> Tensor:
    if not torch.is_grad_enabled():
        return t
    return _RelevanceNormalisation.apply(t, _PHASE.get())


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


def absolute_passthrough(x: Tensor) -> Tensor:
    """An eval-mode dropout (the identity) under the absolute rule: R kept, doubled, where x > 0, dropped
    where x < 0, after x's relevance is rescaled to Σ|R| = 1."""
    x = normalise_relevance(x)
    return absolute_rule(x, x, x.abs())


# -- module rules -------------------------------------------------------------------------------
class ModuleRule:
    """A rule placed on a module: a forward hook whose output has the rule's gradient.

    ``renormalise`` (the absolute rule) rescales the relevance of the module's input to Σ|R| = 1 first. Neither
    hook acts where :func:`rules_apply` says no: the module then computes as it does without rules.
    """

    renormalise = False

    def output(self, module: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        """The module's output ``output`` for input ``x``, with the rule's gradient."""
        raise NotImplementedError

    def place(self, module: nn.Module, patch: ModelPatch, renormalise_input: bool = True) -> None:
        if self.renormalise and renormalise_input:
            patch.hook(module.register_forward_pre_hook(
                lambda module, args: (normalise_relevance(args[0]), *args[1:]) if rules_apply() else None))
        patch.hook(module.register_forward_hook(
            lambda module, args, output: self.output(module, args[0], output) if rules_apply() else None))


class AlphaBeta(ModuleRule):
    """LRP-αβ with α=1, β=0 for a Linear, biases ignored (Chefer et al., Eq. 4; ``layers_ours.py``).

    Relevance is shared by (x_i w_ji)⁺ over one denominator z_j = Σ_i (x_i w_ji)⁺ = (W⁺x⁺ + W⁻x⁻)_j.
    Computed as z = (W x + |W| |x|) / 2, which equals W⁺x⁺ + W⁻x⁻ and costs one extra product instead of two;
    the gradient goes to 2z with the scale halved (exactly the same numbers, one pass fewer).
    """

    def place(self, module: nn.Module, patch: ModelPatch, renormalise_input: bool = True) -> None:
        patch.replace_forward(module, functools.partial(self._forward, module))

    @staticmethod
    def _forward(linear: nn.Linear, x: Tensor) -> Tensor:
        weight = linear.weight
        if not torch.is_grad_enabled():
            return F.linear(x, weight, linear.bias)
        unbiased = F.linear(x, weight)
        output = unbiased if linear.bias is None else unbiased + linear.bias
        if not rules_apply():  # the plain graph alone, its value computed as under the rule
            return output
        doubled = unbiased + _magnitudes(linear, x, bias=False)  # 2z
        with torch.no_grad():
            scale = safe_divide(output, doubled / 2).div_(2)
        return _rule_gradient(output, doubled, scale)


class AlphaBetaSeparate(ModuleRule):
    """LRP-αβ, α=1, β=0 as ``Linear.relprop`` of Chefer et al.'s ``modules/layers_lrp.py`` (their LRP and
    partial-LRP baselines): R_i = x_i⁺ Σ_j w_ji⁺ R_j / (W⁺x⁺)_j + x_i⁻ Σ_j w_ji⁻ R_j / (W⁻x⁻)_j — each part
    normalised by its own sum, so each passes on the whole R_j (not conservative; docs/decisions/lrp.md)."""

    def output(self, linear: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        weight = linear.weight.detach()
        positive = F.linear(x.clamp(min=0), weight.clamp(min=0))
        negative = F.linear(x.clamp(max=0), weight.clamp(max=0))
        scale_positive, scale_negative = safe_divide(output, positive).detach(), safe_divide(output, negative).detach()
        return with_gradient_of(output, positive * scale_positive + negative * scale_negative)


class Gradient(ModuleRule):
    """Gradient×Input (LRP-0): the module is left as it is."""

    def place(self, module: nn.Module, patch: ModelPatch, renormalise_input: bool = True) -> None:
        pass


class _LinearMagnitudes(torch.autograd.Function):
    """|W| |x| (+ |b|) of a Linear; the gradient reaching x is sign(x) ⊙ (g |W|), as autograd's, with |W| taken
    again in the backward: kept by autograd, a copy of every weight matrix would live until the backward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.set_materialize_grads(False)  # a plain backward (both_gradients) reaches it with no gradient: no product
        return F.linear(x.abs(), weight.abs(), None if bias is None else bias.abs())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor | None):
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None
        x, weight = ctx.saved_tensors
        return (grad @ weight.abs()) * x.sign(), None, None


def _magnitudes(module: nn.Module, x: Tensor, bias: bool = True) -> Tensor:
    """|W| |x| (+ |b| with ``bias``): the Linear's or convolution's map of ``|x|`` with its weights' and bias'
    magnitudes."""
    bias = module.bias.detach() if bias and module.bias is not None else None
    if isinstance(module, nn.Linear):
        return _LinearMagnitudes.apply(x, module.weight.detach(), bias)
    return module._conv_forward(x.abs(), module.weight.detach().abs(), None if bias is None else bias.abs())


class Gamma(ModuleRule):
    """The generalised γ-rule for a Linear or a convolution: contributions of the output's own sign favoured by γ.

    Montavon et al., "Layer-Wise Relevance Propagation: An Overview", 2019, Sec. 10.2.3, for inputs of both
    signs as zennit's ``Gamma`` computes it (Andéol et al. 2021), which LXT runs on ViTs (Achtibat et al.,
    ICML 2024). With z_ij = x_i w_ij and s_j = sign(y_j):
    R_i = Σ_j (z_ij + γ z_ij^{s_j}) / (y_j + γ (Σ_i z_ij^{s_j} + b_j^{s_j})) · R_j, where (·)^+ / (·)^- are the
    positive / negative parts: the bias sits in the denominator only and absorbs relevance; R_j = 0 where
    y_j = 0. Since z^{s} = (z + s |x||w|) / 2 and b^{s} − b/2 = s |b| / 2, the denominator is
    (1 + γ/2) y + (γ/2) s (|W| |x| + |b|): one extra product, whose gradient gives the numerators; γ = 0 is LRP-0.
    """

    def __init__(self, gamma: float):
        self.gamma = gamma

    def output(self, module: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        denominator = torch.addcmul(output * (1 + self.gamma / 2), output.detach().sign(), _magnitudes(module, x),
                                    value=self.gamma / 2)
        return proportional(output, denominator)


class PassUnchanged(ModuleRule):
    """Relevance passes unchanged from output to input (Chefer et al.'s LayerNorm and activations; an RMSNorm
    likewise)."""

    def output(self, module: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        return passes_unchanged(output, x)


@functools.cache
def norm_types() -> tuple[type, ...]:
    """The normalisation layers the norm rules serve: LayerNorm, and RMSNorm (torch's, timm's: AIMv2, ViT-22B-style
    ViTs, q / k norms). An RMSNorm is a LayerNorm without centring and without bias (Zhang & Sennrich, 2019), so
    each rule treats it as the LayerNorm it would be without them."""
    import timm.layers

    rms = (getattr(nn, "RMSNorm", None), getattr(timm.layers, "RmsNorm", None),
           getattr(timm.layers, "RmsNormFp32", None))
    return (nn.LayerNorm, *(kind for kind in rms if kind is not None))


def _centred(norm: nn.Module, x: Tensor) -> Tensor:
    """x less its mean over the normalised dimensions (a LayerNorm); x itself (an RMSNorm, which does not centre)."""
    if not isinstance(norm, nn.LayerNorm):
        return x
    return x - x.mean(tuple(range(-len(norm.normalized_shape), 0)), keepdim=True)


def _spread(norm: nn.Module, t: Tensor) -> Tensor:
    """The norm's divisor for input ``t``, as a constant: √(variance + ε) for a LayerNorm, √(mean square + ε) for an
    RMSNorm (torch's ``eps=None``: the dtype's machine epsilon, as ``F.rms_norm``)."""
    dims = tuple(range(-len(norm.normalized_shape), 0))
    if isinstance(norm, nn.LayerNorm):
        second = t.var(dims, unbiased=False, keepdim=True)
    else:
        second = t.pow(2).mean(dims, keepdim=True)
    eps = torch.finfo(t.dtype).eps if norm.eps is None else norm.eps
    return (second + eps).sqrt().detach()


class ConstantStd(ModuleRule):
    """Ali et al.'s LN-rule: LayerNorm with its standard deviation treated as a constant; an RMSNorm with its root
    mean square constant, which is LXT's ``rms_norm_forward`` (AttnLRP's identity rule, Prop. 3.4): relevance then
    passes element by element unchanged, as the norm has no bias to absorb any."""

    def output(self, norm: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        surrogate = _centred(norm, x) / _spread(norm, x)
        if norm.weight is not None:
            surrogate = surrogate * norm.weight.detach()
        if getattr(norm, "bias", None) is not None:
            surrogate = surrogate + norm.bias.detach()
        return with_gradient_of(output, surrogate)


class AbsoluteLinear(ModuleRule):
    """Vukadin et al.'s absolute rule for a Linear: R_i = Σ_j (x_i w_ji + |x_i w_ji|) / |y_j| · R_j."""

    renormalise = True

    def output(self, linear: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        return absolute_rule(output, output, _magnitudes(linear, x, bias=False))


class AbsoluteNorm(ModuleRule):
    """LayerNorm with its mean and standard deviation held constant (Vukadin et al.'s ``LayerNormalization``).

    The absolute version standardises |x| by |x|'s own mean and standard deviation and uses |weight|,
    as their forward hook runs the module on |x| with absolute parameters. The means, being constants,
    have no gradient and are left out. An RMSNorm (their code has none) is the same with its root mean square in
    place of the standard deviation — the same for x and |x| — so R_x = (y + |y|) / |y| · R_y element by element.
    """

    renormalise = True

    def output(self, norm: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        linear_part, magnitudes = x / _spread(norm, x), x.abs()
        absolute_part = magnitudes / _spread(norm, magnitudes)
        if norm.weight is not None:
            weight = norm.weight.detach()
            linear_part, absolute_part = linear_part * weight, absolute_part * weight.abs()
        return absolute_rule(output, linear_part, absolute_part)


class AbsoluteElementwise(ModuleRule):
    """An element-wise layer f under the absolute rule: R_x = x (f'(x) + sign(x) f'(|x|)) / |f(x)| · R.

    For an eval-mode dropout (the identity) this keeps 2R where x > 0 and drops it where x < 0, as
    Vukadin et al.'s code does to every ``nn.Dropout`` its timm ViT propagation passes.
    """

    renormalise = True

    def output(self, module: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        return absolute_rule(output, output, module.forward(x.abs()))


class AbsoluteConv(ModuleRule):
    """The absolute rule at the patch convolution (pixels)."""

    renormalise = True

    def output(self, conv: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        return absolute_rule(output, output, _magnitudes(conv, x, bias=False))


class ZBox(ModuleRule):
    """z^B rule (Montavon et al. 2017) at the patch convolution, each image's min / max as bounds (Chefer et al.'s
    code); or at a Linear of the flattened patches (NaFlexVit), the same products in another layout.

    The bound tensors (shaped as the module's input) are kept in ``bounds`` so that their relevance terms can be
    added to the pixels'.
    """

    def __init__(self):
        self.bounds: tuple[Tensor, Tensor] | None = None

    def output(self, conv: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        every = tuple(range(1, x.ndim))
        low = x.detach().amin(dim=every, keepdim=True).expand_as(x).clone().requires_grad_(True)
        high = x.detach().amax(dim=every, keepdim=True).expand_as(x).clone().requires_grad_(True)
        self.bounds = (low, high)
        weight = conv.weight.detach()
        product = F.linear if isinstance(conv, nn.Linear) else functools.partial(
            F.conv2d, stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups)
        contributions = product(x, weight) - product(low, weight.clamp(min=0)) - product(high, weight.clamp(max=0))
        return proportional(output, contributions)


# -- operation rules (the written-out blocks and attention) ---------------------------------------
class AddRule:
    """A residual add under a rule: ``z`` (plain z-rule, Gradient×Input), ``normalised`` or ``absolute``."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        return operator.add(a, b)


class NormalisedAdd(AddRule):
    """Chefer et al.'s Eq. 7: the z-rule, then each side rescaled to its share |ΣR_a| / (|ΣR_a| + |ΣR_b|) of ΣR."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            return a + b
        return _NormalisedAdd.apply(a, b, _PHASE.get())


class AbsoluteAdd(AddRule):
    """a + b under the absolute rule: R_a = (a + |a|) / |a + b| · R, each side rescaled to Σ|R| = 1."""

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        a, b = normalise_relevance(a), normalise_relevance(b)
        total = a + b
        return absolute_rule(total, total, a.abs() + b.abs())


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
        return halved_product(q, k.transpose(-2, -1))

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return proportional(x + constant, x)

    def softmax(self, scores: Tensor) -> Tensor:
        return passes_unchanged(scores.softmax(dim=-1), scores)

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return halved_product(attn, v)

    def normalise(self, t: Tensor) -> Tensor:
        return passes_unchanged(F.normalize(t, dim=-1), t)

    def input(self, x: Tensor) -> Tensor:
        """The attention's input, read by all its projections."""
        return x


class ConstantAttention(AttentionRule):
    """Ali et al.'s AH-rule: the attention probabilities are constants, so A·v sends all relevance to v."""

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        return product(q, k.transpose(-2, -1), 0, 0)

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return x + constant

    def softmax(self, scores: Tensor) -> Tensor:
        return held_constant(scores.softmax(dim=-1))

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return product(attn, v, 0, 1)

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
    """left @ right under the absolute rule (:func:`absolute_rule` with ``|left| @ |right|`` as the absolute part),
    its magnitudes taken again in the backward instead of being kept: per block an attention map fewer."""

    @staticmethod
    def forward(ctx, left: Tensor, right: Tensor, phase: Phase | None) -> Tensor:
        ctx.phase = phase
        product = left @ right
        ctx.save_for_backward(left, right, product)
        return product

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        left, right, product = ctx.saved_tensors
        absolute = not _plain_phase(ctx.phase)
        if absolute:
            grad = grad * _sign_of(product)
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
    def forward(ctx, scores: Tensor, phase: Phase | None) -> Tensor:
        ctx.phase = phase
        ctx.save_for_backward(scores)
        return scores.softmax(dim=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (scores,) = ctx.saved_tensors
        probabilities = scores.softmax(dim=-1)
        if _plain_phase(ctx.phase):
            return probabilities * (grad - (grad * probabilities).sum(-1, keepdim=True)), None
        grad = grad * _sign_of(probabilities)
        return grad * (probabilities + scores.sign() * scores.abs().softmax(dim=-1)), None


class AbsoluteAttention(AttentionRule):
    """Vukadin et al.'s absolute rule on the products, the softmax (row max and sum constant) and the offsets."""

    @staticmethod
    def _product(left: Tensor, right: Tensor) -> Tensor:
        left, right = normalise_relevance(left), normalise_relevance(right)
        if not torch.is_grad_enabled():
            return left @ right
        return _AbsoluteProduct.apply(left, right, _PHASE.get())

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        return self._product(q.detach() if constant_query else q, k.transpose(-2, -1))

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        x = normalise_relevance(x)
        total = x + constant
        return absolute_rule(total, x, x.abs())

    def softmax(self, scores: Tensor) -> Tensor:
        """Their ``SoftmaxAttention``: exp(s - max) / Σ with max and Σ detached, so the Jacobian is diag(A);
        the absolute version is the softmax of |s|: R_s = (s A + |s| softmax(|s|)) / A · R_A."""
        scores = normalise_relevance(scores)
        if not torch.is_grad_enabled():
            return scores.softmax(dim=-1)
        return _AbsoluteSoftmax.apply(scores, _PHASE.get())

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return self._product(attn, v)

    def input(self, x: Tensor) -> Tensor:
        return normalise_relevance(x)


class ScaleRule:
    """LayerScale x·γ: Gradient×Input through a diagonal linear map (the z-rule)."""

    def __call__(self, x: Tensor, gamma: Tensor) -> Tensor:
        return x * gamma


class AbsoluteScale(ScaleRule):
    """LayerScale as a diagonal Linear under the absolute rule (γ taken in absolute value, like a weight)."""

    def __call__(self, x: Tensor, gamma: Tensor) -> Tensor:
        x = normalise_relevance(x)
        output = x * gamma
        return absolute_rule(output, output, x.abs() * gamma.detach().abs())


class GateRule:
    """A gating product value ⊙ gate (GLU feed-forwards, gated attention): the gate is held constant and the
    value takes all relevance (the "signal-take-all" rule of Arras et al., 2017, for LSTM gates)."""

    def __call__(self, value: Tensor, gate: Tensor) -> Tensor:
        if _PHASE.get() is not None:  # the plain gradient reaches the gate too
            return with_gradient_of(value * gate, value * gate.detach())
        return value * gate.detach()


class UniformGate(GateRule):
    """AttnLRP's uniform rule for an element-wise product of two inputs (Prop. 3.2): value and gate each take
    half of the relevance (LXT's ``divide_gradient(..., 2)`` after a gated feed-forward's product)."""

    def __call__(self, value: Tensor, gate: Tensor) -> Tensor:
        gated = value * gate
        return with_gradient_of(gated, gated / 2)
