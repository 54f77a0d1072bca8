"""Position-aware LRP: AttnLRP with the position embedding's relevance given back (Bakish et al., NeurIPS 2025)."""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.lrp import attention_aware, relevance
from ..instrumentation.lrp.composites import CONV_GAMMA, LINEAR_GAMMA, RuleSet
from ..instrumentation.lrp.memory import Recompute, choose_recompute
from ..instrumentation.lrp.rules.positional import PositionShare, reachable_position
from ..options import NonNegative
from ..registry import register_method
from ._attention_aware import Gammas, Stage

#: how the position embedding's relevance enters the map: added to the input's (the authors' ``POS_ENC``), or alone
#: (their ``PE_ONLY``)
Positions = Literal["added", "only"]


@register_method(resolution="pixel", cost=lambda o: 4 + (o["recompute"] is True), score_targets=False)
def pa_lrp(adapter: ModelAdapter, images: Tensor, target=None, *, gamma: Gammas = LINEAR_GAMMA,
           conv_gamma: NonNegative = CONV_GAMMA, at: Stage = "pixels", positions: Positions = "added",
           clamp: bool = True, recompute: Recompute = "auto") -> Tensor:
    """AttnLRP to the pixels, plus the relevance of the learned position embedding spread over each patch.

    Bakish, Zimerman, Chefer & Wolf, "Revisiting LRP: Positional Attribution as the Missing Ingredient for
    Transformer Explainability", NeurIPS 2025. The input is read as position-token pairs: at the add y = x + p of the
    patch embeddings and the position embedding, the ε-rule gives p its share R_p = p ⊙ R_y / y, which AttnLRP
    drops (:class:`~vitexplain.instrumentation.lrp.rules.positional.PositionShare`). As the authors' vision code
    (``full_lrp_GammaLinear_POS_ENC_gammaConv`` of ``models/model.py``), each patch's R_p, summed over channels, is
    divided evenly among its pixels and added to the pixels' relevance (summed over channels), and the map is
    clamped at 0. Everything else is :func:`~vitexplain.methods.attnlrp.attnlrp` (same rules, same options, same
    defaults), so without the position term the map is AttnLRP's; the authors' own rules and defaults differ (γ = 100
    at the patch convolution; attention held constant with half the relevance to v): docs/decisions/pa-lrp.md.
    Models with rotary or relative positions only are refused.

    Options:
        gamma, conv_gamma, recompute: as :func:`~vitexplain.methods.attnlrp.attnlrp`.
        at: ``"pixels"`` (the authors' map) or ``"patches"`` (the patch embeddings' relevance, plus R_p, per patch,
            spread evenly over its pixels).
        positions: ``"added"`` (the authors' ``POS_ENC``, the default) or ``"only"`` (their ``PE_ONLY``: the
            position embedding's relevance alone).
        clamp: keep the positive part of the map, as the authors' code returns it (False: the signed relevance,
            whose sum is the target logit less what the biases and the class token absorb).
    """
    reachable_position(adapter, "pa_lrp")
    if not isinstance(gamma, (int, float)) and len(gamma) != adapter.num_blocks:
        raise ValueError(f"gamma takes one value, or one per block: {adapter.num_blocks} for this model, "
                         f"got {len(gamma)}")
    share = PositionShare()
    rules = _position_aware(gamma, conv_gamma, share)
    recompute = choose_recompute("pa_lrp", recompute, adapter, images)
    found = relevance(adapter, images, target, rules, at=(at,), recompute=recompute)
    grid = found.geometry.grid
    per_patch = share.relevance.sum(-1)
    if positions == "added" and at == "patches":
        per_patch = per_patch + found.patches.sum(-1)
    spread = _spread(per_patch.reshape(images.shape[0], 1, *grid), images.shape[-2:])
    if positions == "added" and at == "pixels":
        spread = spread + found.pixels.sum(1)
    return spread.clamp(min=0) if clamp else spread


def _position_aware(gamma: Gammas, conv_gamma: float, share: PositionShare) -> RuleSet:
    """AttnLRP's rule set (:func:`~vitexplain.instrumentation.lrp.attention_aware`) reading the position embedding's
    share into ``share``."""
    return replace(attention_aware(False, gamma, conv_gamma), position=share)


def _spread(per_patch: Tensor, size) -> Tensor:
    """Each patch's value [B, 1, h, w] divided evenly among its pixels [B, H, W]."""
    spread = F.interpolate(per_patch, size=tuple(size), mode="nearest")[:, 0]
    return spread * (per_patch.shape[-2] * per_patch.shape[-1] / spread[0].numel())
