"""GradToken: class-aware query gradients against the keys (Cheng et al., Neural Networks 2024)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter
from ..registry import register_method

AGGREGATIONS = ("average", "rollout")
PROPAGATIONS = ("matmul", "elementwise", "none")
HEAD_INTEGRATIONS = ("relu_mean", "mean")
SCORES = ("logit", "probability")


def aggregate_attention(blocks: list[BlockRecord], aggregation: str, top_down: bool) -> Tensor:
    """The lower blocks' attention combined into one [B, N, N] matrix (Sec. 3.3).

    ``average``: Ā = 1/B · 1/H Σ_b Σ_h A_h^(b) (Eq. 14), B counting the averaged blocks plus the last one.
    ``rollout``: L^(b) = I + 1/H Σ_h A_h^(b) (Eq. 9), multiplied ``top_down`` L^(B-1)⋯L^(1) (Eq. 10) or
    bottom-up L^(1)⋯L^(B-1) (Eq. 12 as printed).
    """
    fused = [block.attn.mean(1) for block in blocks]
    if aggregation == "average":
        return torch.stack(fused).sum(0) / (len(blocks) + 1)
    eye = torch.eye(fused[0].shape[-1], dtype=fused[0].dtype, device=fused[0].device)
    product = None
    for attn in fused:  # block order, lowest first
        layer = eye + attn
        if product is None:
            product = layer
        elif top_down:
            product = torch.bmm(layer, product)
        else:
            product = torch.bmm(product, layer)
    return product


@register_method("gradtoken", modalities=("image", "text"))
def gradtoken(adapter: ModelAdapter, images: Tensor, target=None, *, aggregation: str = "average",
              propagation: str = "matmul", heads: str = "relu_mean", depth: int = 0,
              score: str = "logit", transpose: bool = True) -> Tensor:
    """GradToken: the target's gradient at the class token's query, matched against the keys.

    Cheng, Liang, Lu & Cheung, "GradToken: Decoupling tokens with class-aware gradient for visual
    explanation of Transformer network", Neural Networks 2024, Sec. 3 and Algorithm 1:
    G_Q,h = ∂y_c/∂Q^(B)[h, cls] (Eq. 6-7; Q before the 1/√D scale, so the gradient carries it);
    M_h = K_h G_Q,h over the spatial tokens (Eq. 8); propagation through the lower blocks'
    attention (Sec. 3.3, default average & matrix multiplication, Eq. 14 and 16); head integration
    (Eq. 18 by default). Spatial tokens are those after the prefix tokens (class, distillation and
    register tokens); the class row is the class token's.

    Options:
        aggregation: ``"average"`` (Eq. 14) | ``"rollout"`` (Eq. 9-10 / 12) of the lower blocks.
        propagation: ``"matmul"``: M̂_h = Ā[spatial, spatial]ᵀ M_h (Eq. 13 / 16, see ``transpose``); ``"elementwise"``:
            M̂_h = Ā[cls, spatial] ⊙ M_h (Eq. 11 / 15); ``"none"``: the last block's M_h alone
            (GradToken-0 of Table 3).
        heads: ``"relu_mean"``: mean_h ReLU(M̂_h) (Eq. 18) | ``"mean"``: mean_h M̂_h (Eq. 17).
        depth: lowest block (0-based, negative counts from the end) the relevance is propagated
            to, through the attention of blocks depth … B-2 (Fig. 11); the last block's index means
            no propagation.
        score: ``"logit"`` | ``"probability"``, the y_c that is differentiated.
        transpose: for matrix propagation, True (default): each token hands its relevance to the
            tokens it attends to, M̂ = Āᵀ M, top down — with rollout the transpose of Eq. 10's
            product, L^(1)ᵀ⋯L^(B-1)ᵀ, which is the reversed order Eq. 12 prints; False: Ā M exactly as
            Eq. 13 / 16 print it, so a token gets the relevance of the tokens *it* attends to.

    Decisions where the paper is silent (docs/decisions/gradtoken.md): y_c is the logit, "the score
    of the target category in the output layer" (Sec. 3.2), as in Chefer et al.'s code that the
    evaluation follows. Matrix propagation reads Eq. 13 / 16 with the attention transposed
    (``transpose``): that is the direction in which relevance flows everywhere else in the paper (the
    class row of Eq. 10's rollout, Chefer et al.'s relevance) and the one Eq. 12's reversed product
    order implies; printed literally, the maps of the shipped digits models point away from the digit
    (mAP 37 vs 99.6 transposed). When ``depth`` > 0, the 1/B of Eq. (14) counts the blocks the relevance
    passes (depth … B-1), which is B for the paper's full depth. The rollout of Eq. (9) is not
    row-normalised, as written.
    """
    cls = adapter.require_class_token("gradtoken")
    if not isinstance(transpose, bool):
        raise TypeError(f"transpose must be a bool, got {transpose!r}")
    for name, value, choices in (("aggregation", aggregation, AGGREGATIONS), ("propagation", propagation, PROPAGATIONS),
                                 ("heads", heads, HEAD_INTEGRATIONS), ("score", score, SCORES)):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}; choose one of {choices}")
    num_blocks = adapter.num_blocks
    if isinstance(depth, bool) or not isinstance(depth, int) or not -num_blocks <= depth < num_blocks:
        raise ValueError(f"depth must index one of the model's {num_blocks} blocks, got {depth!r}")

    record = adapter.record(images, target, grads=("q",), score=score)
    last = record.blocks[-1]
    prefix = record.num_prefix_tokens
    query_grad = last.grads["q"][:, :, cls]  # [B, H, D]
    relevance = torch.einsum("bhsd,bhd->bhs", last.k[:, :, prefix:], query_grad)  # M_h, Eq. (8)

    lower = record.blocks[depth % num_blocks:-1]
    if propagation != "none" and lower:
        aggregated = aggregate_attention(lower, aggregation, top_down=propagation == "elementwise" or transpose)
        if propagation == "elementwise":
            relevance = aggregated[:, None, cls, prefix:] * relevance
        else:
            spatial = aggregated[:, prefix:, prefix:]
            relevance = torch.einsum("bst,bht->bhs", spatial.transpose(1, 2) if transpose else spatial, relevance)
    if heads == "relu_mean":
        relevance = relevance.clamp(min=0)
    return record.patch_grid(relevance.mean(1))
