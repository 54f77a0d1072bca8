"""LibraGrad: a Transformer's backward pruned and scaled for gradient methods, placed where LRP's rules go.

Mehri, Baghshah & Pilehvar, "LibraGrad: Balancing Gradient Flow for Universally Better Vision Transformer
Attributions", CVPR 2025 (code: NightMachinery/decompv-libragrad-v1, its preset ``"LibraGrad"`` in
``decompv/x/gbrand.py``; the backward in their timm fork NightMachinery/pytorch-image-models-libragrad-v1,
``timm/night/decomposition.py``). Gradients through a Transformer are unbalanced (its bilinear and gating paths
break FullGrad-completeness); LibraGrad prunes those paths and scales the rest, leaving the forward untouched, so
any gradient method (Input × Gradient, Integrated Gradients, SmoothGrad, Grad-CAM …) runs on the rebalanced
backward at no extra cost. The preset is the gradient brand ``LX1`` with ``mlp_mul_gbrand="DU"``; in vitexplain's
rule vocabulary (:mod:`.lrp.rules`):

* attention: q and k detached (their ``fair_qkv``, mode ``LineX_1``), so the probabilities are constants and the
  gradient passes through v alone — :class:`~.lrp.rules.ConstantAttention`;
* LayerNorm: the variance detached, the mean kept (``LayerNormDecomposed``, ``LineX_1``) —
  :class:`~.lrp.rules.ConstantStd` (an RMSNorm: its root mean square constant);
* the feed-forward's gating activation x·g(x) (GELU, SiLU): g detached (``LineX_ZO``) —
  :class:`~.lrp.rules.gating.ConstantGate`;
* a gated feed-forward's product of two input-dependent branches (SwiGLU, GLU): its gradient halved (their
  ``fair_gated_mlp``, mode ``DU``) — :class:`~.lrp.rules.UniformGate`, with the activation's gate held constant
  as above;
* everything else (Linears, the residual and position adds, LayerScale, the head, the patch convolution): the
  plain gradient.

What the authors' presets set for every method alike (plain gradients included) is not part of this: the target's
softmax probability as the score (``softmax_mode="S1"``) and "dissent suppression" at the patch convolution
(``patchifier_gbrand="DS100"``); see docs/decisions/libragrad.md.

:func:`libragrad` applies it for the length of a ``with`` block: forward values unchanged (the attention is
computed unfused, ~1e-6), the backward must run inside the block, and the model comes back exactly as it was, also
after an exception. It reuses LRP's placement (:func:`~.lrp.lrp_rules`), so it serves every family LRP serves and
refuses, in one line, the others.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .adapter import ModelAdapter
from .families import ForwardOnly, UnsupportedModelError
from .lrp import RuleSet, Trace, lrp_rules
from .lrp import rules as r
from .lrp.composites import target_logit
from .lrp.placement import _check_covered
from .lrp.rules.gating import ConstantGate

#: LibraGrad's backward as a rule set (the preset ``"LibraGrad"``: brand ``LX1``, gated products ``DU``)
LIBRAGRAD = RuleSet(linear=r.Gradient, norm=r.ConstantStd, activation=ConstantGate, dropout=None,
                    residual=r.AddRule(), position=None, attention=r.ConstantAttention(), scale=r.ScaleRule(),
                    gate=r.UniformGate(), pixels=r.Gradient, start=target_logit)


def libragrad_refusal(adapter: ModelAdapter) -> str | None:
    """Why LibraGrad's rules cannot be placed on ``adapter``'s model (one line), or None."""
    if isinstance(adapter.family, ForwardOnly):
        return (f"libragrad=True rebalances the backward of a Transformer's attention, norms and activations; "
                f"{adapter.family.unreachable}")
    try:
        _check_covered(adapter)
    except UnsupportedModelError as error:
        return f"libragrad=True places its backward rules where LRP's go, and {error}"
    return None


@contextlib.contextmanager
def libragrad(adapter: ModelAdapter) -> Iterator[Trace]:
    """Within the block, gradients through ``adapter``'s model follow LibraGrad's backward; yields LRP's
    :class:`~.lrp.Trace` (``trace.residuals[i]``: block i's input, ``trace.residuals[num_blocks]`` the last
    block's output, of the latest forward), from which a method reads gradients at a block's tokens.

    Refuses a model it cannot serve with :class:`UnsupportedModelError` before changing anything. Each block's graph
    is kept from the forward (no computation again in the backward: the memory of a plain unfused backward).
    """
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"libragrad takes a ModelAdapter (vitexplain.adapter_for(model)), got {type(adapter).__name__}")
    reason = libragrad_refusal(adapter)
    if reason is not None:
        raise UnsupportedModelError(reason)
    with lrp_rules(adapter, LIBRAGRAD, pixels=False, recompute=False) as trace:
        yield trace


def libragrad_if(adapter: ModelAdapter, enabled: bool) -> contextlib.AbstractContextManager:
    """:func:`libragrad` when ``enabled``, else nothing: the one switch of the gradient methods' ``libragrad``
    option."""
    return libragrad(adapter) if enabled else contextlib.nullcontext()


__all__ = ["LIBRAGRAD", "libragrad", "libragrad_if", "libragrad_refusal"]
