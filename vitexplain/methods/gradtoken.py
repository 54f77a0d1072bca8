"""GradToken: class-aware query gradients against the keys (Cheng et al., Neural Networks 2024)."""
from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter, UnsupportedModelError
from ..instrumentation.windows import to_tokens, tokens_in
from ..options import block_index
from ..registry import register_method
from ._products import push_columns, push_rows


def propagate(relevance: Tensor, readout: Tensor, fused: list, aggregation: str, propagation: str,
              transpose: bool, prefix: int, stages=()) -> Tensor:
    """M̂_h [B, H, patches] from M_h through the lower blocks' head-averaged attention ``fused`` (Sec. 3.3).

    The aggregated matrix Ā is never formed: ``average`` is Ā = 1/B Σ_b Ā_b (Eq. 14, B counting the
    lower blocks and the last one), ``rollout`` the product of L^(b) = I + Ā_b (Eq. 9) — top-down
    L^(B-1)⋯L^(1) for element-wise propagation (Eq. 10) and for the transposed reading, bottom-up
    L^(1)⋯L^(B-1) for the printed matrix propagation (Eq. 12) — applied to vectors block by block
    (across a hierarchical model's patch merges, ``stages``). Element-wise (Eq. 11 / 15): Ā's readout
    row (the class token's) times M_h; matrix (Eq. 13 / 16): Ā[spatial, spatial] M_h, or Āᵀ M_h with
    ``transpose``. The result lies on the lowest block's tokens.
    """
    if propagation == "elementwise":
        rows = readout[:, None].to(fused[0].dtype)
        aggregated = (sum(push_rows(rows, [a], residual=False) for a in fused) / (len(fused) + 1)
                      if aggregation == "average" else push_rows(rows, fused, stages=stages))
        return aggregated[:, :, prefix:] * to_tokens(relevance, aggregated.shape[-1] - prefix, stages)
    padded = F.pad(relevance, (prefix, 0))  # M_h on the whole sequence, zero at the prefix: Ā[s, s] M = (Ā (0; M))_s
    if aggregation == "average":
        mixed = sum(push_rows(padded, [a], residual=False) if transpose
                    else push_columns(padded.transpose(1, 2), [a], residual=False).transpose(1, 2)
                    for a in fused) / (len(fused) + 1)
    elif transpose:
        mixed = push_rows(padded, fused, stages=stages)
    else:
        mixed = push_columns(padded.transpose(1, 2), fused, stages=stages).transpose(1, 2)
    return mixed[:, :, prefix:]


@register_method(modalities=("image", "text"),
                 precision_caveats={"bfloat16 weights": 0.974})
def gradtoken(adapter: ModelAdapter, inputs: Tensor, target=None, *,
              aggregation: Literal["average", "rollout"] = "average",
              propagation: Literal["matmul", "elementwise", "none"] = "matmul",
              heads: Literal["relu_mean", "mean"] = "relu_mean", start_layer: int = 0,
              score: Literal["logit", "probability"] = "logit", transpose: bool = False) -> Tensor:
    """GradToken: the target's gradient at the class token's query, matched against the keys.

    Cheng, Liang, Lu & Cheung, "GradToken: Decoupling tokens with class-aware gradient for visual
    explanation of Transformer network", Neural Networks 2024, Sec. 3 and Algorithm 1:
    G_Q,h = ∂y_c/∂Q^(B)[h, cls] (Eq. 6-7; Q before the 1/√D scale, so the gradient carries it);
    M_h = K_h G_Q,h over the spatial tokens (Eq. 8); propagation through the lower blocks'
    attention (Sec. 3.3, default average & matrix multiplication, Eq. 14 and 16); head integration
    (Eq. 18 by default). Spatial tokens are those after the prefix tokens (class, distillation and
    register tokens); the class row is the class token's. With a pooled readout the class-aware
    gradient is summed over the queries the output reads and the class row is the readout's row
    (docs/decisions/readouts.md); with windowed attention each key meets the queries of its window
    (hierarchical models: docs/decisions/families.md).

    Options:
        aggregation: ``"average"`` (Eq. 14) | ``"rollout"`` (Eq. 9-10 / 12) of the lower blocks.
        propagation: ``"matmul"``: M̂_h = Ā[spatial, spatial] M_h (Eq. 13 / 16, see ``transpose``); ``"elementwise"``:
            M̂_h = Ā[cls, spatial] ⊙ M_h (Eq. 11 / 15); ``"none"``: the last block's M_h alone
            (GradToken-0 of Table 3).
        heads: ``"relu_mean"``: mean_h ReLU(M̂_h) (Eq. 18) | ``"mean"``: mean_h M̂_h (Eq. 17).
        start_layer: lowest block (0-based, negative counts from the end) the relevance is propagated
            to, through the attention of blocks start_layer … B-2 (Fig. 11); the last block's index means
            no propagation.
        score: ``"logit"`` | ``"probability"``, the y_c that is differentiated.
        transpose: matrix propagation only. False (default): as printed in Eq. 13 / 16 and Algorithm 1
            (step 6), M̂ = Ā M with the rows of Ā as queries, so a token receives the similarity-weighted
            relevance of the tokens it attends to (the paper's "weighted reorganization"); rollout is
            multiplied bottom-up, L^(1)⋯L^(B-1), as Eq. 12 prints. True: our variant, M̂ = Āᵀ M (rollout:
            the transpose of Eq. 10's top-down product), each token handing its relevance to the tokens
            it attends to, as relevance flows in rollout and in Chefer et al.'s methods.

    Decisions where the paper is silent (y_c is the logit; the 1/B of Eq. 14 with ``start_layer`` > 0;
    the rollout of Eq. 9 not row-normalised) and the evidence on both readings of Eq. 13 / 16 are in
    docs/decisions/gradtoken.md.
    """
    num_blocks = adapter.num_blocks
    lowest = block_index("start_layer", start_layer, num_blocks)
    if propagation == "none":  # the last block alone
        lowest = num_blocks - 1
    # the lower blocks' attention, the last block's keys and its query gradient (its attention stays fused)
    record = adapter.record(inputs, target, fields={"attn": range(lowest, num_blocks - 1), "k": (-1,)},
                            grads={"q": (-1,)}, score=score)
    last, geometry = record.blocks[-1], record.geometry
    prefix = geometry.num_prefix_tokens
    reads = (geometry.readout.weights > 0).to(last.grads["q"].dtype)  # the positions the output reads
    query_grad = last.grads["q"] * reads[:, None, :, None]  # Eq. (6)-(7): the read queries' gradients
    # M_h, Eq. (8): each key against the summed gradients of the read queries that attend to it
    relevance = (last.k * last.attended_by(query_grad)).sum(-1)[:, :, prefix:]
    fused = [block.mixing(block.attn.mean(1)) for block in record.blocks[lowest:-1]]
    if propagation != "none" and fused:
        if aggregation == "average" and len({tokens_in(a) for a in fused} | {last.k.shape[2]}) > 1:
            raise UnsupportedModelError(
                "gradtoken's average aggregation (Eq. 14) averages the attention matrices of blocks start_layer … B-1, "
                "but here they belong to stages with different tokens (patch merging between them), so there is "
                "no average; use aggregation='rollout' (a product, which crosses the merges), propagation='none', "
                "or a start_layer within the last stage")
        relevance = propagate(relevance, geometry.readout.weights, fused, aggregation, propagation, transpose, prefix,
                              geometry.stages)
    if heads == "relu_mean":
        relevance = relevance.clamp(min=0)
    return geometry.patch_grid(relevance.mean(1))
