"""Augmentation of the training canvases, drawn from the training run's generator (never the global one)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..datasets.digits import CANVAS, Digits
from .recipe import TrainingRecipe


def jitter(images: Tensor, dataset: Digits, indices: Tensor, rotation: float, shear: float,
           generator: torch.Generator) -> Tensor:
    """The canvases turned by a uniform angle in ±``rotation`` degrees and sheared horizontally by a
    uniform factor in ±``shear``, both about the centre of each canvas's digit, so the digit stays
    where its layout (and :func:`digit_windows`) says it is; bilinear, edges repeated.

    Training-time augmentation of the digit's shape: the train split has only 1,438 scans, and a
    model that sees them only scaled and moved learns the scans more than the digits.
    """
    batch = images.shape[0]
    angle = torch.deg2rad((torch.rand(batch, generator=generator) * 2 - 1) * rotation)
    slant = (torch.rand(batch, generator=generator) * 2 - 1) * shear
    cos, sin = angle.cos(), angle.sin()
    # output -> input map in normalised (x, y) coordinates: rotation @ shear, about the digit's centre
    matrix = torch.stack([torch.stack([cos, cos * slant - sin], 1), torch.stack([sin, sin * slant + cos], 1)], 1)
    sizes = dataset.layout["sizes"][indices, 0].float()
    centre = torch.stack([(dataset.layout[axis][indices, 0].float() + sizes / 2) * 2 / CANVAS - 1
                          for axis in ("x", "y")], 1)
    offset = centre - (matrix @ centre[:, :, None])[:, :, 0]
    theta = torch.cat([matrix, offset[:, :, None]], 2).to(images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def rendering_styles(recipe: TrainingRecipe, batch: int, generator: torch.Generator) -> dict[str, Tensor]:
    """How each of ``batch`` training canvases is drawn (keywords of :meth:`Digits.render`): with
    probability ``recipe.nearest`` its scans are scaled by nearest neighbour (blocky strokes with hard
    edges) instead of bilinearly, and its strokes are thickened or thinned by a whole number of
    pixels drawn uniformly in ±``recipe.stroke``. Empty when the recipe asks for neither (nothing drawn).

    Why: the benchmark draws every scan bilinearly, so its strokes always have the same soft profile;
    a model that has only seen that profile reads it, not the digit's shape.
    """
    styles = {}
    if recipe.nearest:
        styles["nearest"] = torch.rand(batch, generator=generator) < recipe.nearest
    if recipe.stroke:
        styles["stroke"] = torch.randint(-recipe.stroke, recipe.stroke + 1, (batch,), generator=generator)
    return styles


def photometric(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...], *, contrast: float,
                gradient: float, noise: float, generator: torch.Generator) -> Tensor:
    """Canvases ``images`` [B, C, H, W] (normalised with ``mean`` / ``std``) with their grey levels
    ``g`` in [0, 1] changed per canvas, in this order, each amount drawn uniformly from 0 to its bound:

    * contrast: ``g -> lift + (1 - c) g``, ``c`` up to ``contrast``, ``lift`` up to ``c`` (the range
      shrinks and moves up, never out of [0, 1]);
    * gradient: ``+ a ramp``, a linear ramp from 0 to ``a`` (up to ``gradient``) across the canvas in a
      uniformly drawn direction (uneven lighting);
    * noise: ``+ s z``, ``z`` standard normal per pixel (the same in every channel), ``s`` up to ``noise``;

    then clipped to [0, 1]. A bound of 0 draws nothing.
    """
    batch, _, height, width = images.shape
    mean, std = (torch.tensor(values, dtype=images.dtype).view(1, -1, 1, 1) for values in (mean, std))
    grey = images * std + mean

    def amounts(bound: float) -> Tensor:
        return (torch.rand(batch, generator=generator) * bound).to(images.dtype).view(batch, 1, 1, 1)

    if contrast:
        squeeze = amounts(contrast)
        grey = squeeze * amounts(1.0) + (1 - squeeze) * grey
    if gradient:
        rise = amounts(gradient)
        angle = amounts(2 * math.pi)
        ys, xs = torch.meshgrid(*((torch.arange(n, dtype=images.dtype) + 0.5) / n * 2 - 1 for n in (height, width)),
                                indexing="ij")                               # pixel centres in (-1, 1)
        along = angle.cos() * xs + angle.sin() * ys                         # within ±√2
        grey = grey + rise * (along / (2 * math.sqrt(2)) + 0.5)
    if noise:
        grey = grey + amounts(noise) * torch.randn(batch, 1, height, width, generator=generator).to(images.dtype)
    return (grey.clamp(0, 1) - mean) / std
