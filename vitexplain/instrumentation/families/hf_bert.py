"""BERT-style transformers text classifiers: ``BertForSequenceClassification`` and models sharing its encoder
layout (``RobertaForSequenceClassification``, ...), eager or SDPA attention.

Inputs are tokenised text (:class:`~vitexplain.instrumentation.inputs.TokenBatch`); the [CLS] token
(position 0) is the class token and the only prefix token, every other position ([SEP] included) is
a "patch", and the "grid" of a batch of T-token sequences is (T,). Per-token maps come back as
[B, T], aligned with ``input_ids``, with [CLS] and padding 0.

BERT layers are post-norm: h = LN₁(x + attn_branch), output = LN₂(h + mlp_branch). The recording reads
``residual`` = ``attn_input`` = the layer input; ``attn_branch`` = the attention's output projection
(``attention.output.dense``) before the add and LN₁; ``mlp_input`` = h, which is also the stream the
feed-forward branch is added to; ``mlp_branch`` = ``output.dense``'s output before the add and LN₂.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import AttentionParts
from ..blocks import BlockParts
from ..inputs import TokenBatch
from .base import TokenContext, UnsupportedModelError, register_family
from .examples import Example
from .hf_common import (
    TransformersClassifier,
    attention_reason,
    is_transformers_model,
    layer_inputs,
    replaced_output,
)
from .stack import Stack, missing, needing

LAYER_ATTRIBUTES = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                    "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def _as_batch(value: Any, name: str, integers: bool = True) -> Tensor:
    """A tensor [B, T] of ``value`` (one sequence [T] becomes a batch of one)."""
    tensor = torch.as_tensor(value)
    if integers and (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        raise TypeError(f"{name} must hold integers, got dtype {tensor.dtype}")
    return tensor[None] if tensor.ndim == 1 else tensor


def tiny_bert(**overrides) -> nn.Module:
    """A tiny randomly initialised BERT sequence classifier (the catalogue's)."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(**{**dict(vocab_size=50, hidden_size=48, num_hidden_layers=2,
                                                               num_attention_heads=3, intermediate_size=96,
                                                               num_labels=2), **overrides}))


def _classifier_reason(model: nn.Module) -> str | None:
    if type(model).__name__.endswith("ForSequenceClassification"):
        return None
    return f"{type(model).__name__} is not a sequence classifier (a *ForSequenceClassification model)"


def _encoder_reason(model: nn.Module) -> str | None:
    return missing(model.base_model, ("embeddings.word_embeddings", "encoder.layer"))


def _configuration_reason(model: nn.Module) -> str | None:
    if getattr(model.config, "is_decoder", False):
        return "it is configured as a decoder (causal attention)"
    if getattr(model.config, "chunk_size_feed_forward", 0):
        return "its feed-forward runs in chunks (chunk_size_feed_forward > 0)"
    return None


def _crossing(place: str, layer: nn.Module) -> str | None:
    return f"{place} has cross-attention" if getattr(layer, "crossattention", None) is not None else None


@register_family
class TransformersText(TransformersClassifier):
    """Where BERT-style transformers sequence classifiers keep their parts."""

    name = "transformers BERT-style text classifier"
    listing_order = 22
    modality = "text"
    stack = Stack("base_model.encoder.layer", {}, None, word="layer", checks=(needing(*LAYER_ATTRIBUTES), _crossing))
    refusals = (_classifier_reason, _encoder_reason, _configuration_reason, stack.reason, attention_reason)
    example_models = (Example("transformers BERT (text)", tiny_bert, inputs=lambda: torch.tensor([[2, 7, 11, 5, 3]])),)

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """A transformers model with word embeddings: a text encoder, classifier or not."""
        return is_transformers_model(model) and missing(model.base_model, ("embeddings.word_embeddings",)) is None

    def block(self, layer: nn.Module) -> BlockParts:
        """Post-norm: the feed-forward is ``intermediate`` then ``output.dense``, each branch's norm after its add."""
        attention, output = layer.attention.self, layer.attention.output
        parts = AttentionParts(
            module=attention, num_heads=attention.num_attention_heads, head_dim=attention.attention_head_size,
            scale=attention.scaling, proj=output.dense, query=attention.query, key=attention.key,
            value=attention.value, proj_drop=output.dropout)
        return BlockParts(
            module=layer, attention=parts, norm1=output.LayerNorm, norm2=layer.output.LayerNorm,
            mlp=lambda h: layer.output.dense(layer.intermediate(h)), activation=layer.intermediate.intermediate_act_fn,
            layout="post_norm", drop2=layer.output.dropout,
            inputs=layer_inputs)

    @property
    def patch_size(self) -> tuple[int, int]:
        raise UnsupportedModelError(f"{type(self.model).__name__} reads tokens, not image patches")

    def grid_size(self, tokens: TokenBatch) -> tuple[int]:
        return (tokens.shape[1],)

    def check_inputs(self, inputs: Any) -> TokenBatch:
        """Tokenised text as a :class:`TokenBatch` (the adapter moves it to the model's device).

        Takes a tokenizer's output (a mapping such as ``BatchEncoding`` with ``input_ids`` and
        optionally ``attention_mask`` and ``token_type_ids``, tensors or lists), a
        :class:`TokenBatch`, or an integer tensor of token ids [B, T]. Without an attention mask,
        positions holding the model's pad token are padding. One sequence [T] is a batch of one.
        """
        if isinstance(inputs, TokenBatch):
            given = {"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
                     "token_type_ids": inputs.token_type_ids}
        elif isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(INPUT_KEYS))
            if unknown or "input_ids" not in inputs:
                raise ValueError(f"tokenised text must have 'input_ids' and may have 'attention_mask' and "
                                 f"'token_type_ids'; got keys {sorted(inputs)}")
            given = dict(inputs)
        elif isinstance(inputs, Tensor) and not inputs.dtype.is_floating_point:
            given = {"input_ids": inputs}
        else:
            raise TypeError(f"{type(self.model).__name__} explains tokenised text: pass the tokenizer's output "
                            f"(input_ids, attention_mask) or token ids [B, T], got {type(inputs).__name__}")
        ids = _as_batch(given["input_ids"], "input_ids").long()
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(f"input_ids must have shape [B, T] with B, T > 0, got {tuple(ids.shape)}")
        vocabulary = self.model.config.vocab_size
        if ids.min() < 0 or ids.max() >= vocabulary:
            raise ValueError(f"input_ids hold ids outside the model's vocabulary of {vocabulary}")
        mask = given.get("attention_mask")
        if mask is None:
            pad = self.model.config.pad_token_id
            mask = ids != pad if pad is not None else torch.ones_like(ids, dtype=torch.bool)
        else:
            mask = _as_batch(mask, "attention_mask", integers=False)
            if mask.shape != ids.shape or not ((mask == 0) | (mask == 1)).all():
                raise ValueError(f"attention_mask must be 0/1 of the input_ids' shape {tuple(ids.shape)}, "
                                 f"got shape {tuple(mask.shape)}")
            mask = mask.bool()
        token_types = given.get("token_type_ids")
        if token_types is not None:
            token_types = _as_batch(token_types, "token_type_ids").long()
            if token_types.shape != ids.shape:
                raise ValueError(f"token_type_ids must have the input_ids' shape {tuple(ids.shape)}, "
                                 f"got {tuple(token_types.shape)}")
        return TokenBatch(ids, mask.to(ids.device), token_types)

    def forward(self, tokens: TokenBatch) -> Tensor:
        return self.model(**tokens.as_model_inputs()).logits

    def embed(self, tokens: TokenBatch) -> tuple[Tensor, TokenContext]:
        """Token embeddings fed to the first layer [B, T, C]; the sequences must be unpadded, because
        :meth:`encode` lets every token it is given attend to every other."""
        if not tokens.attention_mask.all():
            raise ValueError("embed takes unpadded sequences; cut the batch to sequences of one length")
        embeddings = self.model.base_model.embeddings(input_ids=tokens.input_ids, token_type_ids=tokens.token_type_ids)
        return embeddings, TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        ids = torch.zeros(tokens.shape[:2], dtype=torch.long, device=tokens.device)
        with replaced_output(self.model.base_model.embeddings, tokens):
            return self.forward(TokenBatch(ids, torch.ones_like(ids, dtype=torch.bool)))
