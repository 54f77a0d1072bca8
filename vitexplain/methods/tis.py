"""Transformer Input Sampling (Englebert et al., ICCVW 2023)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter, Recording
from ..instrumentation.windows import to_tokens
from ..options import PositiveInt, Share
from ..registry import register_method
from ._kmeans import kmeans
from ._pixel import chunks


def activation_columns(record: Recording) -> Tensor:
    """The columns of A (Eq. 1) as points: every block's output on the patch tokens [B, L·D, N_t].

    A = [block_1 output | ... | block_L output] over the patch tokens, [N_t, L·D]; k-means runs on
    its columns, i.e. L·D points of dimension N_t (the authors' code transposes A the same way). A
    hierarchical model's later stages are brought to the first stage's tokens, each merged token's
    features copied to its inputs (docs/decisions/families.md).
    """
    geometry = record.geometry
    outputs = [to_tokens(block.output[:, geometry.num_prefix_tokens:], math.prod(geometry.grid), geometry.stages,
                         dim=1, share=False)
               for block in record.blocks]
    return torch.cat(outputs, dim=-1).transpose(1, 2)


def kept_tokens(record: Recording, n_masks: int, ratios: Sequence[float], seed: int) -> list[Tensor]:
    """Eq. (1)-(2): k-means centroids of A's columns, each binarised to its top tokens.

    Returns, for each ratio, the kept patch indices [B, n_masks, int(ratio·N_t)] (the rows of M
    that are 1 for that ratio's masks).
    """
    centroids = kmeans(activation_columns(record), n_masks, seed=seed)  # [B, n_masks, N_t]
    num_patches = centroids.shape[-1]
    return [centroids.topk(_tokens_kept(ratio, num_patches), dim=-1).indices for ratio in ratios]


def binary_masks(keep: Tensor, num_patches: int) -> Tensor:
    """Kept patch indices [B, M, K] -> binary masks M (Eq. 2) as rows [B, M, N_t]."""
    masks = torch.zeros(*keep.shape[:2], num_patches, device=keep.device)
    return masks.scatter_(2, keep, 1.0)


def coverage_normalised_sum(masks: Tensor, scores: Tensor) -> Tensor:
    """Eq. (5): Σ_j w_j M_.j ⊘ Σ_j M_.j per token [B, N_t]; tokens no mask keeps get 0.

    Args:
        masks: binary masks [B, M, N_t]. scores: their scores w_j [B, M].
    """
    weighted = torch.bmm(scores[:, None, :].to(masks.dtype), masks)[:, 0]
    coverage = masks.sum(1)
    return torch.where(coverage > 0, weighted / coverage.clamp(min=1), torch.zeros_like(weighted))


def pixel_masked_logits(adapter: ModelAdapter, images: Tensor, masks: Tensor, grid: tuple[int, int],
                        batch_size: int) -> Tensor:
    """Ablation of Eq. (4) in input space: logits [B, M, classes] of the full images with the pixels
    of each mask's dropped patches set to 0 (the mean colour in normalised space)."""
    b, m, _ = masks.shape
    flat = masks.reshape(b * m, 1, *grid).to(images.dtype)
    image_of = torch.arange(b, device=images.device).repeat_interleave(m)
    outputs = []
    for pairs in chunks(b * m, batch_size):
        pixel_keep = F.interpolate(flat[pairs], size=images.shape[-2:], mode="nearest")
        outputs.append(adapter.logits(images[image_of[pairs]] * pixel_keep))
    return torch.cat(outputs).reshape(b, m, -1)


def _tokens_kept(ratio: float, num_patches: int) -> int:
    count = int(ratio * num_patches)
    if count < 1:
        raise ValueError(f"ratio {ratio} keeps no token out of {num_patches}; use a larger ratio")
    return count


@register_method(cost=lambda o: o["n_masks"] * (len(o["ratio"]) if isinstance(o["ratio"], (list, tuple)) else 1) + 1,
                 reads="tokens")
def tis(adapter: ModelAdapter, images: Tensor, target=None, *, n_masks: PositiveInt = 1024,
        ratio: Share | Sequence[Share] = 0.5, batch_size: PositiveInt = 128, seed: int = 0,
        score: Literal["probability", "logit"] = "probability", input_space: bool = False) -> Tensor:
    """Transformer Input Sampling: score token subsets chosen by clustering the activations.

    Englebert et al., "Explaining through Transformer Input Sampling", ICCVW 2023, Sec. 3. One
    recorded forward gives every block's output on the patch tokens, A ∈ R^{N_t × L·D}; k-means on
    A's columns gives K ∈ R^{N_t × N_m} (Eq. 1); each centroid keeps its top int(ratio·N_t) tokens
    (Eq. 2); each subset, plus all prefix tokens, goes through the encoder after the position
    embedding (Eq. 3-4) and is scored by the target class; the map is Σ_j w_j M_.j ⊘ Σ_j M_.j
    (Eq. 5). Tokens that no mask keeps get 0.

    As in the authors' code (aenglebert/Transformer_Input_Sampling): the activations are the block
    outputs; k-means is Euclidean, initialised with distinct random columns, up to 100 iterations with
    tolerance 1e-4; several ratios pool their masks into one sum; the score is the softmax
    probability. Unlike it, an empty cluster keeps its previous centroid (theirs becomes zero), and
    the map is returned unnormalised (theirs is rescaled to [0, 1]).

    Options:
        n_masks: N_m, the number of k-means centroids, i.e. masks per ratio (the paper's 1024).
        ratio: share of the patch tokens each mask keeps, or a list of shares whose masks are pooled.
        batch_size: sequences per encoder call; bounds memory whatever ``n_masks`` is.
        seed: seeds the k-means initialisation (own generator; same seed -> same map).
        score: ``probability`` (the softmax, the paper's w_{j,c}, Sec. 3.1) or ``logit`` (the raw class score,
            Sec. 5.1.2: follows the target class more, at the cost of class specificity).
        input_space: the ablation where the dropped patches' pixels are set to 0 in normalised space
            (the mean colour) and the full sequence runs, instead of dropping tokens; the only way on a
            hierarchical model (Swin), whose windows and merges need the whole grid.
    """
    ratios = list(ratio) if isinstance(ratio, (list, tuple)) else [ratio]
    if not input_space:
        adapter.require_token_subsets("tis (input_space=False)")
    record = adapter.record(images, target, fields=("residual", "attn_branch", "mlp_branch"))  # the block outputs
    num_patches = math.prod(record.geometry.grid)
    masks, scores = [], []
    for keep in kept_tokens(record, n_masks, ratios, seed):
        ratio_masks = binary_masks(keep, num_patches)
        if input_space:
            logits = pixel_masked_logits(adapter, images, ratio_masks, record.geometry.grid, batch_size)
        else:
            logits = adapter.logits_on_tokens(images, keep, batch_size=batch_size)
        flat = logits.float().flatten(0, 1)
        rows = torch.arange(logits.shape[0], device=flat.device).repeat_interleave(logits.shape[1])
        masks.append(ratio_masks)
        scores.append(record.target.select(rows).score(flat, score)
                      .reshape(logits.shape[:2]))
    return record.geometry.patch_grid(coverage_normalised_sum(torch.cat(masks, 1), torch.cat(scores, 1)))
