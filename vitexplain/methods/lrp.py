"""Full LRP to the pixels, the "LRP" baseline of Chefer et al. (CVPR 2021)."""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import lrp_baseline, relevance
from ..registry import register_method


@register_method("lrp", resolution="pixel", cost=lambda o: 4 + o["recompute"], score_targets=False,
                 precision_caveats={"bfloat16 weights": -0.360, "float16 weights": -0.755})
def lrp(adapter: ModelAdapter, images: Tensor, target=None, *,
        linear_rule: Literal["shared", "separate"] = "shared", recompute: bool = False) -> Tensor:
    """Layer-wise relevance propagation from the target logit to the input pixels, summed over channels.

    Bach et al., "On Pixel-Wise Explanations for Non-Linear Classifier Decisions by Layer-Wise
    Relevance Propagation", PLOS ONE 2015, applied to ViT as in Chefer, Gur & Wolf, CVPR 2021
    (their "LRP" baseline, ``method="full"`` of ``ViT_orig_LRP.py``): rule set ``"lrp"`` of
    :mod:`vitexplain.instrumentation.lrp` — LRP-αβ (α=1, β=0) for Linear layers, relevance
    passed unchanged through LayerNorm, GELU and softmax, halved z-rule at the attention products,
    z-rule at the residual and position-embedding adds, prefix tokens dropped, and the z^B rule at the
    patch-embedding convolution. Returns the pixel map [B, H, W] (their evaluation also uses it at
    pixel level, without upsampling).

    Options:
        linear_rule: ``"shared"`` (default): LRP-αβ with one denominator Σ(x_i w_ji)⁺ for the positive
            and negative inputs, which conserves relevance (ours, docs/decisions/lrp.md);
            ``"separate"``: the x⁺ and x⁻ parts each normalised by their own sum, exactly the
            ``Linear.relprop`` of ``layers_lrp.py`` that produced the LRP rows the papers copy from
            Chefer et al. (the reproduce recipes use it there).
        recompute: compute each block again in the backward, so that peak memory does not grow with blocks ×
            tokens², for one more forward of the blocks; False (default): one forward and one backward
            (docs/decisions/performance.md).
    """
    return relevance(adapter, images, target, rules=lrp_baseline(linear_rule), at=("pixels",),
                     recompute=recompute).pixels.sum(1)
