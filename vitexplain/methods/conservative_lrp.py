"""Conservative LRP (Ali et al., ICML 2022)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import relevance
from ..registry import register_method


@register_method("conservative_lrp", cost=lambda o: 4 + o["recompute"], score_targets=False)
def conservative_lrp(adapter: ModelAdapter, images: Tensor, target=None, *, recompute: bool = False) -> Tensor:
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
        recompute: compute each block again in the backward, so that peak memory does not grow with blocks ×
            tokens², for one more forward of the blocks; False (default): one forward and one backward
            (docs/decisions/performance.md).
    """
    relevances = relevance(adapter, images, target, rules="conservative", at=("residuals",), recompute=recompute)
    return relevances.geometry.patch_map(relevances.tokens.sum(-1))
