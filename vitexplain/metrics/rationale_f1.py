"""Rationale token-F1 on ERASER Movie Reviews (GradToken, Cheng et al., Neural Networks 2024, Fig. 6).

GradToken Sec. 4.1 and 4.4 follow ERASER (DeYoung et al., ACL 2020) and Chefer et al. (CVPR 2021):
the top-k tokens of an explanation, k = 10, 20, ..., 80, are the predicted rationale of a test
review, scored by token-F1 against the human rationales. Where the paper is silent, this follows
Chefer et al.'s code (``BERT_rationale_benchmark`` of hila-chefer/Transformer-Explainability) and
ERASER's ``metrics.py`` that it scores with:

* relevance is clamped at 0 (``cam.clamp(min=0)``) and each review word (ERASER's tokens are the
  whitespace-separated words of the document) gets the largest score of its word pieces
  (``scores_per_word_from_scores_per_token``); special tokens and padding belong to no word;
* the candidates are the words the model read (the truncated document); the top-k of them are
  predicted (fewer when the window has fewer than k words);
* precision = hits / predicted words, recall = hits / rationale words of the *whole* review (the
  ground truth is not truncated), F1 = 2PR / (P + R), 0 without hits; the reported token-F1 is the
  mean over reviews of their F1 (ERASER's ``token_prf`` ``instance_macro`` F1).

Decisions: ties are broken by word position (earlier first; Chefer et al.'s ``torch.topk`` leaves
them unspecified); k defaults to GradToken's 10 … 80 (Chefer et al.'s code also writes 5, 15, ...).

Text in :class:`~vitexplain.metrics.EvalBatch` (as :class:`vitexplain.datasets.eraser.MovieReviews`
serves it): ``maps`` [B, T] per-token relevance (what :func:`vitexplain.explain` returns for
text), and in its ``truth``: ``word_index`` [B, T] long, the 1-based number of the review word each token
belongs to (0: special token or padding), ``rationale_spans`` per review the rationale word spans [k, 2] as
[start, end).

Per review: ``f1``, ``precision``, ``recall`` [B, K] (one column per k, plotted by the bench) and
``f1@k`` [B]. Reported: ``f1@k`` (mean over reviews) and ``mean_f1`` (their mean over k).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..options import PositiveInt
from .base import EvalBatch, register_metric

#: GradToken Fig. 6: k in [10, 80] with steps of 10 tokens.
DEFAULT_KS = (10, 20, 30, 40, 50, 60, 70, 80)


def word_scores(maps: Tensor, word_numbers: Tensor) -> Tensor:
    """Each word's largest clamped token relevance [B, W] (W = the largest word number); -inf for a
    word with no token (past the truncation)."""
    relevance = maps.double().clamp(min=0)
    words = int(word_numbers.max()) if word_numbers.numel() else 0
    scores = torch.full((maps.shape[0], words + 1), float("-inf"), dtype=relevance.dtype, device=maps.device)
    return scores.scatter_reduce_(1, word_numbers, relevance, "amax")[:, 1:]


def span_coverage(spans: list[Tensor], length: int, device: torch.device) -> Tensor:
    """Union of each review's word spans [start, end) as a mask over word positions [B, length]."""
    sizes = [s.reshape(-1, 2).shape[0] for s in spans]
    if sum(sizes) == 0:
        return torch.zeros(len(spans), length, dtype=torch.bool, device=device)
    bounds = torch.cat([s.reshape(-1, 2) for s in spans]).to(device=device, dtype=torch.long)
    owner = torch.repeat_interleave(torch.arange(len(spans), device=device), torch.tensor(sizes, device=device))
    positions = torch.arange(length, device=device)
    inside = ((positions >= bounds[:, :1]) & (positions < bounds[:, 1:])).float()
    return torch.zeros(len(spans), length, device=device).index_add_(0, owner, inside) > 0


def rationale_f1(maps: Tensor, word_numbers: Tensor, spans: list[Tensor],
                 ks: Sequence[int] = DEFAULT_KS) -> dict[str, Tensor]:
    """Per-review precision, recall and F1 of the top-k words [B, K] (see the module docstring).

    Args:
        maps: per-token relevance [B, T].
        word_numbers: per token, the 1-based number of its word, 0 for none [B, T].
        spans: per review, its rationale word spans [k, 2] as [start, end) over the whole review.
        ks: the numbers of top words, each >= 1.
    """
    if maps.ndim != 2 or word_numbers.shape != maps.shape:
        raise ValueError(f"maps and word numbers must both be [B, T], got {tuple(maps.shape)} and "
                         f"{tuple(word_numbers.shape)}")
    if word_numbers.dtype.is_floating_point or (word_numbers < 0).any():
        raise ValueError("word numbers must be non-negative integers (0: no word)")
    if len(spans) != maps.shape[0]:
        raise ValueError(f"got rationale spans of {len(spans)} reviews for {maps.shape[0]} maps")
    if not torch.isfinite(maps).all():
        raise ValueError("explanation maps contain NaN or infinite values")
    scores = word_scores(maps, word_numbers.long())
    batch, words = scores.shape
    longest = max([words, *(int(s.max()) for s in spans if s.numel())])
    truth = span_coverage(spans, longest, maps.device)
    order = scores.sort(dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(words, device=maps.device).expand(batch, words))
    top = torch.tensor(list(ks), device=maps.device)
    chosen = (rank[:, None, :] < top[None, :, None]) & (scores > float("-inf"))[:, None, :]  # [B, K, W]
    hits = (chosen & truth[:, None, :words]).sum(-1).double()
    precision = hits / chosen.sum(-1).clamp(min=1)
    recall = hits / truth.sum(1, keepdim=True).clamp(min=1)
    f1 = torch.where(hits > 0, 2 * precision * recall / (precision + recall).clamp(min=1e-12), torch.zeros_like(hits))
    return {"f1": f1, "precision": precision, "recall": recall}


def reduce_rationale_f1(values: dict[str, Tensor]) -> dict[str, float]:
    """Token-F1 per k (mean over reviews) and its mean over k."""
    reported = {key: value.double().mean().item() for key, value in values.items() if value.ndim == 1}
    return {**reported, "mean_f1": values["f1"].double().mean().item()}


@register_metric(
    "rationale_f1",
    reduce=reduce_rationale_f1,
    requires=("word_index", "rationale_spans"),
    higher_is_better={**{f"f1@{k}": True for k in DEFAULT_KS}, "mean_f1": True},
    group="localisation",
)
def _compute(batch: EvalBatch, *, ks: Sequence[PositiveInt] = DEFAULT_KS) -> dict[str, Tensor]:
    values = rationale_f1(batch.maps, batch.truth["word_index"], batch.truth["rationale_spans"], ks)
    return {**{f"f1@{k}": values["f1"][:, i] for i, k in enumerate(ks)}, **values}
