"""CLIP Surgery (Li, Wang, Duan, Zhang & Li, Pattern Recognition 2025)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter, UnsupportedModelError
from ..instrumentation.targets import resolve_target
from ..instrumentation.two_tower import text_embeddings
from ..maps import min_max
from ..options import Score, block_index
from ..registry import register_method
from ._clip import geometry_of, read_each, taking

#: the blocks the authors' architecture surgery covers: the last six (their ``for i in range(1, 7)``)
SURGERY_BLOCKS = 6
#: a target direction whose cosine to a prompt reaches this is that prompt
SAME = 1 - 1e-6


@register_method(cost=1,
                 zero_map_reason="the similarity was the same on every patch (min-max makes a constant map 0)")
def clip_surgery(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int | None = None,
                 prompts: Tensor | Sequence[str] | None = None, redundant: Tensor | str | None = None,
                 normalise: bool = True, score: Score = "logit") -> Tensor:
    """CLIP Surgery: each patch's similarity to the target along a v-v attention path, less what all prompts share.

    Li, Wang, Duan, Zhang & Li, "A Closer Look at the Explainability of Contrastive Language-Image Pre-training",
    Pattern Recognition 162 (2025) 111409 (arXiv 2304.05653; code: xmed-lab/CLIP_Surgery).

    Architecture surgery: from block s = ``start_layer`` on, a second path runs beside the model's own,
    starting from block s's input x_s and adding, in each block l, the attention branch with q and k replaced by v
    (v-v self-attention, each head softmax(v vᵀ / √D) v, then the block's output projection), without the
    feed-forward; each block's v-v attention reads the original path's tokens. The model's own path, its output
    f_I untouched, is the image embedding:

        y = x_s + Σ_{l ≥ s} proj_l( softmax(v_l v_lᵀ / √D) v_l ),      f_i = head(y_i)  (each patch token
        read by the model's head as CLIP reads its class token: ``ln_post(y_i) @ proj``)

    Each patch's similarity to a direction target t is s_i = cos(f_i, t) (a class target: its score of f_i).
    Feature surgery, with prompts p_1 … p_T (the target among them; directions, normalised):

        w_t = T · softmax_t(2 cos(f_I, p_t)),   F_i,t = w_t (f̂_i ⊙ p_t),
        s_i = Σ_c ( F_i,target − mean_t F_i,t )_c                           (the redundant features removed)

    or, given one redundant direction r (their single-text path, e.g. the embedding of ""), s_i = f̂_i · (t − r).
    The map is s over the patches, min-max scaled (their ``get_similarity_map``, on the patch grid). Without
    prompts or a redundant direction only the architecture surgery applies. Decisions (other readouts than a class
    token, the prompt set of one target) and the measured agreement with the authors' code:
    docs/decisions/clip-methods.md.

    Options:
        start_layer: the first block of the v-v path (0-based, negative counts from the end); None: the last six
            blocks, as the authors, or every block of a model with fewer.
        prompts: the directions of all prompts the feature surgery compares the target with, [T, D], or texts
            (embedded by a two-tower model's text tower, the tokenizer saved beside it); the target's direction is
            added where it is none of them. At least two in all; directions targets only.
        redundant: one direction [D] (or a text) whose similarity is subtracted instead (their single-text path).
        normalise: min-max each map to [0, 1] (the authors'); False returns s.
        score: ``"logit"`` | ``"probability"`` | ``"log_probability"`` for class targets (an embedding
            direction is scored by its cosine similarity).
    """
    if prompts is not None and redundant is not None:
        raise ValueError("clip_surgery takes prompts= (the feature surgery over all prompts) or redundant= (one "
                         "direction subtracted), not both")
    count = adapter.num_blocks
    first = max(count - SURGERY_BLOCKS, 0) if start_layer is None else block_index("start_layer", start_layer, count)
    blocks = range(first, count)
    _require_surgery(adapter, blocks)
    wanted = {index: {"v", "mixed", "attn_branch"} | ({"residual"} if index == first else set()) for index in blocks}
    with taking(adapter, images, target, wanted) as (outputs, sink):
        taken = sink.taken
    path = taken[first]["residual"]
    for index in blocks:  # the v-v branch: the model's branch with A·v of the v-v attention instead of its own
        v, mixed = taken[index]["v"], taken[index]["mixed"]
        voted = torch.softmax(v @ v.transpose(-2, -1) * v.shape[-1] ** -0.5, dim=-1) @ v
        projection = adapter.blocks[index].head_projection()  # [H, D, C], LayerScale folded in
        path = path + taken[index]["attn_branch"] + torch.einsum("bhnd,hdc->bnc", voted - mixed, projection)
    features = read_each(adapter, path[:, adapter.num_prefix_tokens:])  # f_i [B, P, D]
    resolved = resolve_target(target, outputs)
    batch, patches = features.shape[:2]
    if prompts is None and redundant is None:
        rows = torch.arange(batch, device=features.device).repeat_interleave(patches)
        similarity = resolved.select(rows).score(features.flatten(0, 1), score).reshape(batch, patches)
    else:
        if resolved.direction is None:
            raise ValueError("clip_surgery's feature surgery compares embedding directions (prompts=, redundant=): "
                             "give target= a direction or a text, or leave prompts and redundant out")
        similarity = _feature_surgery(adapter, outputs, features, resolved.direction, prompts, redundant)
    maps = geometry_of(adapter, images, sink).patch_grid(similarity)
    return min_max(maps, constant=0.0) if normalise else maps


def _require_surgery(adapter: ModelAdapter, blocks: range) -> None:
    """Refuses, in one line, a model whose blocks ``blocks`` the v-v path cannot run beside."""
    for index in blocks:
        parts = adapter.blocks[index]
        if parts.windows is not None:
            raise UnsupportedModelError("clip_surgery runs a v-v attention path beside global self-attention blocks, "
                                        "as CLIP's, but this model attends within windows (Swin), and its patch "
                                        "merging would cut the path between stages")
        reason = parts.heads_reason()
        if reason is not None:
            raise UnsupportedModelError(f"clip_surgery puts the v-v attention through each block's own output "
                                        f"projection, but in block {index} of this {adapter.model_name} {reason}")


def _directions(adapter: ModelAdapter, given: Tensor | str | Sequence[str], width: int, option: str) -> Tensor:
    """``given`` as normalised directions [T, D] (texts through the two-tower model's text tower)."""
    found = given if isinstance(given, Tensor) else text_embeddings(adapter.model, given)
    found = found.to(device=adapter.device, dtype=torch.float32)
    found = found[None] if found.ndim == 1 else found
    if found.ndim != 2 or found.shape[-1] != width:
        raise ValueError(f"{option} must be directions [T, {width}] (the output's width), got {tuple(found.shape)}")
    return F.normalize(found, dim=-1)


def _feature_surgery(adapter: ModelAdapter, outputs: Tensor, features: Tensor, direction: Tensor,
                     prompts: Tensor | Sequence[str] | None, redundant: Tensor | str | None) -> Tensor:
    """s_i [B, P]: the feature surgery of the patch features ``features`` [B, P, D] for the target directions
    [B, D], over ``prompts`` (plus the target where it is none of them), or less one ``redundant`` direction."""
    tokens, target = F.normalize(features, dim=-1), F.normalize(direction.to(features.dtype), dim=-1)
    if redundant is not None:
        return torch.einsum("bpd,bd->bp", tokens, target - _directions(adapter, redundant, tokens.shape[-1],
                                                                         "redundant")[0])
    known = _directions(adapter, prompts, tokens.shape[-1], "prompts")  # [T, D]
    match = target @ known.t()  # [B, T]
    among = match.amax(-1) >= SAME
    if known.shape[0] + (0 if among.any() else 1) < 2:  # the smallest set of one image
        raise ValueError("clip_surgery's feature surgery removes what all prompts share, so it needs at least two "
                         "prompts, the target among them; give more prompts, or redundant=, or neither (the "
                         "architecture surgery alone)")
    every = torch.cat([known.expand(target.shape[0], -1, -1), target[:, None]], 1)  # [B, T + 1, D]
    valid = torch.cat([torch.ones_like(match, dtype=torch.bool), ~among[:, None]], 1)
    chosen = torch.where(among, match.argmax(-1), known.shape[0])  # the target's place in ``every``
    image = F.normalize(outputs.to(features.dtype), dim=-1)
    logits = (2 * torch.einsum("bd,btd->bt", image, every)).masked_fill(~valid, float("-inf"))
    weights = logits.softmax(-1) * valid.sum(-1, keepdim=True)  # w_t = prob_t / mean_t prob
    weighted = torch.einsum("bpd,btd->bpt", tokens, every) * (weights * valid)[:, None]  # Σ_c F_i,t
    mine = weighted.gather(2, chosen[:, None, None].expand(-1, weighted.shape[1], 1))[..., 0]
    return mine - weighted.sum(-1) / valid.sum(-1, keepdim=True)
