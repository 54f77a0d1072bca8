"""Augmentation of the training canvases, drawn from the training run's generator."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..datasets.digits import CANVAS, Digits


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
    centre = torch.stack([(dataset.layout[axis][indices, 0].float() + sizes / 2) * 2 / CANVAS - 1 for axis in ("x", "y")], 1)
    offset = centre - (matrix @ centre[:, :, None])[:, :, 0]
    theta = torch.cat([matrix, offset[:, :, None]], 2).to(images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
