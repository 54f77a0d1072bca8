"""Beyond Intuition, head-wise attribution (Chen et al., TMLR 2022)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._gradients import IntegrationSteps, perception_times_feedback, resolve_start_layer

#: First block of the attention perception in the authors' perturbation runs of "ours" (``start_layer=4``,
#: which their loop turns into block index 3) for 12-block ViT-B.
AUTHORS_START_LAYER = 3


@register_method(cost=lambda o: 3 * o["n_steps"] + 3)
def bt_head(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int | None = None,
            n_steps: IntegrationSteps = 20, batch_size: PositiveInt = 16) -> Tensor:
    """Beyond Intuition, head-wise (BT-H): gradient-weighted heads rolled out, times integrated gradients.

    Chen, Li, Yu, Dou & Xiong, "Beyond Intuition: Rethinking Token Attributions inside
    Transformers", TMLR 2022 (2023). The map is the element-wise product of two terms, read at the
    class token's row:

    * attention perception, head-wise: per block l ≥ ``start_layer`` each head h gets the weight
      I_h = mean_ij |(A_h^T ∇A_h)_ij| (∇A_h = ∂y_c/∂A_h at the image), normalised to Σ_h I_h = 1;
      Â_l = Σ_h I_h A_h and P = (I + Â_L)(I + Â_L-1) ⋯ (I + Â_start);
    * reasoning feedback: W = mean_h ( (1/n_steps) Σ_k ∂y_c/∂A_L,h (a_k x) )^+, a_k = k/(n_steps-1),
      the integrated gradient of the last attention map from the zero image;

        map = (P ⊙ W)[cls, patches].

    Formulas follow the authors' ``generate_ours`` (jiaminchen-1031/transformerinterp), y_c the
    target logit, gradients at the attention probabilities. Their head weights are normalised over
    the whole batch (they ran one image at a time); here they are normalised per image. Hierarchical
    models: docs/decisions/families.md.

    Options:
        start_layer: lowest block of the attention perception (0-based, negative counts from the
            end). None = the authors' block 3 for a 12-block ViT-B (their ``start_layer=4`` in the
            perturbation runs, which their loop takes as ``block >= start_layer - 1``), scaled to the
            model's depth (3·depth // 12).
        n_steps: integration steps (the authors' 20); all steps of all images run batched.
        batch_size: scaled images per forward/backward pass of the integration; bounds memory only.
    """
    start = resolve_start_layer(start_layer, AUTHORS_START_LAYER, adapter.num_blocks)
    chosen = range(start, adapter.num_blocks)
    record = adapter.record(images, target, fields=("attn",), blocks=chosen, grads={"attn": chosen})
    fused = []
    for block in record.blocks[start:]:
        attn, grad = block.attn, block.grads["attn"]
        # mean over the matrix (windowed: over its windows' blocks, a per-block factor the normalisation cancels)
        importance = (attn.transpose(-1, -2) @ grad).abs().flatten(2).mean(-1)  # [B, H]
        # (a block whose attention does not reach the output, e.g. a zero-initialised res-post norm: no weight)
        importance = importance / importance.sum(1, keepdim=True).clamp_min(torch.finfo(importance.dtype).tiny)
        fused.append(block.mixing(torch.einsum("bh,bh...->b...", importance, attn)))
    return perception_times_feedback(adapter, images, record, fused, n_steps=n_steps, batch_size=batch_size)
