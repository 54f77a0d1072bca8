"""How sure a reported number is: a percentile bootstrap over the images, from per-image values.

A reported number is a metric's ``reduce`` of per-image values (a mean, an AUC of a mean curve,
counts summed over images ...), so its uncertainty comes from resampling the images with
replacement and reducing each resample again (Efron's percentile bootstrap): it holds for every
reduction. The resamples are drawn by ``numpy.random.default_rng(seed)``, the run's seed, one
resample of n positions at a time, over the images sorted by dataset index, so an interval does not
depend on batching, interruptions or the number of processes, and two methods evaluated on the same
images are resampled with the same positions: their difference is paired over the images.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

RESAMPLES = 1000
CONFIDENCE = 0.95

Report = Callable[[dict[str, Tensor]], dict[str, float]]


def resampled_positions(n: int, seed: int, resamples: int = RESAMPLES) -> Tensor:
    """Row r: the n positions in 0 … n-1 of resample r, drawn with replacement by ``default_rng(seed)``,
    one resample after the other [resamples, n]."""
    generator = np.random.default_rng(seed)
    return torch.from_numpy(np.stack([generator.integers(0, n, n) for _ in range(resamples)]))


def bootstrap(values: dict[str, Tensor], report: Report, seed: int) -> dict[str, np.ndarray]:
    """Per reported number, its value on each resample of the images (rows of ``values``) [resamples]."""
    positions = resampled_positions(next(iter(values.values())).shape[0], seed)
    resampled = {key: value[positions] for key, value in values.items()}      # [resamples, n, ...] each
    rows = [report({key: value[r] for key, value in resampled.items()}) for r in range(positions.shape[0])]
    return {key: np.array([float(row[key]) for row in rows]) for key in rows[0]}


def interval(replicates: np.ndarray) -> tuple[float, float]:
    """The central :data:`CONFIDENCE` percentile interval of bootstrap replicates (resamples without a
    finite value left out; NaN when none has one)."""
    finite = replicates[np.isfinite(replicates)]
    if not finite.size:
        return float("nan"), float("nan")
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)
