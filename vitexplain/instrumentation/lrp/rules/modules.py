"""Module rules: each placed on a module (a forward hook) changes how that layer passes relevance back.

Linear layers (z, αβ, γ, the absolute rule), norms (the std held constant), element-wise activations,
convolutions and the input layer's z^B; placed by :mod:`..placement` as a rule set (:mod:`..composites`) says.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...patching import ModelPatch
from .core import (
    _rule_gradient,
    absolute_rule,
    normalise_relevance,
    passes_unchanged,
    proportional,
    rules_apply,
    safe_divide,
    with_gradient_of,
)


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
