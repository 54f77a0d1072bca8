"""Small tensor helpers several methods share."""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

HeadFusion = Literal["mean", "max", "min"]


def fuse_heads(attn: Tensor, how: HeadFusion = "mean") -> Tensor:
    """Combine per-head maps [B, H, N, N] into one [B, N, N]."""
    if how == "mean":
        return attn.mean(1)
    if how == "max":
        return attn.amax(1)
    return attn.amin(1)


def with_residual(attn: Tensor) -> Tensor:
    """Add the identity for the skip connection and renormalise rows to sum to one: (A + I) / rowsum."""
    eye = torch.eye(attn.shape[-1], dtype=attn.dtype, device=attn.device)
    augmented = attn + eye
    return augmented / augmented.sum(-1, keepdim=True)


def block_index(option: str, value: int, num_blocks: int) -> int:
    """A block index option (0-based, negative counts from the end) as 0 … num_blocks-1, checked against the model."""
    if not -num_blocks <= value < num_blocks:
        raise ValueError(f"{option} must index one of the model's {num_blocks} blocks (-{num_blocks} … {num_blocks - 1}), "
                         f"got {value}")
    return value % num_blocks


def min_max(maps: Tensor) -> Tensor:
    """Each map [..., H, W] rescaled to [0, 1]; a constant map becomes 0."""
    low = maps.amin((-2, -1), keepdim=True)
    span = maps.amax((-2, -1), keepdim=True) - low
    return torch.where(span > 0, (maps - low) / torch.where(span > 0, span, 1), torch.zeros_like(maps))
