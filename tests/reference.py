"""An independent, written-out forward of a timm ViT, used to check the instrumentation and methods.

It re-derives attention from the block weights with plain tensor algebra and keeps every attention
map in the autograd graph, so tests can take gradients without going through vitexplain.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def manual_forward(model, images):
    """Return (logits, attentions, residuals): attentions[l] is [B, H, N, N] with ``retain_grad``."""
    attentions, stream = manual_blocks(model, images)
    return model.forward_head(model.norm(stream[-1])), attentions, stream[:-1]


def manual_blocks(model, images):
    """Return (attentions, stream): stream[l] is block l's input and stream[-1] the last block's output."""
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    attentions, residuals = [], []
    for block in model.blocks:
        residuals.append(tokens)
        attn = block.attn
        heads, width = attn.num_heads, attn.head_dim
        normed = block.norm1(tokens)
        qkv = F.linear(normed, attn.qkv.weight, attn.qkv.bias)
        q, k, v = qkv.split(heads * width, dim=-1)
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, width).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        probabilities = torch.softmax(q @ k.transpose(-1, -2) / width ** 0.5, dim=-1)
        probabilities.retain_grad()
        attentions.append(probabilities)
        mixed = (probabilities @ v).transpose(1, 2).reshape(tokens.shape[0], tokens.shape[1], heads * width)
        branch = F.linear(mixed, attn.proj.weight, attn.proj.bias)
        tokens = tokens + block.ls1(branch)
        tokens = tokens + block.ls2(block.mlp(block.norm2(tokens)))
    return attentions, residuals + [tokens]
