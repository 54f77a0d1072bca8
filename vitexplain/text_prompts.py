"""Text prompts: where in an image a two-tower model (CLIP, SigLIP) sees each text.

``explain(model, images, method, target="a dog")`` already explains one text (or one per image); this
module explains every text of a list on every image in one batched call, and names the helper that
turns texts into targets (:func:`text_embeddings`). See docs/decisions/text.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .api import explain
from .instrumentation.two_tower import text_embeddings


def explain_texts(model: nn.Module, images: Tensor, texts: str | Sequence[str], method: str, *,
                  tokenizer: Any = None, **options) -> Tensor:
    """Explain each image's similarity to each text: maps [B, T, ...], ``[:, t]`` the maps of ``texts[t]``.

    Args:
        model: transformers' ``CLIPModel`` or ``SiglipModel``.
        images: preprocessed images [B, 3, H, W].
        texts: T texts, embedded in one batch by the model's text tower (:func:`text_embeddings`).
        method: a method that explains any score (``available_methods`` less the LRP family).
        tokenizer: the model's tokenizer; None reads the one saved beside the model (``save_pretrained`` folder).
        **options: the method's options.

    The score of (image b, text t) is the cosine similarity of the image embedding to text t's embedding.
    The B·T pairs run as one batch of :func:`~vitexplain.explain` (each image repeated T times), so memory
    grows with B·T; a randomised method draws the same numbers for every pair, so a map does not depend on
    the other texts.
    """
    directions = text_embeddings(model, texts, tokenizer)  # [T, D]
    count = directions.shape[0]
    if not isinstance(images, Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a tensor [B, 3, H, W], got {getattr(images, 'shape', type(images).__name__)}")
    pairs = images.repeat_interleave(count, dim=0)  # image b's rows b·T ... b·T + T - 1
    maps = explain(model, pairs, method, target=directions.repeat(images.shape[0], 1), **options)
    return maps.reshape(images.shape[0], count, *maps.shape[1:])


__all__ = ["explain_texts", "text_embeddings"]
