"""Texts as targets: the text embeddings of a two-tower model, which its image embeddings are compared with.

A text's embedding is a direction in the image tower's output space; explaining an image with it as
the target explains the image–text similarity, cosine(image embedding, text embedding) — what CLIP
ranks by, and SigLIP up to its logit scale and bias (docs/decisions/text.md). Served: transformers'
``CLIPModel`` and ``SiglipModel``, whose image towers :mod:`.families.hf_two_tower` describes.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .adapter import evaluation_mode


def is_text(target: object) -> bool:
    """Whether ``target`` is a text or a non-empty sequence of texts."""
    if isinstance(target, str):
        return True
    return (isinstance(target, Sequence) and not isinstance(target, (bytes, Tensor)) and len(target) > 0
            and all(isinstance(text, str) for text in target))


def _text_tower_kind(model: nn.Module) -> str:
    """``"clip"`` or ``"siglip"``; a one-line error for a model without a text tower vitexplain reads."""
    import sys

    if "transformers" in sys.modules:
        from transformers import CLIPModel, SiglipModel

        if isinstance(model, CLIPModel):
            return "clip"
        if isinstance(model, SiglipModel):
            return "siglip"
    raise TypeError(f"a text target needs a two-tower model with its text tower (transformers' CLIPModel or "
                    f"SiglipModel), got a {type(model).__name__}; otherwise give target= the text embedding "
                    "(a float tensor [D] or [B, D])")


def load_tokenizer(model: nn.Module) -> Any:
    """The tokenizer saved beside a model loaded from a local folder (``save_pretrained``); never downloads."""
    folder = getattr(model, "name_or_path", "") or ""
    if not folder or not Path(folder).is_dir():
        raise ValueError(f"this {type(model).__name__} was not loaded from a local folder, so its tokenizer is not "
                         "known: give tokenizer= (e.g. AutoTokenizer.from_pretrained(...) of the same model)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"no tokenizer in {folder} ({' '.join(str(error).split())[:200]}); save it there with "
                         "tokenizer.save_pretrained, or give tokenizer=") from None


def text_embeddings(model: nn.Module, texts: str | Sequence[str], tokenizer: Any = None) -> Tensor:
    """The text tower's embeddings of ``texts``, one row each [T, D] (float32, on the model's device), in one batch.

    Args:
        model: transformers' ``CLIPModel`` or ``SiglipModel`` (left as it was: modes and flags restored).
        texts: a text or a list of texts.
        tokenizer: the model's tokenizer (or processor); None reads the one saved in the folder the model
            was loaded from. CLIP's texts are padded to the longest; SigLIP's to the text tower's full
            length (``padding="max_length"``), as SigLIP was trained and as its processor is documented to be called.

    Returns:
        The embeddings as the model computes them (``get_text_features``: CLIP's projected end-of-text
        token, SigLIP's pooled head output), not normalised: a target's score is their cosine with the
        image embedding, which normalises both.
    """
    kind = _text_tower_kind(model)
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not is_text(texts):
        raise TypeError("texts must be a string or a non-empty list of strings")
    tokenizer = load_tokenizer(model) if tokenizer is None else getattr(tokenizer, "tokenizer", tokenizer)
    length = model.config.text_config.max_position_embeddings
    padding = "max_length" if kind == "siglip" else True
    tokens = tokenizer(texts, padding=padding, truncation=True, max_length=length, return_tensors="pt")
    device = next(model.parameters()).device
    arguments = {"input_ids": tokens["input_ids"].to(device)}
    if kind == "clip" and "attention_mask" in tokens:  # SigLIP's text tower attends to its padding, as trained
        arguments["attention_mask"] = tokens["attention_mask"].to(device)
    with evaluation_mode(model), torch.no_grad():
        found = model.get_text_features(**arguments)
    embeddings = found if isinstance(found, Tensor) else found.pooler_output
    return embeddings.float()


def text_directions(model: nn.Module, target: str | Sequence[str], batch: int, tokenizer: Any = None) -> Tensor:
    """A text target as embedding directions: one text for every image [D], or one per image [B, D]."""
    texts = [target] if isinstance(target, str) else list(target)
    if len(texts) not in (1, batch):
        raise ValueError(f"got {len(texts)} texts for {batch} images: give one text for all of them or one per image "
                         "(vitexplain.explain_texts explains every text on every image)")
    embeddings = text_embeddings(model, texts, tokenizer)
    return embeddings[0] if len(texts) == 1 else embeddings
