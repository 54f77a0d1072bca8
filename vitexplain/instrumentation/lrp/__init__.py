"""Layer-wise relevance propagation (LRP) through a Transformer's own modules, laid out as zennit is.

* :mod:`.rules` — the rules, as objects, in three parts: :mod:`.rules.core` (the phases of one forward and the
  gradient trick), :mod:`.rules.modules` (module rules: Linear, LayerNorm, activation, dropout, patch
  convolution) and :mod:`.rules.operations` (residual and position adds, attention products and softmax,
  LayerScale, gates, dropouts);
* :mod:`.composites` — rule sets (which rule each part gets): ``chefer``, ``lrp``, ``conservative``,
  ``abslrp``, ``attnlrp``, ``cplrp``;
* :mod:`.placement` — where the parts are comes from the model's family description: the rule set's
  module rules go on the model's modules by type (a Linear's also by its role and block), its operation
  rules are the arithmetic of the written-out blocks and attention (:func:`lrp_rules`);
* :mod:`.trace` — what a forward under the rules leaves behind to read relevance at (:class:`Trace`);
* :mod:`.propagation` — one forward and one backward: :func:`relevance` and the :class:`Relevance` it
  returns (its token geometry a :class:`~vitexplain.instrumentation.geometry.TokenGeometry`).
* :mod:`.memory` — whether a method keeps its rules' graphs or computes each block again
  (``recompute="auto"``: an estimate of the kept graphs' peak against the free memory).

Like zennit, this changes how the model computes its *backward* while leaving its forward values
untouched, so that one ordinary backward pass propagates relevance. :func:`lrp_rules` applies a rule
set for the length of a ``with`` block (everything removed on exit, also after an exception), and
:func:`relevance` runs one forward and one backward and returns the relevance asked for.
"""
from __future__ import annotations

from .composites import (
    RULE_SETS,
    RuleSet,
    attention_aware,
    lrp_baseline,
    other_classes,
    resolve_rules,
)
from .placement import RuleArithmetic, lrp_rules
from .propagation import STAGES, Relevance, relevance
from .trace import Trace

__all__ = ["RULE_SETS", "Relevance", "RuleArithmetic", "RuleSet", "STAGES", "Trace", "attention_aware", "lrp_baseline",
           "lrp_rules", "other_classes", "relevance", "resolve_rules"]
