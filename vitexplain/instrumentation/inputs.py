"""Inputs of the text families: tokenised text as one batch."""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """A batch of tokenised text, the input of text classifiers (what a tokenizer returns, as tensors).

    Attributes:
        input_ids: token ids [B, T] (long).
        attention_mask: True for real tokens, False for padding [B, T] (bool).
        token_type_ids: segment ids [B, T] (long), or None for the model's default (all 0).
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @property
    def lengths(self) -> Tensor:
        """Real (unpadded) tokens per sequence [B]."""
        return self.attention_mask.sum(1)

    def select(self, rows: Tensor, length: int | None = None) -> TokenBatch:
        """The sequences at ``rows``, cut to their first ``length`` positions (all when None)."""
        cut = slice(None, length)
        pick = lambda t: None if t is None else t[rows, cut]  # noqa: E731
        return TokenBatch(pick(self.input_ids), pick(self.attention_mask), pick(self.token_type_ids))

    def as_model_inputs(self) -> dict[str, Tensor]:
        """Keyword arguments of a transformers model's forward."""
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask.long()}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs

    def to(self, device: torch.device | str) -> TokenBatch:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return TokenBatch(move(self.input_ids), move(self.attention_mask), move(self.token_type_ids))
