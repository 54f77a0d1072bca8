"""Beyond Intuition, token-wise attribution (Chen et al., TMLR 2022)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._gradients import IntegrationSteps, perception_times_feedback, resolve_start_layer

#: First block of the attention perception in the authors' perturbation runs of "ours_c"
#: (``start_layer=7``, which their loop turns into block index 6) for 12-block ViT-B.
AUTHORS_START_LAYER = 6


@register_method(cost=lambda o: 3 * o["n_steps"] + 3)
def bt_token(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int | None = None,
             n_steps: IntegrationSteps = 20, batch_size: PositiveInt = 16) -> Tensor:
    """Beyond Intuition, token-wise (BT-T): norm-weighted attention rolled out, times integrated gradients.

    Chen, Li, Yu, Dou & Xiong, "Beyond Intuition: Rethinking Token Attributions inside
    Transformers", TMLR 2022. The map is the element-wise product of two terms, read at the class
    token's row:

    * attention perception, token-wise: per block l ≥ ``start_layer`` the attention sublayer's
      token transformation is approximated by the length ratio of each token,
      m_j = ||Σ_h v_h,j W^O_h|| / ||z_j|| (z = the block's input tokens, v W^O the values through the
      output projection, without its bias); Â_l = mean_h(A_h) diag(m) and
      P = (I + Â_L)(I + Â_L-1) ⋯ (I + Â_start);
    * reasoning feedback: W = mean_h ( (1/n_steps) Σ_k ∂y_c/∂A_L,h (a_k x) )^+, a_k = k/(n_steps-1),
      the integrated gradient of the last attention map from the zero image;

        map = (|P| ⊙ W)[cls, patches].

    Formulas follow the authors' ``generate_ours_c`` (jiaminchen-1031/transformerinterp), y_c the
    target logit, gradients at the attention probabilities. With LayerScale the projection includes
    the scale (the adapter folds it into ``head_projection``), so m measures what the sublayer adds.
    Hierarchical models: docs/decisions/families.md.

    Options:
        start_layer: lowest block of the attention perception (0-based, negative counts from the
            end). None = the authors' block 6 for a 12-block ViT-B (their ``start_layer=7`` in the
            perturbation runs, which their loop takes as ``block >= start_layer - 1``), scaled to the
            model's depth (6·depth // 12).
        n_steps: integration steps (the authors' 20); all steps of all images run batched.
        batch_size: scaled images per forward/backward pass of the integration; bounds memory only.
    """
    start = resolve_start_layer(start_layer, AUTHORS_START_LAYER, adapter.num_blocks)
    adapter.require_head_shares("bt_token", range(start, adapter.num_blocks))
    record = adapter.record(images, target, fields=("residual", "attn", "v"), blocks=range(start, adapter.num_blocks))
    scaled = []
    for block in record.blocks[start:]:
        projected = torch.einsum("bhnd,hdc->bnc", block.v, block.head_projection)
        lengths = projected.norm(dim=-1) / block.residual.norm(dim=-1)  # [B, N]
        scaled.append(block.mixing(block.attn.mean(1) * block.per_key(lengths)))
    return perception_times_feedback(adapter, images, record, scaled, n_steps=n_steps, batch_size=batch_size,
                                     absolute=True)
