"""Helpers shared by the gradient-weighted attention baselines (TAM, Beyond Intuition, AttCAT, ...)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter, Target
from ..options import AtLeastTwo, block_index
from ._products import push_rows

#: Depth of ViT-B/16, the model the authors of TAM and Beyond Intuition chose their start layers for.
REFERENCE_DEPTH = 12


#: Integration steps of the path-integrated attention gradients (both path ends included, so at least two).
IntegrationSteps = AtLeastTwo


def resolve_start_layer(start_layer: int | None, authors_value: int, num_blocks: int) -> int:
    """The first block a method includes.

    ``None`` takes the authors' value for a 12-block ViT-B and scales it to the model's depth
    (``authors_value * num_blocks // 12``), so shallower or deeper models keep the same share of
    late blocks; an int is used as given (negative counts from the end).
    """
    if start_layer is None:
        return authors_value * num_blocks // REFERENCE_DEPTH
    return block_index("start_layer", start_layer, num_blocks)


def integrated_gradient_weights(adapter: ModelAdapter, images: Tensor, target: Target, *,
                                n_steps: int, batch_size: int) -> Tensor:
    """Positive, head-averaged, path-integrated gradient of the last block's class-token attention [B, N].

    W = mean_h ( (1/n_steps) sum_k dy_c/dA^L_h[cls, :] at the image scaled by a_k )^+ with a_k evenly
    spaced over [0, 1] (both ends included), the integrated-gradient weighting of TAM (Yuan et al.
    2021) and Beyond Intuition (Chen et al. 2022), as in their code (``np.linspace(0, 1, n_steps)``).
    The readout's row takes the class token's for pooled readouts (the readout weights of each scaled
    image). All steps of all images run batched, ``batch_size`` scaled images per forward/backward pass.
    """
    batch = images.shape[0]
    alphas = torch.linspace(0, 1, n_steps, device=images.device, dtype=images.dtype)
    total = n_steps * batch
    rows = []
    for start in range(0, total, batch_size):
        index = torch.arange(start, min(start + batch_size, total), device=images.device)
        scaled = images[index % batch] * alphas[index // batch, None, None, None]
        record = adapter.record(scaled, target.select(index % batch), fields=(), grads={"attn": (-1,)})
        last = record.blocks[-1]
        rows.append(record.geometry.readout_rows(last.mixing(last.grads["attn"])))
    integrated = torch.cat(rows).reshape(n_steps, batch, *rows[0].shape[1:]).mean(0)
    return integrated.clamp(min=0).mean(1)


def perception_times_feedback(adapter: ModelAdapter, images: Tensor, record, mixed: list[Tensor], *, n_steps: int,
                              batch_size: int, absolute: bool = False) -> Tensor:
    """What the two Beyond Intuition methods share (Chen et al., TMLR 2022): the attention perception
    P = (I + Â_L) ⋯ (I + Â_start) rolled out from the blocks' mixing matrices ``mixed`` (lowest first), read at the
    readout's row, times the reasoning feedback (:func:`integrated_gradient_weights`); ``absolute`` takes |P| (the
    token-wise variant)."""
    geometry = record.geometry
    perception = push_rows(geometry.readout_weights(mixed[0]), mixed, stages=geometry.stages)
    feedback = integrated_gradient_weights(adapter, images, record.target, n_steps=n_steps, batch_size=batch_size)
    return geometry.patch_map(perception.abs() if absolute else perception) * geometry.patch_map(feedback)

