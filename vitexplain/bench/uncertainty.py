"""How sure the reported numbers are: a bootstrap over the images, from the per-image values the cache holds.

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
from dataclasses import dataclass

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


@dataclass
class Sample:
    """One method's per-image values on one protocol, and the bootstrap of its reported numbers.

    ``indices`` are the dataset indices of the rows of ``values`` (sorted), ``replicates`` per reported
    number its values on the resamples.
    """

    indices: list[int]
    values: dict[str, Tensor]
    replicates: dict[str, np.ndarray]


def paired_difference(first: Sample, second: Sample, number: str, report: Report, seed: int) -> tuple[float, float]:
    """The interval of ``first`` minus ``second`` on ``number``, resampling the images both have together."""
    if first.indices == second.indices:
        return interval(first.replicates[number] - second.replicates[number])
    common = sorted(set(first.indices) & set(second.indices))
    if len(common) < 2:
        return float("nan"), float("nan")
    replicates = []
    for sample in (first, second):
        rows = torch.tensor([sample.indices.index(i) for i in common])
        replicates.append(bootstrap({key: value[rows] for key, value in sample.values.items()}, report, seed)[number])
    return interval(replicates[0] - replicates[1])


def leaders(samples: dict[str, Sample], scores: dict[str, float], higher_is_better: bool, controls: set[str],
            number: str, report: Report, seed: int) -> dict[str, list[str]]:
    """Who leads ``number``: the best-valued method that is not a control, then every other method the
    paired interval cannot tell from it (one name: it is better than all the others at :data:`CONFIDENCE`;
    more: they are tied); ``controls``: the controls no leader is better than at that confidence.

    ``scores`` holds each method's reported value of ``number``; methods without a finite one, or without a
    sample, are left out.
    """
    found = {m: v for m, v in scores.items() if m in samples and np.isfinite(v)}
    methods = sorted((m for m in found if m not in controls), key=lambda m: -found[m] if higher_is_better else found[m])
    if not methods:
        return {"methods": [], "controls": []}
    top = methods[0]

    def cannot_beat(other: str) -> bool:
        low, high = paired_difference(samples[top], samples[other], number, report, seed)
        return not (low > 0 if higher_is_better else high < 0)

    return {"methods": [top] + [m for m in methods[1:] if cannot_beat(m)],
            "controls": [c for c in found if c in controls and cannot_beat(c)]}
