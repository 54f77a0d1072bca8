"""Comparing methods by the bootstrap of :mod:`vitexplain.uncertainty`: a method's sample of resamples, paired
differences between two methods on the images both have, and who leads a reported number."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..uncertainty import Report, bootstrap, has_interval, interval


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
    """The interval of ``first`` minus ``second`` on ``number``, resampling the images both have together; NaN on
    fewer than :data:`~vitexplain.uncertainty.MIN_IMAGES` of them (too few for an interval)."""
    if first.indices == second.indices:
        if not has_interval(len(first.indices)):
            return float("nan"), float("nan")
        return interval(first.replicates[number] - second.replicates[number])
    common = sorted(set(first.indices) & set(second.indices))
    if not has_interval(len(common)):
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
    sample, are left out. Nobody leads when the best-valued method has fewer than
    :data:`~vitexplain.uncertainty.MIN_IMAGES` images: too few for an interval, so too few to compare.
    """
    found = {m: v for m, v in scores.items() if m in samples and np.isfinite(v)}
    methods = sorted((m for m in found if m not in controls), key=lambda m: -found[m] if higher_is_better else found[m])
    if not methods or not has_interval(len(samples[methods[0]].indices)):
        return {"methods": [], "controls": []}
    top = methods[0]

    def cannot_beat(other: str) -> bool:
        low, high = paired_difference(samples[top], samples[other], number, report, seed)
        return not (low > 0 if higher_is_better else high < 0)

    return {"methods": [top] + [m for m in methods[1:] if cannot_beat(m)],
            "controls": [c for c in found if c in controls and cannot_beat(c)]}
