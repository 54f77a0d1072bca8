"""LATEC's view of a benchmark: each method's mean rank over the reported numbers of one kind of protocol, with an
interval from the same paired bootstrap as every other number.

LATEC (Klein et al., NeurIPS 2024 Datasets & Benchmarks; IML-DKFZ/latec, ``src/main/main_rank.py``) ranks the methods
on every metric (1 = best, by the median score over the images, reversed where higher is better) and gives each
method, per kind of metric (faithfulness, robustness, complexity), the mean of its ranks, rounded. vitexplain's own
summary never mixes numbers this way: it names who leads each number, paired over the images. With ``ranks: true``
in a bench config (``--ranks``) the reports add LATEC's view beside it, for every kind of protocol, where:

* a method's score on a number is, as LATEC's, the **median over the images** of its per-image values where the number
  is their mean (:class:`~vitexplain.uncertainty.Means`: most protocols); where it is not (an area under a mean
  curve, a correlation over the dataset), it is the number as the bench reports it;
* ties share the average of their ranks (LATEC's ``argsort`` breaks them by position in its method list);
* the mean rank is not rounded, and carries the 95 % interval of the mean rank over the bootstrap resamples of the
  images: each resample ranks the methods on the same images (:class:`~vitexplain.bench.uncertainty.Sample`'s
  replicates are paired when the methods have the same images), so the interval says how firmly the images order
  the methods; without an interval (fewer than :data:`~vitexplain.uncertainty.MIN_IMAGES` images, or methods scored
  on different images) the mean rank stands alone and says so;
* controls are left out (a reference, never ranked), and so is a method without a score on every number of the kind.

Decision record: docs/decisions/latec-ranks.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from ..uncertainty import TOO_FEW, has_interval, interval, resampled_positions
from .uncertainty import Sample


@dataclass(frozen=True)
class Ranked:
    """One reported number of one protocol, as ranking reads it: every method's score and bootstrap sample, and, where
    the number is the mean of per-image values, those values (``per_image``: method -> [n] float64; their median is
    ranked) with the bootstrap's ``seed``."""

    label: str
    number: str
    higher: bool
    scores: dict[str, float]
    samples: dict[str, Sample]
    per_image: dict[str, Tensor] | None = None
    seed: int = 0

    def score(self, method: str) -> float:
        """What LATEC ranks: the median over the images, else the reported number."""
        if self.per_image is None:
            return self.scores[method]
        return float(np.median(self.per_image[method].numpy()))

    def replicates(self, method: str) -> np.ndarray:
        """:meth:`score` on each of the bench's bootstrap resamples of the images [resamples]."""
        if self.per_image is None:
            return self.samples[method].replicates[self.number]
        values = self.per_image[method].numpy()
        return np.median(values[resampled_positions(len(values), self.seed).numpy()], axis=1)


def mean_ranks(numbers: list[Ranked], controls: set[str]) -> dict[str, object]:
    """``methods``: method -> [mean rank, low, high] (``low`` / ``high`` NaN without an interval), best first;
    ``numbers``: the ``label/number`` names averaged over; ``interval``: whether the ranks have intervals (else
    :data:`~vitexplain.uncertainty.TOO_FEW`'s reason); ``left_out``: methods without a score on every number."""
    everyone = {method for found in numbers for method in found.scores} - controls
    methods = sorted(m for m in everyone if all(m in found.scores for found in numbers))
    if not methods or not numbers:
        return {"methods": {}, "numbers": [], "interval": TOO_FEW, "left_out": sorted(everyone)}
    points = np.stack([_ranks(np.array([[found.score(m)] for m in methods]), found.higher)[:, 0]
                       for found in numbers]).mean(0)
    paired = all(_paired(found, methods) for found in numbers)
    if paired:
        resampled = np.stack([_ranks(np.stack([found.replicates(m) for m in methods]),
                                     found.higher) for found in numbers]).mean(0)
        bounds = [interval(row) for row in resampled]
    else:
        bounds = [(float("nan"), float("nan"))] * len(methods)
    ranked = sorted(zip(methods, points, bounds), key=lambda item: (item[1], item[0]))
    return {"methods": {m: [float(p), float(low), float(high)] for m, p, (low, high) in ranked},
            "numbers": [f"{found.label}/{found.number}" for found in numbers],
            "interval": True if paired else TOO_FEW,
            "left_out": sorted(everyone - set(methods))}


def _ranks(values: np.ndarray, higher: bool) -> np.ndarray:
    """Ranks of the methods (rows) in every column, 1 = best, ties averaged."""
    from scipy.stats import rankdata  # here: scipy.stats takes half a second to import, every bench paid it

    return rankdata(-values if higher else values, axis=0, method="average")


def _paired(found: Ranked, methods: list[str]) -> bool:
    """Whether every method's replicates of ``found`` come from the same resamples of the same images."""
    samples = [found.samples.get(m) for m in methods]
    if any(s is None or found.number not in s.replicates for s in samples):
        return False
    first = samples[0].indices
    return has_interval(len(first)) and all(s.indices == first for s in samples)
