"""Full LRP to the pixels, the "LRP" baseline of Chefer et al. (CVPR 2021)."""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import lrp_baseline, relevance
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..registry import register_method


@register_method(resolution="pixel", cost=lambda o: 4 + (o["recompute"] is True), score_targets=False,
                 precision_caveats={"bfloat16 weights": -0.360, "float16 weights": -0.755},
                 reference="latec",
                 departures="On a ViT LATEC's full LRP runs Chefer et al.'s transformer-attribution rules "
                            "(`layers_ours`: every residual and the position-embedding add normalised), sums the "
                            "channels and keeps the positive part; ours is their LRP baseline's rule set "
                            "(`layers_lrp`: the plain z-rule at those adds) with the same shared αβ Linear rule, "
                            "signed.")
def lrp(adapter: ModelAdapter, images: Tensor, target=None, *,
        linear_rule: Literal["shared", "separate"] = "shared", recompute: Recompute = "auto") -> Tensor:
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
        recompute: ``"auto"`` (default): keep every block's rules' graph from the forward when its estimated peak
            memory fits the budget (80 % of the free CUDA memory or of the available RAM, or
            ``VITEXPLAIN_MEMORY_BUDGET``), else compute each block again in the backward
            (:func:`~vitexplain.instrumentation.lrp.memory.choose_recompute`, logged at debug level). True: always
            compute each block again, so that peak memory does not grow with blocks × tokens², for one more forward of
            the blocks; False: one forward and one backward, every block's graph kept. Bitwise the same maps on
            either path (docs/decisions/performance.md).
    """
    recompute = choose_recompute("lrp", recompute, adapter, images)
    return relevance(adapter, images, target, rules=lrp_baseline(linear_rule), at=("pixels",),
                     recompute=recompute).pixels.sum(1)
