"""CP-LRP (Achtibat et al., ICML 2024; Ali et al., ICML 2022), as LXT runs it on Vision Transformers."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp.composites import CONV_GAMMA, LINEAR_GAMMA
from ..instrumentation.lrp.memory import Recompute
from ..options import NonNegative
from ..registry import register_method
from ._attention_aware import Gammas, Stage, attention_aware_map


@register_method(resolution="pixel", cost=lambda o: 4 + (o["recompute"] is True), score_targets=False)
def cp_lrp(adapter: ModelAdapter, images: Tensor, target=None, *, gamma: Gammas = LINEAR_GAMMA,
           conv_gamma: NonNegative = CONV_GAMMA, at: Stage = "pixels", recompute: Recompute = "auto") -> Tensor:
    """LRP with the attention probabilities held constant and γ-rules, from the target logit to the pixels.

    The propagation LXT applies to ViTs (``cp_LRP`` of ``lxt/efficient/models/vit_torch.py``, Achtibat et al.,
    ICML 2024, with the γ-rules of their ViT example): conservative propagation inside the attention — the
    softmax held constant, so A·v hands all relevance to v (Ali et al., "XAI for Transformers: Better
    Explanations through Conservative Propagation", ICML 2022, AH-rule) — and AttnLRP outside it: the
    identity rule at GELU and through LayerNorm's standard deviation, the ε-rule at the adds and the attention's
    projections, the γ-rule at the feed-forward and head Linears and at the patch convolution (rule set
    ``"cplrp"``). It differs from ``conservative_lrp`` (Ali et al.'s own rules, LRP-0 at every Linear, read
    at the token embeddings) by the γ-rules and by where it is read (docs/decisions/lrp.md).

    Options: ``gamma``, ``conv_gamma``, ``at`` and ``recompute`` as for :func:`~vitexplain.methods.attnlrp.attnlrp`.
    """
    return attention_aware_map(adapter, images, target, constant_attention=True, gamma=gamma,
                               conv_gamma=conv_gamma, at=at, recompute=recompute)
