"""Helpers shared by the evaluation protocols: option and map checks, upsampling, normalising, ranking."""
from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from ..maps import check_finite


def check_maps(maps: Tensor, batch: int | None = None, what: str = "explanation map") -> Tensor:
    """``maps`` as float [B, h, w]; raises naming the image (batch index) whose map is not finite."""
    if maps.dim() != 3:
        raise ValueError(f"{what}: expected shape [B, h, w], got {tuple(maps.shape)}")
    if batch is not None and maps.shape[0] != batch:
        raise ValueError(f"{what}: got {maps.shape[0]} maps for {batch} images")
    check_finite(maps, [f"image {i}" for i in range(maps.shape[0])], what)
    return maps if maps.is_floating_point() else maps.float()


def explain_copy(explain: Callable[..., Tensor], images: Tensor, targets: Tensor, copy: int, **keywords) -> Tensor:
    """The maps of a stability protocol's ``copy``-th perturbed copy of the images (``copy`` ≥ 1; 0 is the images
    themselves): ``explain(images, targets, copy=copy, **keywords)``, so that a control unrelated to its image
    (``random_baseline``) draws afresh for each copy (:attr:`~vitexplain.metrics.base.EvalBatch.explain`); a plain
    ``(images, targets)`` callable that takes no ``copy`` is called without it."""
    if _takes_copy(explain):
        keywords["copy"] = copy
    return explain(images, targets, **keywords)


def _takes_copy(explain: Callable[..., Tensor]) -> bool:
    try:
        return "copy" in inspect.signature(explain).parameters
    except (TypeError, ValueError):      # a callable without a signature Python can read
        return False


def check_image_batch(images: Tensor) -> None:
    if images.dim() != 4:
        raise ValueError(f"images must have shape [B, C, H, W], got {tuple(images.shape)}")


def check_targets(targets: Tensor, images: Tensor, what: str = "targets") -> Tensor:
    """One class index per image, as a long tensor on the images' device [B]."""
    targets = torch.as_tensor(targets, device=images.device).long().reshape(-1)
    if targets.numel() != images.shape[0]:
        raise ValueError(f"got {targets.numel()} {what} for {images.shape[0]} images")
    return targets


def removal_rank(maps: Tensor, most_relevant_first: bool = True) -> Tensor:
    """Position of every pixel in the removal order, [B, h*w] (0 = removed first).

    One stable sort per image. Ties are broken by raster position: among equal values the pixel with
    the lower row-major index comes first, in both directions (the reference codes use ``topk`` /
    unstable ``argsort``, whose order for ties is unspecified).
    """
    flat = maps.flatten(1)
    order = torch.sort(flat, dim=1, descending=most_relevant_first, stable=True).indices
    positions = torch.arange(flat.shape[1], device=flat.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)
