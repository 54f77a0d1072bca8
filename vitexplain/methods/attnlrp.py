"""AttnLRP (Achtibat et al., ICML 2024), as LXT runs it on Vision Transformers."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp.composites import CONV_GAMMA, LINEAR_GAMMA
from ..instrumentation.lrp.memory import Recompute
from ..options import NonNegative
from ..registry import register_method
from ._attention_aware import Gammas, Stage, attention_aware_map


@register_method(resolution="pixel", cost=lambda o: 4 + (o["recompute"] is True), score_targets=False)
def attnlrp(adapter: ModelAdapter, images: Tensor, target=None, *, gamma: Gammas = LINEAR_GAMMA,
            conv_gamma: NonNegative = CONV_GAMMA, at: Stage = "pixels", recompute: Recompute = "auto") -> Tensor:
    """Attention-aware LRP from the target logit to the input pixels, summed over channels.

    Achtibat, Hatefi, Dreyer, Jain, Wiegand, Lapuschkin & Samek, "AttnLRP: Attention-Aware Layer-Wise
    Relevance Propagation for Transformers", ICML 2024, in one forward and one backward (Gradient×Input
    with the rules in the backward, as their library LXT computes it): the softmax's Taylor rule
    R_s = s ⊙ (R_A − A ΣR_A) (Prop. 3.1), half of the ε-rule to each operand of q·kᵀ and A·v (Prop. 3.3),
    the identity rule at GELU and through LayerNorm's standard deviation (Eq. 9, Prop. 3.4), the ε-rule at the
    adds and the attention's projections, and, as LXT's ViT example adds against noisy heatmaps, the γ-rule
    at the feed-forward and head Linears and at the patch convolution (rule set ``"attnlrp"``). Relevance
    starts at the target logit; the class token's and the biases' shares stay where they are absorbed.

    Options:
        gamma: γ of the feed-forward and head Linears: one value, or a list of one per block (the head takes
            the last; 0 is the ε-rule, so ``[0.25, 0.25, 0, 0]`` is γ below and ε above). LXT's example sweeps
            0 … 1 and names no default: 0.05, the middle of its sweep (docs/decisions/lrp.md).
        conv_gamma: γ at the patch convolution (0.25, the middle of LXT's sweep).
        at: ``"pixels"`` (LXT's example: input × gradient at the image, summed over channels) or
            ``"patches"`` (the patch embeddings' relevance, each patch's spread evenly over its pixels).
        recompute: ``"auto"`` (default): keep every block's rules' graph from the forward when its estimated peak
            memory fits the budget (80 % of the free CUDA memory or of the available RAM, or
            ``VITEXPLAIN_MEMORY_BUDGET``), else compute each block again in the backward
            (:func:`~vitexplain.instrumentation.lrp.memory.choose_recompute`, logged at debug level). True: always
            compute each block again, so that peak memory does not grow with blocks × tokens², for one more forward of
            the blocks; False: one forward and one backward, as LXT, every block's graph kept. Bitwise the same maps
            on either path (docs/decisions/performance.md).
    """
    return attention_aware_map(adapter, images, target, constant_attention=False, gamma=gamma,
                               conv_gamma=conv_gamma, at=at, recompute=recompute)
