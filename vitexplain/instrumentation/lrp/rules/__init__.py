"""LRP rules as objects, in three parts a reader can take one at a time.

:mod:`.core` holds the phases of one forward and the gradient trick every rule stands on, :mod:`.modules` the
rules placed on modules (linear layers, norms, activations, convolutions) and :mod:`.operations` those of the
adds, attention products, scales, gates and dropouts of the written-out blocks. Rule sets (:mod:`..composites`)
say which rule each part gets; :mod:`..placement` puts them on a model. Here the names the rest of the package
reads as ``rules.X``; the stabiliser is read where it lives, ``rules.core.STABILISER``, so that changing it
reaches every rule."""
from .core import (
                   Phase,
                   RestoredPhase,
                   absolute_rule,
                   both_gradients,
                   halved_product,
                   held_constant,
                   normalise_relevance,
                   passes_unchanged,
                   product,
                   proportional,
                   rules_apply,
                   safe_divide,
                   with_gradient_of,
)
from .modules import (
                   AbsoluteConv,
                   AbsoluteElementwise,
                   AbsoluteLinear,
                   AbsoluteNorm,
                   AlphaBeta,
                   AlphaBetaSeparate,
                   ConstantStd,
                   Gamma,
                   Gradient,
                   ModuleRule,
                   PassUnchanged,
                   ZBox,
                   norm_types,
)
from .operations import (
                   AbsoluteAdd,
                   AbsoluteAttention,
                   AbsoluteScale,
                   AddRule,
                   AttentionRule,
                   ConstantAttention,
                   GateRule,
                   NormalisedAdd,
                   ScaleRule,
                   TaylorAttention,
                   UniformGate,
                   absolute_passthrough,
                   absolute_position,
)

__all__ = ["AbsoluteAdd", "AbsoluteAttention", "AbsoluteConv", "AbsoluteElementwise", "AbsoluteLinear",
           "AbsoluteNorm", "AbsoluteScale", "AddRule", "AlphaBeta", "AlphaBetaSeparate", "AttentionRule",
           "ConstantAttention", "ConstantStd", "Gamma", "GateRule", "Gradient", "ModuleRule", "NormalisedAdd",
           "PassUnchanged", "Phase", "RestoredPhase", "ScaleRule", "TaylorAttention", "UniformGate",
           "ZBox", "absolute_passthrough", "absolute_position", "absolute_rule", "both_gradients", "halved_product",
           "held_constant", "norm_types", "normalise_relevance", "passes_unchanged", "product", "proportional",
           "rules_apply", "safe_divide", "with_gradient_of"]
