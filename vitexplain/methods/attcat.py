"""AttCAT: attentive class activation tokens (Qiang et al., NeurIPS 2022)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter, Recording
from ..instrumentation.windows import mix_rows
from ..registry import register_method


@register_method(modalities=("image", "text"))
def attcat(adapter: ModelAdapter, inputs: Tensor, target=None, *, attention_row: Literal["mean", "class"] = "mean",
           tokens: Literal["input", "attn_input", "output"] = "input") -> Tensor:
    """AttCAT: per block, gradient × token features (class activation tokens) weighted by attention, summed.

    Qiang, Pan, Li, Li, Jang & Zhu, "AttCAT: Explaining Transformers via Attentive Class Activation
    Tokens", NeurIPS 2022: the class activation token of token i in block l is
    CAT_i^l = ∇h_i^l ⊙ h_i^l (∇ = ∂y_c/∂h, Grad-CAM on the token features), attentive by the
    head-averaged attention token i receives, and summed over the feature channels and the blocks:

        AttCAT_i = Σ_l α_i^l Σ_c (∂y_c/∂h^l_ic) h^l_ic,   α_i^l = mean_h mean_q A^l_h[q, i].

    Following the authors' ``generate_attcat`` (qiangyao1988/AttCAT): h^l are the tokens entering
    block l, the residual stream before the block's LayerNorm (their BERT code's ``hidden_states[l]``;
    docs/decisions/baselines-attention.md), α^l is block l's attention averaged over heads and over
    all query rows, y_c is the target logit, no ReLU; their final min-max scaling is left to
    visualisation. A hierarchical model's blocks meet on its first stage's grid
    (docs/decisions/families.md).

    Options:
        attention_row: ``mean`` (all query rows averaged, the authors' code) | ``class`` (the class
            token's row, i.e. the attention the class token pays to token i; the readout's row for
            pooled readouts).
        tokens: ``input`` (block input, the pre-LayerNorm residual stream, the authors' code) |
            ``attn_input`` (the LayerNorm-ed tokens the attention reads) | ``output`` (block output).
    """
    def attentive(record: Recording, block: BlockRecord) -> Tensor:  # α of one block [B, N]
        heads = block.mixing(block.attn.mean(1))
        if attention_row == "class":
            return record.geometry.readout_rows(heads)
        every_query = torch.full_like(block.residual[..., 0], 1 / block.residual.shape[1])
        return mix_rows(every_query, heads)

    features_of = {"input": "residual", "attn_input": "attn_input", "output": "block_output"}[tokens]
    record = adapter.record(inputs, target, grads=(features_of,), reduce=attentive,
                            fields=("attn", "residual", features_of))
    relevance = 0
    for block in record.blocks:
        cat = (block.grads[features_of] * getattr(block, features_of)).sum(-1)  # [B, N]
        relevance = relevance + record.geometry.patch_map(block.reduced * cat)
    return relevance
