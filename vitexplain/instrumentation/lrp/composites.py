"""Rule sets: which rule each part of a family description gets (zennit's "composites").

* ``"chefer"`` — Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization",
  CVPR 2021, Sec. 3.1-3.2, as in ``modules/layers_ours.py`` of hila-chefer/Transformer-Explainability:
  LRP-αβ with α=1, β=0 for every Linear (Eq. 4; biases ignored), relevance passed unchanged through
  LayerNorm, GELU and softmax, the z-rule on each operand of the two attention products with the
  result halved (Eq. 5 with the code's ``/ 2``), the residual adds split by the z-rule and then
  renormalised (Eq. 7), and the z^B rule with the image's min / max as bounds at the patch
  embedding convolution.
* ``"lrp"`` — the same rules with the plain z-rule at the residual adds: Chefer et al.'s "LRP"
  baseline (``modules/layers_lrp.py``), also behind their partial-LRP baseline. That file's Linear rule
  normalises the x⁺ and x⁻ parts separately; :func:`lrp_baseline` with ``"separate"`` reproduces it,
  the rule set keeps the shared denominator (docs/decisions/lrp.md).
* ``"conservative"`` — Ali et al., "XAI for Transformers: Better Explanations through Conservative
  Propagation", ICML 2022, Sec. 4: attention probabilities held constant (AH-rule) and LayerNorm's
  standard deviation held constant (LN-rule); everything else is Gradient×Input (LRP-0, biases
  absorbing relevance).
* ``"attnlrp"`` and ``"cplrp"`` — Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
  for Transformers", ICML 2024, as LXT (rachtibat/LRP-eXplains-Transformers, ``lxt.efficient``) runs it on
  ViTs: the identity rule at the MLP activation and through LayerNorm's standard deviation (Prop. 3.4,
  Eq. 9), the ε-rule (Gradient×Input) at the adds and the attention's projections, the γ-rule at the
  feed-forward and head Linears and at the patch convolution (:class:`GammaLinears`), relevance starting at
  the target logit. Inside the attention ``"attnlrp"`` takes AttnLRP's softmax and product rules
  (:class:`~.rules.TaylorAttention`), ``"cplrp"`` holds the attention probabilities constant (CP-LRP, Ali et
  al.'s AH-rule, which LXT's ViT patch uses: ``cp_LRP`` of ``lxt/efficient/models/vit_torch.py``).
* ``"abslrp"`` — Vukadin, Afrić, Šilić & Delač, "Advancing Attribution-Based Neural Network
  Explainability through Relative Absolute Magnitude Layer-Wise Relevance Propagation and
  Multi-Component Evaluation", ACM TIST 2024, as in davor10105/relative-absolute-magnitude-propagation
  (``abslrp_gae/abslrp/rules``): every layer y = f(x₁, x₂, …) — Linear, LayerNorm, GELU, softmax, both
  attention products, the residual and position-embedding adds, the patch convolution, and the
  eval-mode dropouts — shares R_y by the positive contributions only, divided by the output's absolute
  magnitude, then the relevance of each input is rescaled to Σ|R| = 1 per image (see
  :func:`~.rules.absolute_rule`). The dropouts sit where timm's ViT (the authors' model) has them — on
  the attention probabilities, after the attention projection, after the MLP activation, after the
  MLP, before the head — in every family, so a network gets the same map whichever library holds it.

In the first three rule sets the MLP activation passes relevance unchanged (``act(x) = x * [act(x) / x]``
with the bracket constant, which is what Gradient×Input does for ReLU) and the position-embedding add
uses the z-rule. Gating products (GLU feed-forwards) hold the gate constant in every set but ``"attnlrp"`` (the
uniform rule). An RMSNorm gets its set's LayerNorm rule, read as a LayerNorm without centring or bias.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from . import rules as r


def one_on_target(logits: Tensor, targets: Tensor) -> Tensor:
    """Relevance 1 on the target logit."""
    return F.one_hot(targets, logits.shape[1]).to(logits.dtype)


def target_logit(logits: Tensor, targets: Tensor) -> Tensor:
    """The target logit itself as its relevance."""
    return one_on_target(logits, targets) * logits


def other_classes(logits: Tensor, targets: Tensor) -> Tensor:
    """1/(C-1) on every other class (the dual of Vukadin et al.'s contrastive map)."""
    classes = logits.shape[1]
    if classes < 2:
        raise ValueError("relevance on the other classes needs a model with at least two classes")
    return (1 - one_on_target(logits, targets)) / (classes - 1)


#: where a Linear sits: ``"attention"`` (an attention's projections, in the blocks or in a pooling head),
#: ``"mlp"`` (a block's other Linears: its feed-forward) or ``"head"`` (outside the blocks: the classifier, a
#: pooling head's feed-forward, patch merging); with its block index (None outside the blocks)
LinearRules = Callable[[str, "int | None"], r.ModuleRule]


@dataclass(frozen=True)
class RuleSet:
    """Which rule each part of a model follows.

    Attributes:
        linear: the rule of every Linear (a class of :mod:`.rules`), or a function ``(role, block) -> rule``
            (:data:`LinearRules`) for rules that vary with the place.
        norm, activation: rules (classes of :mod:`.rules`) of every LayerNorm and MLP activation.
        dropout: rule of the eval-mode dropouts, or None to pass relevance through them unchanged; when set,
            the positions where timm's ViT has a dropout and a family has none get it too.
        residual: the residual adds.
        position: the position-embedding add (placed on the module right after it), or None for the z-rule.
        attention: the attention's products, softmax, bias and q/k normalisation.
        scale: LayerScale products.
        gate: gating products.
        pixels: rule of the patch convolution (a class, or any function making one).
        start: relevance put on the logits: ``(logits, targets) -> [B, C]``.
    """

    linear: type[r.ModuleRule] | LinearRules
    norm: type[r.ModuleRule]
    activation: type[r.ModuleRule]
    dropout: type[r.ModuleRule] | None
    residual: r.AddRule
    position: Callable | None
    attention: r.AttentionRule
    scale: r.ScaleRule
    gate: r.GateRule
    pixels: Callable[[], r.ModuleRule]
    start: Callable[[Tensor, Tensor], Tensor]

    def linear_rule(self, role: str, block: int | None) -> r.ModuleRule:
        """The rule of a Linear at ``role`` in ``block`` (see :data:`LinearRules`)."""
        return self.linear() if isinstance(self.linear, type) else self.linear(role, block)


@dataclass(frozen=True)
class GammaLinears:
    """LXT's Linear rules for ViTs: the γ-rule at the feed-forward and head Linears, the ε-rule (LRP-0) at the
    attention's projections.

    LXT puts zennit's ``Gamma`` on every ``nn.Linear`` of torchvision's ViT, whose attention computes its
    projections functionally, so that they keep the gradient (LRP-0); LXT's earlier explicit ViT code names the
    ε-rule for them outright. ``gamma``: one value for every block, or one per block, the Linears after the
    blocks taking the last block's; γ = 0 is LRP-0 (so γ on the lower blocks and ε above is a list).
    """

    gamma: float | tuple[float, ...]

    def __call__(self, role: str, block: int | None) -> r.ModuleRule:
        gamma = self.gamma if isinstance(self.gamma, (int, float)) else self.gamma[-1 if block is None else block]
        return r.Gradient() if role == "attention" or gamma == 0 else r.Gamma(gamma)


#: LXT's ViT example sweeps γ over 0, 0.01, 0.05, 0.1, 1 at the Linears and 0.1, 0.25, 100 at the patch
#: convolution and names no default: the middle of each sweep (docs/decisions/lrp.md)
LINEAR_GAMMA, CONV_GAMMA = 0.05, 0.25


def attention_aware(constant_attention: bool, gamma: float | Sequence[float] = LINEAR_GAMMA,
                    conv_gamma: float = CONV_GAMMA) -> RuleSet:
    """Rule set ``"attnlrp"`` (or with ``constant_attention``, ``"cplrp"``) with the γ values given: ``gamma``
    at the feed-forward and head Linears (one, or one per block, see :class:`GammaLinears`), ``conv_gamma`` at
    the patch convolution. A gating product follows the attention: uniform (AttnLRP, Prop. 3.2) or the gate
    held constant (LXT's CP-LRP ``cp_gated_mlp_forward``)."""
    return RuleSet(linear=GammaLinears(gamma if isinstance(gamma, (int, float)) else tuple(gamma)), norm=r.ConstantStd,
                   activation=r.PassUnchanged, dropout=None, residual=r.AddRule(), position=None,
                   attention=r.ConstantAttention() if constant_attention else r.TaylorAttention(), scale=r.ScaleRule(),
                   gate=r.GateRule() if constant_attention else r.UniformGate(),
                   pixels=functools.partial(r.Gamma, conv_gamma) if conv_gamma else r.Gradient, start=target_logit)


RULE_SETS: dict[str, RuleSet] = {
    "chefer": RuleSet(linear=r.AlphaBeta, norm=r.PassUnchanged, activation=r.PassUnchanged, dropout=None,
                      residual=r.NormalisedAdd(), position=None, attention=r.AttentionRule(), scale=r.ScaleRule(),
                      gate=r.GateRule(), pixels=r.ZBox, start=one_on_target),
    "lrp": RuleSet(linear=r.AlphaBeta, norm=r.PassUnchanged, activation=r.PassUnchanged, dropout=None,
                   residual=r.AddRule(), position=None, attention=r.AttentionRule(), scale=r.ScaleRule(),
                   gate=r.GateRule(), pixels=r.ZBox, start=one_on_target),
    "conservative": RuleSet(linear=r.Gradient, norm=r.ConstantStd, activation=r.PassUnchanged, dropout=None,
                            residual=r.AddRule(), position=None, attention=r.ConstantAttention(), scale=r.ScaleRule(),
                            gate=r.GateRule(), pixels=r.Gradient, start=target_logit),
    "abslrp": RuleSet(linear=r.AbsoluteLinear, norm=r.AbsoluteNorm, activation=r.AbsoluteElementwise,
                      dropout=r.AbsoluteElementwise, residual=r.AbsoluteAdd(), position=r.absolute_position,
                      attention=r.AbsoluteAttention(), scale=r.AbsoluteScale(), gate=r.GateRule(),
                      pixels=r.AbsoluteConv, start=one_on_target),
    "attnlrp": attention_aware(constant_attention=False),
    "cplrp": attention_aware(constant_attention=True),
}


#: the LRP-αβ Linear rules of Chefer et al.'s two files: one denominator (``layers_ours.py``, conservative)
#: or the x⁺ and x⁻ parts each normalised by its own sum (``layers_lrp.py``'s ``Linear.relprop``)
LINEAR_RULES = {"shared": r.AlphaBeta, "separate": r.AlphaBetaSeparate}


def lrp_baseline(linear_rule: str = "shared") -> RuleSet:
    """Rule set ``"lrp"`` with the Linear rule of :data:`LINEAR_RULES` ``linear_rule`` names."""
    return replace(RULE_SETS["lrp"], linear=LINEAR_RULES[linear_rule])


def resolve_rules(rules: str | RuleSet) -> RuleSet:
    if isinstance(rules, RuleSet):
        return rules
    try:
        return RULE_SETS[rules]
    except (KeyError, TypeError):
        raise ValueError(f"unknown LRP rule set {rules!r}; choose one of {sorted(RULE_SETS)} "
                         "or pass a RuleSet") from None


__all__ = ["CONV_GAMMA", "GammaLinears", "LINEAR_GAMMA", "LINEAR_RULES", "LinearRules", "RULE_SETS", "RuleSet",
           "attention_aware", "lrp_baseline", "one_on_target", "other_classes", "resolve_rules", "target_logit"]
