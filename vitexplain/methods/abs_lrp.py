"""Relative absolute magnitude LRP (absLRP) of Vukadin et al. (ACM TIST 2024)."""
from __future__ import annotations

import dataclasses

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import RULE_SETS, other_classes, relevance
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..registry import register_method


@register_method(resolution="pixel", cost=lambda o: (4 + (o["recompute"] is True)) * (1 + o["contrastive"]),
                 score_targets=False,
                 precision_caveats={"bfloat16 weights": 0.764, "float16 weights": 0.988})
def abs_lrp(adapter: ModelAdapter, images: Tensor, target=None, *, contrastive: bool = True,
            recompute: Recompute = "auto") -> Tensor:
    """absLRP pixel relevance of the target class, minus that of all other classes, summed over channels.

    Vukadin, Afrić, Šilić & Delač, "Advancing Attribution-Based Neural Network Explainability through
    Relative Absolute Magnitude Layer-Wise Relevance Propagation and Multi-Component Evaluation", ACM
    TIST 15(3), 2024 (arXiv 2412.09311), compared in GradToken's Table 1. Rule set ``"abslrp"`` of
    :mod:`vitexplain.instrumentation.lrp`: at every layer y = f(x) the relevance follows the
    positive contributions only, divided by the absolute output, R_x = x ⊙ ∂[f(x) + f_abs(|x|)]ᵀ
    (R_y / |y|) (for a Linear: R_i = Σ_j (x_i w_ji + |x_i w_ji|) / |y_j| · R_j), and each input's
    relevance is then rescaled to Σ|R| = 1 per image. The paper's text could not be consulted here;
    the rules and their placement follow the authors' code (davor10105/relative-absolute-magnitude-
    propagation, ``abslrp_gae``, which its README ties to the paper) and GradToken's description
    (Sec. 2.2: negative contributions discarded, the absolute output used for normalisation).

    Args:
        contrastive: as the authors' ``AbsLRPRelevancyMethod``: the map is R(target) − R(others),
            where R(target) starts from 1 on the target logit and R(others) from 1/(C-1) on every
            other logit, each propagated to the pixels (where each has Σ|R| = 1). False returns
            R(target) alone.
        recompute: ``"auto"`` (default): keep every block's rules' graph from the forward when its estimated peak
            memory fits the budget (80 % of the free CUDA memory or of the available RAM, or
            ``VITEXPLAIN_MEMORY_BUDGET``), else compute each block again in the backward
            (:func:`~vitexplain.instrumentation.lrp.memory.choose_recompute`, logged at debug level). True: always
            compute each block again in each backward, so that peak memory does not grow with blocks × tokens² (2.1×
            a forward+backward's at 784 tokens, 5.3× without); False: every block's graph kept, faster by about a
            third. Bitwise the same maps on either path (docs/decisions/performance.md).

    Returns the pixel map [B, H, W]: the channel sum of the pixel relevance, as the authors'
    visualisation and GradToken's pixel-level evaluation. Not rescaled (their ``relevancy`` also
    divides by the per-image max |value|, a positive factor left to visualisation and evaluation).
    """
    recompute = choose_recompute("abs_lrp", recompute, adapter, images)
    explained = relevance(adapter, images, target, rules="abslrp", at=("pixels",), recompute=recompute)
    pixels = explained.pixels
    if contrastive:
        dual = dataclasses.replace(RULE_SETS["abslrp"], start=other_classes)
        pixels = pixels - relevance(adapter, images, explained.targets, rules=dual, at=("pixels",),
                                    recompute=recompute).pixels
    return pixels.sum(1)
