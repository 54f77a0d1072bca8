"""Partial LRP (Voita et al., ACL 2019) as Chefer et al. (CVPR 2021) evaluate it on ViT."""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import lrp_baseline, relevance
from ..registry import register_method


@register_method(cost=5, score_targets=False,
                 precision_caveats={"bfloat16 weights": 0.955})
def partial_lrp(adapter: ModelAdapter, images: Tensor, target=None, *,
                linear_rule: Literal["shared", "separate"] = "shared") -> Tensor:
    """LRP relevance of the last block's attention map: class token's row, positive part averaged over heads.

    Voita, Talbot, Moiseev, Sennrich & Titov, "Analyzing Multi-Head Self-Attention: Specialized Heads
    Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019, Sec. 4 (head relevance by LRP), in the
    form of Chefer et al.'s "partial LRP" baseline (CVPR 2021): ``method="last_layer"`` of
    ``ViT_orig_LRP.py`` in hila-chefer/Transformer-Explainability — relevance of the last attention
    probabilities under the ``"lrp"`` rule set (plain z-rule at the residual adds), clamped at zero,
    averaged over heads, the class token's row over the patches. Depends on the target only through
    the classifier's relevance, so maps for different classes are similar.

    Options:
        linear_rule: ``"shared"`` (default, ours) or ``"separate"`` (the reference code's Linear rule),
            as for :func:`~vitexplain.methods.lrp.lrp`.
    """
    relevances = relevance(adapter, images, target, rules=lrp_baseline(linear_rule), at=("attn",), blocks=(-1,))
    geometry = relevances.geometry
    return geometry.readout_row(geometry.mixing(-1, relevances.attn[-1].clamp(min=0).mean(1)))
