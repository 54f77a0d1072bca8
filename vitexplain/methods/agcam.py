"""Attention Guided CAM (Leem & Seo, AAAI 2024)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter, Recording
from ..registry import register_method
from ._fusion import Fusion, fuse


@register_method(modalities=("image", "text"))
def agcam(adapter: ModelAdapter, inputs: Tensor, target=None, *, head_fusion: Fusion = "sum",
          layer_fusion: Fusion = "sum", gradient_of: Literal["attn", "attn_logits"] = "attn",
          detach_attention_input: bool = True) -> Tensor:
    """Attention Guided CAM: sigmoid-normalised attention scores weighted by positive gradients.

    Leem & Seo, "Attention Guided CAM: Visual Explanations of Vision Transformer Guided by
    Self-Attention", AAAI 2024, Sec. "Methodology": the feature maps are the class token's row of
    every block's attention scores normalised with a sigmoid instead of the softmax,
    F_h^k = σ(S_h^k[cls, :]) with S = q k^T / √D (Eq. 2); the weights are the positive gradients of
    the target logit with respect to the attention, α_h^{k,c} = ReLU(∂y_c/∂A_h^k[cls, :]) (Eq. 7);
    the map is L^c = Σ_k Σ_h α_h^{k,c} ⊙ F_h^k over the patch tokens. With a pooled readout, the
    readout's rows take the class token's (docs/decisions/readouts.md); a hierarchical model's blocks
    meet on its first stage's grid (docs/decisions/families.md).

    Following the authors' code (LeemSaebom/Attention-Guided-CAM-...), the gradient is taken at the
    softmax output (their ``backward_hook_after_softmax``) and heads and blocks are summed, and, as
    in their model, every attention sublayer's input is detached, so gradients reach each attention
    map only through the skip connections and MLPs of the blocks above.

    Options:
        head_fusion: how heads are combined, ``sum`` (the authors') | ``mean`` | ``max`` | ``min``.
        layer_fusion: how blocks are combined, ``sum`` (the authors') | ``mean`` | ``max`` | ``min``.
        gradient_of: ``attn`` (the softmax output, the authors' code) | ``attn_logits`` (the scores
            S themselves, the same tensor the feature maps are made from).
        detach_attention_input: stop gradients at every attention sublayer's input (the authors'
            model, default) or let them flow through the attention of later blocks (False).
    """
    def block_map(record: Recording, block: BlockRecord) -> Tensor:  # Σ_h α_h ⊙ F_h of one block [B, h, w]
        weighted = block.mixing(block.grads[gradient_of].clamp(min=0) * block.attn_logits.sigmoid())
        return record.geometry.patch_map(fuse(record.geometry.readout_rows(weighted), 1, head_fusion))

    record = adapter.record(inputs, target, fields=("attn_logits",), grads=(gradient_of,), reduce=block_map,
                            stop_gradient=("attn_input",) if detach_attention_input else ())
    return fuse(torch.stack([block.reduced for block in record.blocks], dim=1), 1, layer_fusion)
