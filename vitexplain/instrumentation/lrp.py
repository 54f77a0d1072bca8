"""Layer-wise relevance propagation (LRP) through a Vision Transformer's own modules.

The rules and the relevance they leave are written here once; where a family keeps its attention,
residual adds, embeddings and head is the business of its adapter's LRP code (``lrp_timm`` for timm,
``lrp_hf`` for transformers' ViT / DeiT), which places the rules through a :class:`RuleWriter`.

Like zennit, this changes how the model's modules compute their *backward* while leaving their
forward values untouched, so that one ordinary backward pass propagates relevance. Every rule is
written in Gradient×Input form: under the rules, the relevance of any tensor ``t`` of the forward is
``t * dscore/dt``. Each layer gets a rule by the "gradient trick" — its output keeps its value but
takes the gradient of a surrogate ``z`` (``value.detach() + z - z.detach()``) — or, for the normalised
residual add, by a small autograd Function. Linear maps without a bias (reshapes, token selection,
LayerScale, average pooling, the distilled head's average) need no rule: Gradient×Input through them
is already the z-rule.

:func:`lrp_rules` applies a :class:`Rules` set to a model for the length of a ``with`` block (forward
hooks and patched ``forward`` methods, all removed on exit, also after an exception), and
:func:`relevance` runs one forward and one backward and returns the relevance at every attention
map, every block boundary, the patch embeddings and the pixels.

Rule sets (:data:`RULE_SETS`):

* ``"chefer"`` — Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization",
  CVPR 2021, Sec. 3.1-3.2, as in ``modules/layers_ours.py`` of hila-chefer/Transformer-Explainability:
  LRP-αβ with α=1, β=0 for every Linear (Eq. 4; biases ignored), relevance passed unchanged through
  LayerNorm, GELU and softmax, the z-rule on each operand of the two attention products with the
  result halved (Eq. 5 with the code's ``/ 2``), the residual adds split by the z-rule and then
  renormalised (Eq. 7), and the z^B rule with the image's min / max as bounds at the patch
  embedding convolution.
* ``"lrp"`` — the same rules with the plain z-rule at the residual adds: Chefer et al.'s "LRP"
  baseline (``modules/layers_lrp.py``), also behind their partial-LRP baseline.
* ``"conservative"`` — Ali et al., "XAI for Transformers: Better Explanations through Conservative
  Propagation", ICML 2022, Sec. 4: attention probabilities held constant (AH-rule) and LayerNorm's
  standard deviation held constant (LN-rule); everything else is Gradient×Input (LRP-0, biases
  absorbing relevance).
* ``"abslrp"`` — Vukadin, Afrić, Šilić & Delač, "Advancing Attribution-Based Neural Network
  Explainability through Relative Absolute Magnitude Layer-Wise Relevance Propagation and
  Multi-Component Evaluation", ACM TIST 2024, as in davor10105/relative-absolute-magnitude-propagation
  (``abslrp_gae/abslrp/rules``): every layer y = f(x₁, x₂, …) — Linear, LayerNorm, GELU, softmax, both
  attention products, the residual and position-embedding adds, the patch convolution, and the
  eval-mode dropouts — shares R_y by the positive contributions only, divided by the output's absolute
  magnitude: R_x = x ⊙ ∂[f(x) + f_abs(|x|)]ᵀ (R_y / |y|), f_abs being f with absolute weights (for a
  Linear, R_i = Σ_j (x_i w_ji + |x_i w_ji|) / |y_j| · R_j); then the relevance of each input is rescaled
  to Σ|R| = 1 per image (the "relative" step). See :func:`absolute_rule`. The dropouts sit where
  timm's ViT (the authors' model) has them — on the attention probabilities, after the attention
  projection, after the MLP activation, after the MLP, before the head — in every family, so a
  network gets the same map whichever library holds it.

In the first three rule sets the MLP activation passes relevance unchanged (``act(x) = x * [act(x) / x]``
with the bracket constant, which is what Gradient×Input does for ReLU) and the position-embedding add
uses the z-rule. The z-rule divisions use Chefer et al.'s stabiliser: the denominator moved 1e-9 away
from zero, and zero where it is exactly zero; the absolute rule divides by |y| + 1e-9, as Vukadin et
al.'s code, and by Σ|R| moved likewise.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import ModelAdapter, UnsupportedModelError, evaluation_mode, resolve_targets
from .patching import ModelPatch

STABILISER = 1e-9

_CHOICES = {
    "linear": ("alpha1beta0", "gradient", "absolute"),
    "norm": ("identity", "constant_std", "absolute"),
    "softmax": ("identity", "constant", "absolute"),
    "residual": ("normalised", "z", "absolute"),
    "pixels": ("zbox", "gradient", "absolute"),
    "start": ("one", "logit", "others"),
    "elementwise": ("identity", "absolute"),
}


@dataclass(frozen=True)
class Rules:
    """Which LRP rule each kind of layer follows.

    ``"absolute"`` is Vukadin et al.'s absolute-magnitude rule (:func:`absolute_rule`) wherever it is allowed.

    Attributes:
        linear: ``"alpha1beta0"`` (LRP-αβ, α=1, β=0, bias ignored), ``"gradient"`` (LRP-0 /
            Gradient×Input, the bias absorbs its share) or ``"absolute"`` (every Linear and LayerScale).
        norm: LayerNorm passes relevance unchanged (``"identity"``), is linear with its standard
            deviation held constant (``"constant_std"``), or ``"absolute"`` with mean and standard
            deviation held constant (the absolute version standardises |x| by its own statistics).
        softmax: ``"identity"``: relevance of the attention probabilities passes unchanged to the
            scores, and both attention products (q·kᵀ and A·v) give each operand half of the z-rule;
            ``"constant"``: the probabilities are constants, so A·v sends all relevance to v;
            ``"absolute"``: the softmax (row max and sum held constant) and both products.
        residual: ``"normalised"`` (z-rule, then each side rescaled to its share
            |ΣR_a| / (|ΣR_a| + |ΣR_b|) of ΣR, per image), ``"z"`` (plain z-rule) or ``"absolute"``
            (the residual adds and the position-embedding add; otherwise that add uses the z-rule).
        pixels: ``"zbox"`` (z^B rule at the patch-embedding convolution, bounds = each image's
            min / max), ``"gradient"`` (Gradient×Input at the pixels) or ``"absolute"``.
        start: relevance put on the logits: ``"one"`` on the target, the target ``"logit"`` itself,
            or ``"others"``: 1/(C-1) on every other class (the dual of Vukadin et al.'s contrastive map).
        elementwise: the MLP activation and the eval-mode dropouts (all but the position-embedding
            dropout): ``"identity"`` (relevance passes unchanged) or ``"absolute"`` (for a dropout:
            relevance kept only where the value is positive, rescaled to Σ|R| = 1).
    """

    linear: str
    norm: str
    softmax: str
    residual: str
    pixels: str
    start: str
    elementwise: str = "identity"

    def __post_init__(self):
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} rule {getattr(self, name)!r}; choose one of {allowed}")


RULE_SETS: dict[str, Rules] = {
    "chefer": Rules(linear="alpha1beta0", norm="identity", softmax="identity", residual="normalised",
                    pixels="zbox", start="one"),
    "lrp": Rules(linear="alpha1beta0", norm="identity", softmax="identity", residual="z",
                 pixels="zbox", start="one"),
    "conservative": Rules(linear="gradient", norm="constant_std", softmax="constant", residual="z",
                          pixels="gradient", start="logit"),
    "abslrp": Rules(linear="absolute", norm="absolute", softmax="absolute", residual="absolute",
                    pixels="absolute", start="one", elementwise="absolute"),
}


def resolve_rules(rules: str | Rules) -> Rules:
    if isinstance(rules, Rules):
        return rules
    try:
        return RULE_SETS[rules]
    except (KeyError, TypeError):
        raise ValueError(f"unknown LRP rule set {rules!r}; choose one of {sorted(RULE_SETS)} or pass a Rules") from None


# -- the rules as tensor operations ------------------------------------------------------------
def safe_divide(numerator: Tensor, denominator: Tensor, stabiliser: float | None = None) -> Tensor:
    """numerator / denominator, the denominator moved ``stabiliser`` (default :data:`STABILISER`) away
    from zero; 0 where it is 0."""
    stabiliser = STABILISER if stabiliser is None else stabiliser
    shifted = denominator + torch.where(denominator >= 0, stabiliser, -stabiliser)
    return torch.where(denominator == 0, torch.zeros_like(numerator), numerator / shifted)


def with_gradient_of(value: Tensor, surrogate: Tensor) -> Tensor:
    """``value`` in the forward, the gradient of ``surrogate`` in the backward."""
    return value.detach() + (surrogate - surrogate.detach())


def proportional(value: Tensor, contributions: Tensor, stabiliser: float | None = None) -> Tensor:
    """z-rule gradient trick: ``value``'s relevance flows back in proportion to ``contributions``.

    ``contributions`` must be a sum of per-input contributions, linear in the inputs that should
    receive relevance (e.g. W⁺x⁺ + W⁻x⁻ for LRP-αβ); each output's relevance is shared among its
    inputs as their contributions are shared in ``contributions``.
    """
    scale = safe_divide(value, contributions, stabiliser).detach()
    return with_gradient_of(value, contributions * scale)


def halved_product(left: Tensor, right: Tensor) -> Tensor:
    """left @ right, giving each operand half of the z-rule relevance (Chefer et al., Eq. 5 and code)."""
    return (left @ right.detach() + left.detach() @ right) / 2


class _NormalisedAdd(torch.autograd.Function):
    """a + b; backward splits relevance by the z-rule, then rescales each side per image.

    Chefer et al. (CVPR 2021), Eq. 7: R̄_a = R_a · |ΣR_a| / (|ΣR_a| + |ΣR_b|) · ΣR / ΣR_a. The sums
    run over one image (their code sums over the batch, which they run one image at a time).
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ctx.saved_tensors
        dims = tuple(range(1, grad.ndim))
        share_a = (a * grad).sum(dims, keepdim=True)
        share_b = (b * grad).sum(dims, keepdim=True)
        total = share_a + share_b
        magnitude = share_a.abs() + share_b.abs()
        factor_a = safe_divide(safe_divide(share_a.abs(), magnitude) * total, share_a)
        factor_b = safe_divide(safe_divide(share_b.abs(), magnitude) * total, share_b)
        return grad * factor_a, grad * factor_b


def normalised_add(a: Tensor, b: Tensor) -> Tensor:
    return _NormalisedAdd.apply(a, b)


def _alpha1beta0_hook(linear: nn.Linear, args: tuple, output: Tensor) -> Tensor:
    """LRP-αβ, α=1, β=0 (Chefer et al., Eq. 4): share by (x_i w_ji)⁺ summed over positive and negative inputs."""
    x = args[0]
    weight = linear.weight.detach()
    contributions = (F.linear(x.clamp(min=0), weight.clamp(min=0))
                     + F.linear(x.clamp(max=0), weight.clamp(max=0)))
    return proportional(output, contributions)


def _identity_hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    """Relevance passes unchanged from output to input (elementwise activations, Chefer's LayerNorm).

    Unstabilised, as the rule itself divides nothing; relevance cannot sit on an input that is exactly 0.
    """
    return proportional(output, args[0], stabiliser=0.0)


def _constant_std_hook(norm: nn.LayerNorm, args: tuple, output: Tensor) -> Tensor:
    """Ali et al.'s LN-rule: LayerNorm with its standard deviation treated as a constant."""
    x = args[0]
    dims = tuple(range(-len(norm.normalized_shape), 0))
    centred = x - x.mean(dims, keepdim=True)
    std = (x.var(dims, unbiased=False, keepdim=True) + norm.eps).sqrt().detach()
    surrogate = centred / std
    if norm.weight is not None:
        surrogate = surrogate * norm.weight.detach()
    if norm.bias is not None:
        surrogate = surrogate + norm.bias.detach()
    return with_gradient_of(output, surrogate)


# -- Vukadin et al.'s absolute-magnitude rule ---------------------------------------------------
class _RelevanceNormalisation(torch.autograd.Function):
    """Identity in the forward; the backward rescales the relevance t ⊙ grad of its input to Σ|R| = 1 per image.

    Vukadin et al.'s "relative" step (``normalize_relevance(..., SUM_TO_ONE)`` in their code), applied
    to every input of every layer under the absolute rule.
    """

    @staticmethod
    def forward(ctx, t: Tensor) -> Tensor:
        ctx.save_for_backward(t)
        return t.view_as(t)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (t,) = ctx.saved_tensors
        total = (t * grad).abs().sum(tuple(range(1, grad.ndim)), keepdim=True)
        return grad * safe_divide(torch.ones_like(total), total)


def normalise_relevance(t: Tensor) -> Tensor:
    return _RelevanceNormalisation.apply(t)


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
    scale = (output / (output.abs() + STABILISER)).detach()
    return with_gradient_of(output, (linear_part + absolute_part) * scale)


def absolute_product(left: Tensor, right: Tensor) -> Tensor:
    """left @ right under the absolute rule; each operand's relevance rescaled to Σ|R| = 1."""
    left, right = normalise_relevance(left), normalise_relevance(right)
    product = left @ right
    return absolute_rule(product, product, left.abs() @ right.abs())


def absolute_add(a: Tensor, b: Tensor) -> Tensor:
    """a + b under the absolute rule: R_a = (a + |a|) / |a + b| · R, each side rescaled to Σ|R| = 1."""
    a, b = normalise_relevance(a), normalise_relevance(b)
    total = a + b
    return absolute_rule(total, total, a.abs() + b.abs())


def absolute_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis under the absolute rule, its row max and sum held constant.

    Vukadin et al.'s ``SoftmaxAttention``: exp(s - max) / Σ with max and Σ detached, so the Jacobian is
    diag(A); the absolute version is the softmax of |s|: R_s = (s A + |s| softmax(|s|)) / A · R_A.
    """
    scores = normalise_relevance(scores)
    probabilities = scores.softmax(dim=-1)
    magnitudes = scores.abs()
    return absolute_rule(probabilities, scores * probabilities.detach(),
                         magnitudes * magnitudes.softmax(dim=-1).detach())


def _normalise_input_hook(module: nn.Module, args: tuple) -> tuple:
    return (normalise_relevance(args[0]), *args[1:])


def _absolute_linear_hook(linear: nn.Linear, args: tuple, output: Tensor) -> Tensor:
    return absolute_rule(output, output, F.linear(args[0].abs(), linear.weight.detach().abs()))


def _absolute_conv_hook(conv: nn.Conv2d, args: tuple, output: Tensor) -> Tensor:
    return absolute_rule(output, output, conv._conv_forward(args[0].abs(), conv.weight.detach().abs(), None))


def _absolute_norm_hook(norm: nn.LayerNorm, args: tuple, output: Tensor) -> Tensor:
    """LayerNorm with its mean and standard deviation held constant (Vukadin et al.'s ``LayerNormalization``).

    The absolute version standardises |x| by |x|'s own mean and standard deviation and uses |weight|,
    as their forward hook runs the module on |x| with absolute parameters. The means, being constants,
    have no gradient and are left out.
    """
    dims = tuple(range(-len(norm.normalized_shape), 0))

    def standardised(t: Tensor) -> Tensor:
        return t / (t.var(dims, unbiased=False, keepdim=True) + norm.eps).sqrt().detach()

    x = args[0]
    linear_part, absolute_part = standardised(x), standardised(x.abs())
    if norm.weight is not None:
        weight = norm.weight.detach()
        linear_part, absolute_part = linear_part * weight, absolute_part * weight.abs()
    return absolute_rule(output, linear_part, absolute_part)


def _absolute_elementwise_hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    """An element-wise layer f under the absolute rule: R_x = x (f'(x) + sign(x) f'(|x|)) / |f(x)| · R.

    For an eval-mode dropout (the identity) this keeps 2R where x > 0 and drops it where x < 0, as
    Vukadin et al.'s code does to every ``nn.Dropout`` its timm ViT propagation passes (all but the
    position-embedding dropout, which their forward skips).
    """
    return absolute_rule(output, output, module.forward(args[0].abs()))


_NORM_HOOKS = {"identity": _identity_hook, "constant_std": _constant_std_hook, "absolute": _absolute_norm_hook}
_ELEMENTWISE_HOOKS = {"identity": _identity_hook, "absolute": _absolute_elementwise_hook}


# -- what a forward under the rules leaves behind ---------------------------------------------
@dataclass
class Trace:
    """Tensors of one forward under :func:`lrp_rules`, whose relevance :func:`relevance` reads.

    Attributes:
        attn: attention probabilities of every block [B, H, N, N], as they enter A·v.
        residuals: every block's input, then the last block's output [B, N, C].
        patches: the patch embedding's output, before prefix tokens and position embedding.
        bounds: the (low, high) tensors of the z^B rule, shaped like the convolution's input.
    """

    attn: list[Tensor] = field(default_factory=list)
    residuals: list[Tensor] = field(default_factory=list)
    patches: Tensor | None = None
    bounds: tuple[Tensor, Tensor] | None = None


def _zbox_hook(conv: nn.Conv2d, args: tuple, output: Tensor, *, trace: Trace) -> Tensor:
    """z^B rule (Montavon et al. 2017) with each image's min / max as bounds, as Chefer et al.'s code."""
    x = args[0]
    low = x.detach().amin(dim=(1, 2, 3), keepdim=True).expand_as(x).clone().requires_grad_(True)
    high = x.detach().amax(dim=(1, 2, 3), keepdim=True).expand_as(x).clone().requires_grad_(True)
    trace.bounds = (low, high)
    weight = conv.weight.detach()
    conv2d = functools.partial(F.conv2d, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                               groups=conv.groups)
    contributions = conv2d(x, weight) - conv2d(low, weight.clamp(min=0)) - conv2d(high, weight.clamp(max=0))
    return proportional(output, contributions)


def _absolute_position_hook(dropout: nn.Module, args: tuple, output: Tensor, *, trace: Trace,
                            num_prefix_tokens: int) -> Tensor:
    """The position-embedding add y = x + p under the absolute rule, applied at the dropout that follows it.

    The patch embeddings x receive (x + |x|) / |y| · R_y. The prefix tokens' relevance is dropped here,
    as Vukadin et al. drop the class token's right below this add; their renormalisation over all
    tokens is left to the patch convolution's input (it changes only a per-image factor).
    """
    patches = trace.patches.reshape(output.shape[0], -1, output.shape[-1]).detach()
    kept = F.pad(1 + patches.sign(), (0, 0, num_prefix_tokens, 0))
    return with_gradient_of(output, output * (output / (output.abs() + STABILISER) * kept).detach())


def absolute_passthrough(x: Tensor) -> Tensor:
    """An eval-mode dropout (the identity) under the absolute rule: R kept, doubled, where x > 0, dropped
    where x < 0, after x's relevance is rescaled to Σ|R| = 1."""
    x = normalise_relevance(x)
    return absolute_rule(x, x, x.abs())


_RESIDUAL_ADDS = {"normalised": normalised_add, "absolute": absolute_add, "z": operator.add}


# -- applying the rules to a model ---------------------------------------------------------------
class RuleWriter:
    """Puts one rule set on one model, for a model family's LRP code (``lrp_timm``, ``lrp_hf``).

    The family code says where its parts are; the writer knows which hook each rule needs. Every
    hook and replaced ``forward`` goes through one :class:`~vitexplain.instrumentation.patching.ModelPatch`,
    so :func:`lrp_rules` undoes all of them on exit.

    Attributes:
        rules: the rule set.
        trace: filled by the forward (:class:`Trace`).
        patch: the model patch holding every change.
    """

    def __init__(self, rules: Rules, trace: Trace, patch: ModelPatch):
        self.rules, self.trace, self.patch = rules, trace, patch

    @property
    def absolute_dropouts(self) -> bool:
        """Whether eval-mode dropouts follow the absolute rule (otherwise they pass relevance unchanged)."""
        return self.rules.elementwise == "absolute"

    def add_rule(self, module: nn.Module, hook, absolute: bool = False) -> None:
        """``hook`` on the module's output; under the absolute rule its input's relevance is renormalised first."""
        if absolute:
            self.patch.hook(module.register_forward_pre_hook(_normalise_input_hook))
        self.patch.hook(module.register_forward_hook(hook))

    def replace_forward(self, module: nn.Module, forward, **keywords) -> None:
        """``module.forward`` becomes ``forward(module, ...)`` with ``keywords`` bound, until the patch ends."""
        self.patch.replace_forward(module, types.MethodType(functools.partial(forward, **keywords), module))

    def residual_add(self):
        """The function to add a branch to the residual stream with, under the rules."""
        return _RESIDUAL_ADDS[self.rules.residual]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, probability_dropout=None) -> Tensor:
        """softmax(q kᵀ) v [B, H, N, D] with the softmax and both products under the rules (q already scaled).

        ``probability_dropout`` is applied to the attention probabilities (a module, hooked with the
        rest, or None); the probabilities entering A·v are recorded in the trace.
        """
        dropout = probability_dropout or (lambda t: t)
        if self.rules.softmax == "identity":
            scores = halved_product(q, k.transpose(-2, -1))
            probabilities = dropout(proportional(scores.softmax(dim=-1), scores))
            mixed = halved_product(probabilities, v)
        elif self.rules.softmax == "absolute":
            scores = absolute_product(q, k.transpose(-2, -1))
            probabilities = dropout(absolute_softmax(scores))
            mixed = absolute_product(probabilities, v)
        else:
            probabilities = dropout((q @ k.transpose(-2, -1)).softmax(dim=-1)).detach()
            mixed = probabilities @ v
        self.trace.attn.append(probabilities)
        return mixed

    def layers(self, model: nn.Module, position_dropout: nn.Module | None, extra: dict | None = None,
               fused: tuple[nn.Linear, ...] = ()) -> None:
        """The rules of every Linear, LayerNorm and eval-mode dropout of ``model`` (not the one after the
        position-embedding add), plus ``extra``: {module class: hook under the absolute linear rule}.

        ``fused``: Linears that read one input together and count as one layer (transformers' q / k / v
        projections, timm's single ``qkv``): under the absolute rule the family code renormalises
        their common input once (:meth:`fused_input`) instead of each doing it.
        """
        rules = self.rules
        fused_ids = {id(linear) for linear in fused}
        for module in model.modules():
            if isinstance(module, nn.Linear) and rules.linear == "alpha1beta0":
                self.add_rule(module, _alpha1beta0_hook)
            elif isinstance(module, nn.Linear) and rules.linear == "absolute":
                self.add_rule(module, _absolute_linear_hook, absolute=id(module) not in fused_ids)
            elif isinstance(module, nn.LayerNorm):
                self.add_rule(module, _NORM_HOOKS[rules.norm], absolute=rules.norm == "absolute")
            elif isinstance(module, nn.Dropout) and module is not position_dropout and self.absolute_dropouts:
                self.add_rule(module, _absolute_elementwise_hook, absolute=True)
            elif rules.linear == "absolute" and type(module) in (extra or {}):
                self.add_rule(module, extra[type(module)], absolute=True)

    def fused_input(self, x: Tensor) -> Tensor:
        """The common input of ``fused`` Linears (see :meth:`layers`), renormalised once under the absolute rule."""
        return normalise_relevance(x) if self.rules.linear == "absolute" else x

    def activation(self, module: nn.Module, then_dropout: bool = False) -> None:
        """The MLP's element-wise activation; ``then_dropout``: also an eval-mode dropout right after it
        (for a family whose MLP lacks the one timm's has there)."""
        self.add_rule(module, _ELEMENTWISE_HOOKS[self.rules.elementwise], absolute=self.absolute_dropouts)
        if then_dropout and self.absolute_dropouts:
            self.patch.hook(module.register_forward_hook(lambda module, args, output: absolute_passthrough(output)))

    def blocks(self, blocks) -> None:
        """Record every block's input and the last block's output in the trace."""
        for block in blocks:
            self.patch.hook(block.register_forward_pre_hook(
                lambda module, args, kwargs: self.trace.residuals.append(args[0] if args else kwargs["hidden_states"]),
                with_kwargs=True))
        self.patch.hook(blocks[-1].register_forward_hook(lambda module, args, output: self.trace.residuals.append(
            output[0] if isinstance(output, tuple) else output)))

    def embeddings(self, patch_embedding: nn.Module, convolution: nn.Conv2d, position_dropout: nn.Module | None,
                   num_prefix_tokens: int) -> None:
        """The patch embedding (output [B, h*w, C] recorded), its convolution's pixel rule, and the
        position-embedding add, whose rule sits on the module right after it (``position_dropout``)."""
        self.patch.hook(patch_embedding.register_forward_hook(
            lambda module, args, output: setattr(self.trace, "patches", output)))
        if self.rules.residual == "absolute" and position_dropout is not None:
            self.add_rule(position_dropout, functools.partial(_absolute_position_hook, trace=self.trace,
                                                              num_prefix_tokens=num_prefix_tokens))
        if self.rules.pixels == "zbox":
            self.add_rule(convolution, functools.partial(_zbox_hook, trace=self.trace))
        elif self.rules.pixels == "absolute":
            self.add_rule(convolution, _absolute_conv_hook, absolute=True)


def require_rules_for(model: nn.Module, covered) -> None:
    """Raise :class:`UnsupportedModelError` naming the first module of ``model`` that ``covered(module)``
    rejects: a family's LRP code refuses what its rules do not cover instead of giving wrong relevance."""
    for name, module in model.named_modules():
        if not covered(module):
            raise UnsupportedModelError(f"cannot propagate LRP through this {type(model).__name__}: its module "
                                        f"{name} ({type(module).__name__}) has no LRP rule here")


@contextlib.contextmanager
def lrp_rules(adapter: ModelAdapter, rules: str | Rules = "chefer") -> Iterator[Trace]:
    """Within the block, the model's backward propagates relevance under ``rules``; yields the :class:`Trace`.

    The adapter's family code (:meth:`ModelAdapter.apply_lrp_rules`) places the rules; families without
    one raise :class:`UnsupportedModelError`. Forward values are unchanged (up to rounding in the
    attention, which is computed unfused). The model comes back exactly as it was — hooks removed,
    patched ``forward`` methods restored — also when an exception is raised inside.
    """
    rules = resolve_rules(rules)
    trace = Trace()
    with ModelPatch() as patch:
        adapter.apply_lrp_rules(RuleWriter(rules, trace, patch))
        yield trace


# -- relevance of one batch --------------------------------------------------------------------
@dataclass
class Relevance:
    """Relevance of one batch under one rule set, for the target class of each image.

    Attributes:
        logits: model output [B, classes].
        targets: the class explained for each image [B].
        output: relevance put on each image's target logit [B] (1, the logit, or 0 under start='others').
        attn: relevance of every block's attention probabilities [B, H, N, N] (zero where the rules
            hold attention constant).
        residuals: relevance of every block's input, then of the last block's output [B, N, C].
        patches: relevance of the patch embeddings (before position embedding) [B, h*w, C]; under
            the absolute rule not renormalised (see :func:`_absolute_position_hook`).
        pixels: relevance of the input pixels [B, C, H, W].
        grid: patch grid (h, w).
        num_prefix_tokens: non-patch tokens at the start of the sequence.
        class_token_index: position of the class token, or None.
    """

    logits: Tensor
    targets: Tensor
    output: Tensor
    attn: list[Tensor]
    residuals: list[Tensor]
    patches: Tensor
    pixels: Tensor
    grid: tuple[int, int]
    num_prefix_tokens: int
    class_token_index: int | None

    @property
    def tokens(self) -> Tensor:
        """Relevance of the token embeddings fed to the first block [B, N, C]."""
        return self.residuals[0]

    def patch_map(self, per_token: Tensor) -> Tensor:
        """Per-token values over the whole sequence [B, N] -> the patch tokens on the grid [B, h, w]."""
        return per_token[:, self.num_prefix_tokens:].reshape(per_token.shape[0], *self.grid)

    def class_row(self, matrix: Tensor) -> Tensor:
        """The class token's row of a token-by-token matrix [B, N, N], over the patches -> [B, h, w]."""
        if self.class_token_index is None:
            raise ValueError("the model has no class token")
        return self.patch_map(matrix[:, self.class_token_index])


def _start_relevance(start: str, logits: Tensor, targets: Tensor) -> Tensor:
    """Relevance put on the logits [B, C] (see :attr:`Rules.start`)."""
    classes = logits.shape[1]
    one_hot = F.one_hot(targets, classes).to(logits.dtype)
    if start == "one":
        return one_hot
    if start == "logit":
        return one_hot * logits
    if classes < 2:
        raise ValueError("start='others' needs a model with at least two classes")
    return (1 - one_hot) / (classes - 1)


def relevance(adapter_or_model: ModelAdapter | nn.Module, images: Tensor, targets=None,
              rules: str | Rules = "chefer") -> Relevance:
    """One forward and one backward under ``rules``; the relevance recorded at every stage.

    Args:
        adapter_or_model: a timm VisionTransformer or its adapter.
        images: preprocessed batch [B, 3, H, W].
        targets: None (each image's predicted class), an int, or one class per image.
        rules: a name from :data:`RULE_SETS` or a :class:`Rules`.
    """
    from . import adapter_for

    adapter = adapter_for(adapter_or_model)
    rules = resolve_rules(rules)
    images = adapter.check_images(images).detach().requires_grad_(True)
    with evaluation_mode(adapter.model), torch.enable_grad():
        with lrp_rules(adapter, rules) as trace:
            logits = adapter.forward(images)
        targets = resolve_targets(targets, logits.detach())
        start = _start_relevance(rules.start, logits.detach(), targets)
        seed = safe_divide(start, logits.detach())
        tensors = [*trace.attn, *trace.residuals, trace.patches, images, *(trace.bounds or ())]
        differentiable = [t for t in tensors if t.requires_grad]
        grads = iter(torch.autograd.grad(logits, differentiable, grad_outputs=seed, allow_unused=True))
        grads = [next(grads) if t.requires_grad else None for t in tensors]
    found = [t.detach() * (torch.zeros_like(t) if g is None else g) for t, g in zip(tensors, grads)]
    blocks = len(trace.attn)
    attn, residuals = found[:blocks], found[blocks:2 * blocks + 1]
    patches, pixels, *bounds = found[2 * blocks + 1:]
    height, width = images.shape[-2:]
    for bound in bounds:  # z^B's bound terms; cropped in case the patch embedding padded the image
        pixels = pixels + bound[..., :height, :width]
    return Relevance(
        logits=logits.detach(),
        targets=targets,
        output=start.gather(1, targets[:, None])[:, 0],
        attn=attn,
        residuals=residuals,
        patches=patches.reshape(patches.shape[0], -1, patches.shape[-1]),
        pixels=pixels,
        grid=adapter.grid_size(images),
        num_prefix_tokens=adapter.num_prefix_tokens,
        class_token_index=adapter.class_token_index,
    )
