"""Transformer Attribution (Chefer, Gur & Wolf, CVPR 2021): LRP relevance of attention × its gradient, rolled out."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter, TokenGeometry
from ..instrumentation.lrp import relevance
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..options import block_index
from ..registry import register_method
from ._products import ReadoutFold


@register_method(cost=8, score_targets=False,
                 precision_caveats={"bfloat16 weights": 0.735, "float16 weights": 0.374},
                 reference="latec",
                 departures="None in substance: LATEC runs Chefer et al.'s code (`start_layer` 0, rows not "
                            "renormalised), whose rules ours follows (rule set `chefer`). LATEC upsamples the map "
                            "16× bilinearly and min-max scales it; ours stays on the patch grid, unscaled.")
def transformer_attribution(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int = 0,
                            recompute: Recompute = "auto") -> Tensor:
    """Relevance of each block's attention map weighted by its gradient, rolled out from ``start_layer``.

    Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization", CVPR 2021,
    Sec. 3.3, Eq. (9)-(10): Ā_b = I + E_h[(∇A_b ⊙ R^{A_b})⁺], C = Ā_B · … · Ā_start; the class token's
    row over the patches. R^{A_b} is the LRP relevance of block b's attention probabilities under
    their rules (Sec. 3.1-3.2; rule set ``"chefer"`` of :mod:`vitexplain.instrumentation.lrp`,
    propagated from relevance 1 on the target logit); ∇A_b is the plain gradient of the target
    logit, taken through the same forward as the relevance (docs/decisions/performance.md). As in
    hila-chefer/Transformer-Explainability (``compute_rollout_attention`` of ``ViT_LRP.py``), the rows
    of Ā_b are not renormalised. Pooled readouts: docs/decisions/readouts.md; hierarchical models:
    docs/decisions/families.md.

    Options:
        start_layer: first block included (0, the default of their code; their segmentation and
            perturbation tests use 1).
        recompute: ``"auto"`` (default): keep every block's rules' graph from the forward when its estimated peak
            memory fits the budget (80 % of the free CUDA memory or of the available RAM, or
            ``VITEXPLAIN_MEMORY_BUDGET``), else compute each block again in the backward
            (:func:`~vitexplain.instrumentation.lrp.memory.choose_recompute`, logged at debug level). True: always
            compute each block again under the rules as the relevance's backward reaches it, so that peak memory
            does not grow with blocks × tokens²; False: every block's graph kept from the forward, one forward of the
            blocks fewer, for that memory (16 % faster on an H100 at ViT-B/16, batch 64;
            docs/decisions/performance.md). Bitwise the same maps on either path in float64; in float32 within ~1e-7
            of the largest value (the recomputed path's forward runs the fused attention).
    """
    start = block_index("start_layer", start_layer, adapter.num_blocks)
    chosen = range(start, adapter.num_blocks)
    fold = ReadoutFold(chosen)
    recompute = choose_recompute("transformer_attribution", recompute, adapter, images, blocks=len(chosen))

    def cam(geometry: TokenGeometry, block: int, attn_relevance: Tensor, attn_gradient: Tensor) -> None:
        """Block's E_h[(∇A ⊙ R^A)⁺], folded into the readout's row as the relevance's backward passes the block."""
        fold(geometry, block, geometry.mixing(block, (attn_gradient * attn_relevance).clamp_(min=0).mean(1)))

    found = relevance(adapter, images, target, rules="chefer", at=("attn",), blocks=chosen, gradients=True, reduce=cam,
                      recompute=recompute)
    return fold.map(found.geometry)
