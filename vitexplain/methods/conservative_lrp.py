"""Conservative LRP (Ali et al., ICML 2022)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import relevance
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..registry import register_method


@register_method(cost=lambda o: 4 + (o["recompute"] is True), score_targets=False)
def conservative_lrp(adapter: ModelAdapter, images: Tensor, target=None, *, recompute: Recompute = "auto") -> Tensor:
    """Gradient×Input at the token embeddings with attention and LayerNorm scaling held constant.

    Ali, Schnake, Eberle, Montavon, Müller & Wolf, "XAI for Transformers: Better Explanations through
    Conservative Propagation", ICML 2022, Sec. 4: the AH-rule (attention probabilities treated as
    constants, so relevance flows only through the values) and the LN-rule (LayerNorm's standard
    deviation treated as a constant), then Gradient×Input of the target logit at the embeddings fed
    to the first block, as in AmeenAli/XAI_Transformers (``forward_and_explain``: detached softmax and
    LayerNorm std, relevance summed over the hidden dimension). Where the paper is silent: the MLP's
    GELU passes relevance unchanged (x · Φ(x) with Φ(x) held constant, which is what Gradient×Input
    does for ReLU), so the whole propagation is conservative up to the biases. Returns the patch
    tokens' relevance, summed over channels, on the patch grid.

    Options:
        recompute: ``"auto"`` (default), True or False: whether each block is computed again in the backward
            instead of keeping its rules' graph, as for :func:`~vitexplain.methods.lrp.lrp` (bitwise the same maps).
    """
    recompute = choose_recompute("conservative_lrp", recompute, adapter, images)
    relevances = relevance(adapter, images, target, rules="conservative", at=("residuals",), recompute=recompute)
    return relevances.geometry.patch_map(relevances.tokens.sum(-1))
