"""Regions that the region-removal protocols take away together, and the order they go in.

Region Perturbation, Selectivity and SRG remove square patches of a grid; IROF removes SLIC superpixels. Either
way a region's relevance is read from the map upsampled to the image (bilinearly, as every protocol here), the
regions are ranked on it (ties: the lower region index first, as pixels are elsewhere), and every pixel gets its
region's rank, so ``_perturb.mixed_logits`` removes whole regions when it is given counts of regions.

``slic`` is a batched port of scikit-image's ``slic`` (0.19-0.26, the version Quantus's IROF calls) without its
connectivity step, so vitexplain needs no scikit-image; docs/decisions/metrics-quantus-2.md says how its
superpixels compare.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..maps import resize
from ._common import removal_rank

#: sRGB (linear) -> CIE XYZ, and the D65 white (2 degree observer): scikit-image's ``rgb2lab`` constants
XYZ_FROM_RGB = ((0.412453, 0.357580, 0.180423), (0.212671, 0.715160, 0.072169), (0.019334, 0.119193, 0.950227))
D65 = (0.95047, 1.0, 1.08883)


def pixel_patches(height: int, width: int, size: int, device: torch.device | str = "cpu") -> tuple[Tensor, int]:
    """The ``size`` x ``size`` patch of every pixel, [H, W] (long, row-major patch index), and the patch count.

    The grid is centred on the image: when ``size`` does not divide a side, the patches of its first and last
    row (column) are cut, by floor and ceil of half the remainder (the padding Quantus's patch metrics use).
    Pixels to patches of the image; the model's tokens to its patch grid is ``TokenGeometry.patch_grid``.
    """
    if size > min(height, width):
        raise ValueError(f"patch_size {size} exceeds the image ({height} x {width} px)")
    pad_y, pad_x = (-height) % size, (-width) % size
    rows = (torch.arange(height, device=device) + pad_y // 2) // size
    columns = (torch.arange(width, device=device) + pad_x // 2) // size
    per_row = (width + pad_x) // size
    return rows[:, None] * per_row + columns[None, :], ((height + pad_y) // size) * per_row


def upsampled(maps: Tensor, images: Tensor) -> Tensor:
    """The maps [B, h, w] upsampled bilinearly to the images [B, C, H, W], in float64 (so that sums and means of
    regions rank the same whatever the order they were summed in)."""
    return resize(maps, images.shape[-2:]).to(torch.float64)


def region_relevance(relevance: Tensor, labels: Tensor, count: int, reduce: str) -> Tensor:
    """Per image the ``"sum"`` or ``"mean"`` of ``relevance`` [B, H, W] over each region of ``labels`` [B or 1, H, W]
    (0 ... count - 1), [B, count]; a region without pixels gets -inf (ranked last, most relevant first)."""
    batch = relevance.shape[0]
    index = labels.reshape(labels.shape[0], -1).expand(batch, -1)
    sums = relevance.new_zeros(batch, count).scatter_add_(1, index, relevance.reshape(batch, -1))
    sizes = relevance.new_zeros(batch, count).scatter_add_(1, index, torch.ones_like(relevance.reshape(batch, -1)))
    values = sums if reduce == "sum" else sums / sizes.clamp(min=1)
    return values.masked_fill(sizes == 0, -math.inf)


def pixel_rank(scores: Tensor, labels: Tensor, most_relevant_first: bool) -> Tensor:
    """The removal rank of every pixel's region, [B, H*W]: regions ranked on ``scores`` [B, R] (ties: lower
    region index first), pixels of labels [B or 1, H, W] given their region's rank."""
    rank = removal_rank(scores, most_relevant_first)
    return rank.gather(1, labels.reshape(labels.shape[0], -1).expand(scores.shape[0], -1))


def rgb_to_lab(rgb: Tensor) -> Tensor:
    """CIE L*a*b* (D65, 2 degree observer) of sRGB values in [0, 1], [B, 3, H, W]: scikit-image's ``rgb2lab``."""
    linear = torch.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = torch.einsum("kc,bchw->bkhw", torch.tensor(XYZ_FROM_RGB, dtype=rgb.dtype, device=rgb.device), linear)
    xyz = xyz / torch.tensor(D65, dtype=rgb.dtype, device=rgb.device).view(1, 3, 1, 1)
    f = torch.where(xyz > 0.008856, xyz.clamp(min=0) ** (1 / 3), 7.787 * xyz + 16 / 116)
    return torch.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], 1)


def grid_seeds(height: int, width: int, n_segments: int) -> tuple[list[int], list[int], int, int]:
    """scikit-image's ``regular_grid`` on the (1, H, W) volume it makes of a 2-D image: the seed rows and
    columns and the steps between them."""
    shape = (1, height, width)
    steps = [1.0, 1.0, 1.0]
    if math.prod(shape) > n_segments:
        order = sorted(range(3), key=lambda axis: shape[axis])
        sides = [shape[axis] for axis in order]
        sizes = [(math.prod(shape) / n_segments) ** (1 / 3)] * 3
        if any(side < size for side, size in zip(sides, sizes)):
            for dim in range(3):
                sizes[dim] = sides[dim]
                rest = math.prod(sides[dim + 1:])
                sizes[dim + 1:] = [(rest / n_segments) ** (1 / (3 - dim - 1))] * (3 - dim - 1)
                if all(side >= size for side, size in zip(sides, sizes)):
                    break
        for axis, size in zip(order, sizes):
            steps[axis] = size
        starts = [int(size // 2) for size in steps]
        strides = [int(round(size)) for size in steps]
    else:
        starts, strides = [0, 0, 0], [1, 1, 1]
    return (list(range(starts[1], height, strides[1])), list(range(starts[2], width, strides[2])),
            strides[1], strides[2])


def slic(images: Tensor, n_segments: int = 100, compactness: float = 10.0, iterations: int = 10,
         chunk: int = 8) -> tuple[Tensor, Tensor]:
    """SLIC superpixels of every image (Achanta et al., TPAMI 2012), as scikit-image's ``slic`` with its defaults
    (``sigma=0``, Lab for 3 channels, ``start_label=0``) but ``enforce_connectivity=False``, batched on the images'
    device in float64.

    Each image is rescaled to [0, 1] by its own minimum and maximum (over all channels) and, with 3 channels,
    converted to L*a*b*; seeds on scikit-image's regular grid start with colour 0 (so the first assignment is
    by position alone); ``iterations`` rounds (scikit-image's ``max_num_iter``: its loop never stops earlier) assign
    each pixel to the nearest seed within 2 steps along each axis, with distance
    |dy|^2 + |dx|^2 over step^2 plus |colour difference|^2 over compactness^2 (ties: the lower seed), then move
    each seed to the mean position and colour of its pixels (a seed without pixels is dropped).

    Returns:
        labels [B, H, W] (long), renumbered 0 ... n-1 per image in raster order of each superpixel's first pixel,
        and n per image [B] (long).
    """
    batch, channels, height, width = images.shape
    labels = torch.cat([_slic_chunk(images[begin:begin + chunk], n_segments, compactness, iterations)
                        for begin in range(0, batch, chunk)]) if batch else images.new_zeros(0, height, width).long()
    return _renumbered(labels, height * width)


def _slic_chunk(images: Tensor, n_segments: int, compactness: float, iterations: int) -> Tensor:
    batch, channels, height, width = images.shape
    device, pixels_count = images.device, height * width
    pixels = images.detach().to(torch.float64)
    low = pixels.amin(dim=(1, 2, 3), keepdim=True)
    span = pixels.amax(dim=(1, 2, 3), keepdim=True) - low
    pixels = (pixels - low) / torch.where(span > 0, span, torch.ones_like(span))
    if channels == 3:
        pixels = rgb_to_lab(pixels)
    flat = (pixels * (1.0 / compactness)).flatten(2)                                # [b, C, H*W]
    seed_rows, seed_columns, step_y, step_x = grid_seeds(height, width, n_segments)
    weight = 1.0 / float(max(1, step_y, step_x)) ** 2
    count = len(seed_rows) * len(seed_columns)
    centre_y = torch.tensor(seed_rows, device=device, dtype=torch.float64).repeat_interleave(len(seed_columns))
    centre_x = torch.tensor(seed_columns, device=device, dtype=torch.float64).repeat(len(seed_rows))
    centre_y, centre_x = centre_y.expand(batch, count).clone(), centre_x.expand(batch, count).clone()
    colour = flat.new_zeros(batch, channels, count)
    offset_y = torch.arange(4 * step_y + 1, device=device)
    offset_x = torch.arange(4 * step_x + 1, device=device)
    labels = torch.full((batch, pixels_count), -1, dtype=torch.long, device=device)
    seeds = torch.arange(count, device=device)[None, :, None, None]
    grid_y = torch.arange(height, device=device, dtype=torch.float64).repeat_interleave(width).expand(batch, -1)
    grid_x = torch.arange(width, device=device, dtype=torch.float64).repeat(height).expand(batch, -1)
    for _ in range(iterations):
        # each seed's window, 2 steps either side along each axis (scikit-image's <Py_ssize_t> casts truncate)
        alive = ~torch.isnan(centre_y)
        top = torch.where(alive, (centre_y - 2 * step_y).clamp(min=0), 0).trunc().long()
        bottom = torch.where(alive, (centre_y + 2 * step_y + 1).clamp(max=height), 0).trunc().long()
        left = torch.where(alive, (centre_x - 2 * step_x).clamp(min=0), 0).trunc().long()
        right = torch.where(alive, (centre_x + 2 * step_x + 1).clamp(max=width), 0).trunc().long()
        y = top[..., None, None] + offset_y[:, None]                                  # [b, K, wy, 1]
        x = left[..., None, None] + offset_x                                          # [b, K, 1, wx]
        inside = (y < bottom[..., None, None]) & (x < right[..., None, None])
        dy = centre_y[..., None, None] - y
        dx = centre_x[..., None, None] - x
        distance = (dy * dy + dx * dx) * weight                                       # [b, K, wy, wx]
        where = (y.clamp(max=height - 1) * width + x.clamp(max=width - 1)).expand_as(distance).reshape(batch, -1)
        values = flat.gather(2, where[:, None].expand(-1, channels, -1)).view(batch, channels, *distance.shape[1:])
        colour_distance = torch.zeros_like(distance)
        for channel in range(channels):
            t = values[:, channel] - colour[:, channel, :, None, None]
            colour_distance += t * t
        distance = (distance + colour_distance).masked_fill(~inside, math.inf).reshape(batch, -1)
        best = distance.new_full((batch, pixels_count), math.inf).scatter_reduce_(1, where, distance, "amin")
        winner = torch.where(distance == best.gather(1, where), seeds.expand(batch, -1, *inside.shape[2:]).reshape(
            batch, -1), count)
        nearest = torch.full_like(labels, count).scatter_reduce_(1, where, winner, "amin")  # ties: the lower seed
        labels = torch.where(torch.isfinite(best), nearest, labels)
        assigned, kept = labels.clamp(min=0), (labels >= 0).to(torch.float64)
        sizes = torch.zeros(batch, count, dtype=torch.float64, device=device).scatter_add_(1, assigned, kept)
        centre_y = torch.zeros_like(sizes).scatter_add_(1, assigned, grid_y * kept) / sizes    # 0 / 0: dropped
        centre_x = torch.zeros_like(sizes).scatter_add_(1, assigned, grid_x * kept) / sizes
        colour = torch.zeros_like(colour).scatter_add_(2, assigned[:, None].expand(-1, channels, -1),
                                                       flat * kept[:, None]) / sizes[:, None]
    return labels.clamp(min=0).view(batch, height, width)                      # (every pixel is in some window)


def _renumbered(labels: Tensor, pixels: int) -> tuple[Tensor, Tensor]:
    """Labels 0 ... n-1 per image in raster order of each label's first pixel, and n per image."""
    batch = labels.shape[0]
    flat = labels.reshape(batch, -1)
    count = int(flat.max().item()) + 1 if flat.numel() else 0
    position = torch.arange(flat.shape[1], device=flat.device).expand(batch, -1)
    first = torch.full((batch, max(count, 1)), pixels, dtype=torch.long, device=flat.device)
    first.scatter_reduce_(1, flat, position, reduce="amin")
    renamed = removal_rank(first, most_relevant_first=False)                     # by first pixel; unused last
    return renamed.gather(1, flat).view_as(labels), (first < pixels).sum(1)


def class_score(logits: Tensor, targets: Tensor, score: str = "probability") -> Tensor:
    """The explained class's ``"logit"``, softmax ``"probability"`` or ``"log_probability"`` (``options.Score``) at
    every step, [B, S], in float32, from logits [B, S, classes] and targets [B]."""
    logits = logits.float()
    if score == "probability":
        logits = logits.softmax(-1)
    elif score == "log_probability":
        logits = logits.log_softmax(-1)
    return logits.gather(2, targets[:, None, None].expand(-1, logits.shape[1], 1))[..., 0]
