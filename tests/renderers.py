"""A second renderer of digit canvases, owned by the tests: training never imports it.

The shipped models must read digits, not the benchmark's way of drawing them
(vitexplain.datasets.digits). This renderer shares nothing with it but the held-out scans (the
benchmark's test split, so the models have never seen one of these digits) and the canvas size
the models take. Everything else is drawn another way, written here from scratch in NumPy:

* the 8 x 8 scan is scaled by nearest neighbour (blocky strokes with hard edges) to a side of
  24-48 pixels, not bilinearly;
* the background is plain per-pixel noise (uniform in [0, ``noise``], ``noise`` drawn per canvas),
  with no clutter strokes, instead of smooth 4-pixel noise blobs under clutter;
* the digit is laid over the background ("over" compositing, ink as opacity), not merged with it by
  a per-pixel maximum;
* its full-ink brightness and the noise level come from ranges of their own.

A person reads these digits as easily as the benchmark's.
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from vitexplain.datasets.digits import split_scans

SIZE = 112                 # the canvas side the models take
SIDES = (24, 48)           # side of the scaled scan, pixels, inclusive
INK = (0.6, 1.0)           # brightness of full ink
NOISE = (0.05, 0.3)        # per canvas: background pixels uniform in [0, noise]


def alternative_canvases(n: int = 1000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` canvases [n, 3, 112, 112] (grey levels in [0, 1], repeated over the channels) of test-split
    scans drawn as described above, and their labels [n]. A pure function of ``n`` and ``seed``."""
    scans = load_digits()
    pool = split_scans(0)["test"].numpy()
    rng = np.random.default_rng([seed, 15])
    chosen = pool[rng.integers(0, len(pool), n)]
    sides = rng.integers(SIDES[0], SIDES[1] + 1, n)
    tops, lefts = (rng.integers(0, SIZE - sides + 1) for _ in range(2))
    ink_levels = rng.uniform(*INK, n)
    noise_levels = rng.uniform(*NOISE, n)
    background = rng.random((n, SIZE, SIZE)) * noise_levels[:, None, None]
    pixels = np.arange(SIZE)
    rows, cols = pixels - tops[:, None], pixels - lefts[:, None]          # [n, SIZE]: offsets into the square
    inside = ((rows >= 0) & (rows < sides[:, None]))[:, :, None] & ((cols >= 0) & (cols < sides[:, None]))[:, None, :]
    # nearest neighbour: the scan row / column under each pixel of the square
    source_rows, source_cols = (np.clip(offsets * 8 // sides[:, None], 0, 7) for offsets in (rows, cols))
    opacity = scans.images[chosen[:, None, None], source_rows[:, :, None], source_cols[:, None, :]] / 16.0 * inside
    canvases = background * (1 - opacity) + opacity * ink_levels[:, None, None]
    images = torch.from_numpy(canvases).float()[:, None].expand(-1, 3, -1, -1).contiguous()
    return images, torch.from_numpy(scans.target[chosen]).long()


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, mean, std,
             batch_size: int = 250) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on grey canvases ``images`` normalised with ``mean`` / ``std``."""
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    model.eval()
    correct = 0
    with torch.inference_mode():
        for chunk, truth in zip(images.split(batch_size), labels.split(batch_size)):
            correct += int((model((chunk - mean) / std).argmax(-1) == truth).sum())
    return correct / len(labels)
