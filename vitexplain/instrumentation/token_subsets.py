"""Forwards on token subsets (TIS): a model run from its token embeddings with only some patch tokens of each image.

Prefix tokens are always kept. Tokens are dropped after the position embedding, so the kept ones keep their
positions (the token-sampling forward of TIS, Englebert et al. 2023, Eq. 4); position-dependent parts of the
attention (RoPE, relative position bias) follow the kept tokens (:func:`~.instrumented.instrumented_forward`'s
``positions``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .families.base import Family
from .instrumented import instrumented_forward


def subset_outputs(family: Family, inputs: Tensor, keep: Tensor, batch_size: int) -> Tensor:
    """The outputs of ``family``'s model [B·M, classes] when of each of ``inputs`` (as the model takes them) only the
    patches ``keep`` [B, M, K] enter the encoder (M subsets of K patches per input), ``batch_size`` sequences at
    once."""
    prefix = family.num_prefix_tokens
    tokens, context = family.embed(inputs)
    num_patches = tokens.shape[1] - prefix
    if keep.numel() and (keep.min() < 0 or keep.max() >= num_patches):
        raise ValueError(f"keep holds patch indices outside 0..{num_patches - 1}")
    b, m, k = keep.shape
    image_of = torch.arange(b, device=tokens.device).repeat_interleave(m)
    positions = torch.cat([torch.arange(prefix, device=tokens.device).expand(b * m, prefix),
                           keep.to(tokens.device).reshape(b * m, k) + prefix], dim=1)
    outputs = []
    for start in range(0, b * m, batch_size):
        rows, where = image_of[start:start + batch_size], positions[start:start + batch_size]
        with instrumented_forward(family, positions=where):
            outputs.append(family.encode(tokens[rows[:, None], where], context.select(rows, where, prefix)))
    return torch.cat(outputs)
