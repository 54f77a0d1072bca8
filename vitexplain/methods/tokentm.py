"""TokenTM: token transformation measurement (Wu et al., CVPR 2024)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter, Recording, UnsupportedModelError
from ..instrumentation.test_time_registers import Registers, test_time_registers
from ..options import block_index
from ..registry import register_method
from ._products import readout_map


def transformation_weights(reference_norm: Tensor, transformed_norm: Tensor, dot: Tensor,
                           use_length: bool, use_necc: bool) -> Tensor:
    """Diagonal of W (Eq. 13) per token [..., N]: L(Ẽ_j)/L(E_j) · NECC(j), either factor switchable.

    ``dot`` is E_j · Ẽ_j. NECC (Eq. 12) is the softmax over the N tokens of cos(E_j, Ẽ_j).
    Without either factor W = I, the plain attention weights of Eq. (8).
    """
    eps = torch.finfo(transformed_norm.dtype).eps
    weights = torch.ones_like(transformed_norm)
    if use_length:
        weights = transformed_norm / reference_norm.clamp_min(eps)
    if use_necc:
        cosine = dot / (reference_norm * transformed_norm).clamp_min(eps)
        weights = weights * cosine.softmax(-1)
    return weights


def attention_weights(block: BlockRecord, reference: Tensor, per_head: bool, use_length: bool,
                      use_necc: bool) -> Tensor:
    """W of the MHSA sublayer (Eq. 13) as [B, H, N] (per head) or [B, 1, N] (shared by the heads).

    Head h's transformed tokens are Ẽ_h = v_h @ head_projection[h] (value bias and LayerScale
    included, output bias excluded). Per head, their norms and dot products with E come from the
    Gram matrices P_h P_hᵀ and E P_hᵀ, so no [B, H, N, C] tensor is built.
    """
    if not (use_length or use_necc):
        return reference.new_ones(reference.shape[0], 1, reference.shape[1])
    projection = block.head_projection  # [H, D, C] (tokentm has refused a model without one)
    reference_norm = reference.norm(dim=-1)[:, None]  # [B, 1, N]
    if per_head:
        gram = projection @ projection.transpose(1, 2)  # [H, D, D]
        transformed_norm = ((block.v @ gram) * block.v).sum(-1).clamp_min(0).sqrt()
        dot = (block.v * torch.einsum("bnc,hdc->bhnd", reference, projection)).sum(-1)
    else:
        transformed = torch.einsum("bhnd,hdc->bnc", block.v, projection)  # Σ_h Ẽ_h
        transformed_norm = transformed.norm(dim=-1)[:, None]
        dot = (transformed * reference).sum(-1)[:, None]
    return transformation_weights(reference_norm, transformed_norm, dot, use_length, use_necc)


def attention_update(block: BlockRecord, weights: Tensor):
    """E_h[(∇_A p(c))⁺ ⊙ (A · W)] of U = I + E_h[...] (Eq. 14-15); W scales the columns (input tokens): a
    product factor [B, N, N] (windowed attention: per window, see :meth:`BlockRecord.mixing`)."""
    return block.mixing((block.grads["attn"].clamp(min=0) * block.attn * block.per_key(weights)).mean(1))


@register_method(modalities=("image", "text"))
def tokentm(adapter: ModelAdapter, inputs: Tensor, target=None, *, use_length: bool = True,
            use_necc: bool = True, aggregate: bool = True, end_layer: int | None = None,
            reference: Literal["residual", "normalised"] = "residual", per_head: bool = True,
            score: Literal["probability", "logit"] = "probability", registers: Registers | None = None) -> Tensor:
    """TokenTM: attention and token transformation effects aggregated over every sublayer.

    Wu, Duan, Kang, Tang & Yan, "Token Transformation Matters: Towards Faithful Post-hoc Explanation
    for Vision Transformer", CVPR 2024. W = diag(L(Ẽ_j)/L(E_j) · NECC(j)) (Eq. 11-13, L = L2 norm,
    NECC Eq. 12 = softmax over the tokens of cos(E_j, Ẽ_j)); MHSA update U = I + E_h[(∇_A p(c))⁺ ⊙ (A·W)]
    (Eq. 14-15); FFN update U = I + W (Eq. 16-17); C⁰ = diag(L(E⁰)) (Eq. 18); Cˡ = Uˡ Cˡ⁻¹ over the
    MHSA and the FFN of every block in order (Eq. 19-20); the class token's row over the patches (the
    readout's row for pooled readouts, docs/decisions/readouts.md; hierarchical models,
    docs/decisions/families.md).

    Where the paper is silent (E is the residual stream a sublayer adds to, Ẽ per head, p(c) the
    softmax probability, ...) the decisions and their reasons are in docs/decisions/tokentm.md.

    Options (Tables 6 and 7):
        use_length: the length ratio in W and C⁰ = diag(L(E⁰)); off, C⁰ = I ("+ AF" row).
        use_necc: the NECC factor in W ("+ AF + L" row when off).
        aggregate: the aggregation framework; off, the map is the first MHSA's update map alone, i.e.
            Eq. (8) applied to the input tokens with the default switches off ("Baseline" row).
        end_layer: the highest block aggregated (0-based, negative counts from the end): blocks
            0 … end_layer (Table 7's "n layers" is ``end_layer=n-1``); None = all.
        reference: ``"residual"`` (the stream the sublayer adds to) | ``"normalised"`` (the LayerNorm
            output it transforms): the tensor E.
        per_head: per-head Ẽ_h = v_h W^H_h, else one Ẽ = Σ_h Ẽ_h for all heads.
        score: ``"probability"`` | ``"logit"``, what ∇_A differentiates.
        registers: register neurons, (block, unit) pairs (``find_register_neurons``): the map is read with
            test-time registers (Jiang et al. 2025, docs/decisions/test-time-registers.md); None: the model as is.
    """
    num_blocks = adapter.num_blocks
    if end_layer is not None and not aggregate:
        raise ValueError("end_layer selects the aggregated blocks, so it needs aggregate=True")
    last = num_blocks - 1 if end_layer is None else block_index("end_layer", end_layer, num_blocks)
    chosen = range(last + 1) if aggregate else (0,)
    if use_length or use_necc:
        adapter.require_head_shares("tokentm", chosen)
    normalised = reference == "normalised"
    if aggregate and any(adapter.blocks[i].layout == "parallel" for i in chosen):
        raise UnsupportedModelError(
            "tokentm composes each block's attention update with the MLP update that follows it (Eq. 15-17), but "
            "this model's parallel blocks add the attention and the MLP to the same input; use aggregate=False")
    # E of both sublayers: the LayerNorm outputs or the residual streams; block 0's residual gives C⁰
    references = ("attn_input", "mlp_input") if normalised else ("residual", "mlp_residual")
    fields = dict.fromkeys(references + ("attn", "mlp_branch") + (("v",) if use_length or use_necc else ()), chosen)
    fields["residual"] = chosen if "residual" in references else (0,)
    switches = dict(per_head=per_head, use_length=use_length, use_necc=use_necc)

    def update(record: Recording, block: BlockRecord):  # the MHSA update, as the backward reaches the block
        return attention_update(block, attention_weights(block, block.attn_input if normalised else block.residual,
                                                         **switches))

    with test_time_registers(adapter, registers):
        record = adapter.record(inputs, target, fields=fields, grads={"attn": chosen}, score=score, reduce=update)
    if not aggregate:
        return readout_map(record.geometry, [record.blocks[0].reduced])

    updates = []  # per sublayer, first to last: MHSA U = I + cam (Eq. 15), FFN U = I + diag(W) (Eq. 17)
    for block in record.blocks[:len(chosen)]:
        mlp_reference = block.mlp_input if normalised else block.mlp_residual
        mlp_weights = transformation_weights(
            mlp_reference.norm(dim=-1), block.mlp_branch.norm(dim=-1), (block.mlp_branch * mlp_reference).sum(-1),
            use_length, use_necc)
        updates += [block.reduced, mlp_weights]
    embeddings = record.embeddings  # C⁰ = diag(L(E⁰)) (Eq. 18), on the right of the product
    initial = embeddings.norm(dim=-1) if use_length else torch.ones_like(embeddings[..., 0])
    return readout_map(record.geometry, [initial - 1, *updates])
