"""Generic attention explainability (Chefer et al., ICCV 2021)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter, identity_like
from ..registry import register_method


@register_method("gae", modalities=("image", "text"))
def gae(adapter: ModelAdapter, images: Tensor, target=None) -> Tensor:
    """Generic Attention-model Explainability for self-attention encoders.

    Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal and
    Encoder-Decoder Transformers", ICCV 2021, Eq. (5)-(6): R = I; for every block
    R <- R + mean_h((∇A ⊙ A)^+) · R; the class token's row over the patches. Gradients are of the
    target logit, as in hila-chefer/Transformer-MM-Explainability.
    """
    adapter.require_class_token("gae")
    record = adapter.record(images, target, grads=("attn",))
    relevance = None
    for block in record.blocks:
        cam = (block.grads["attn"] * block.attn).clamp(min=0).mean(1)
        relevance = identity_like(cam) if relevance is None else relevance
        relevance = relevance + torch.bmm(cam, relevance)
    return record.class_row(relevance)
