"""How sure a reported number is: a percentile bootstrap over the images, from per-image values.

A reported number is a metric's ``reduce`` of per-image values (a mean, an AUC of a mean curve,
counts summed over images ...), so its uncertainty comes from resampling the images with
replacement and reducing each resample again (Efron's percentile bootstrap): it holds for every
reduction. The resamples are drawn by ``numpy.random.default_rng(seed)``, the run's seed, one
resample of n positions at a time, over the images sorted by dataset index, so an interval does not
depend on batching, interruptions or the number of processes, and two methods evaluated on the same
images are resampled with the same positions: their difference is paired over the images.

Most reports are means over the images (of a value, of a curve's area, of a hit). For those a resample's
number is the mean of the per-image numbers at its positions, which one indexing computes for every
resample at once; :func:`bootstrap` uses it when the report passes that test on the values themselves
(the whole set and the first resamples, to a relative 1e-9), and calls the report once per resample
otherwise (ratios of sums, ranks, anything else). A report declared a mean (:class:`Means`, the reduction of most
metrics, written once there) of per-image values is taken as such without that test.

No interval on fewer than :data:`MIN_IMAGES` images (docs/decisions/metric-trust.md, "How many images an interval
needs"): there the percentile bootstrap of a mean covers far less than its nominal 95 % (one image: every resample
is that image, a zero-width interval), so the bench and :func:`vitexplain.evaluate` both say
:data:`TOO_FEW` instead, and the bench compares no methods on such a number (:func:`has_interval` is the one test).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

RESAMPLES = 1000
CONFIDENCE = 0.95
#: resamples on which a report must equal the mean of its per-image numbers before the rest are taken as such
PROBES = 3
#: resamples a :class:`Stacked` report computes per call
STACKED_CHUNK = 100

#: the fewest images on which an interval is reported (and methods are compared): below, the percentile bootstrap of
#: a mean with nominal 95 % covers under 90 % even for normally distributed per-image values
MIN_IMAGES = 10
#: what the reports say in place of an interval on fewer than :data:`MIN_IMAGES` images
TOO_FEW = "too few images for an interval"

Report = Callable[[dict[str, Tensor]], dict[str, float]]


class Means:
    """A metric's report that is, for each number, the float64 mean over the images of one per-image value:
    ``Means(aopc="probability_drop")`` reports ``aopc`` as ``values["probability_drop"]``'s mean (every element of
    it: a value of several entries per image, e.g. one per step, is averaged over them too)."""

    def __init__(self, **numbers: str):
        self.numbers = numbers

    def __call__(self, values: dict[str, Tensor]) -> dict[str, float]:
        return {number: values[key].to(torch.float64).mean().item() for number, key in self.numbers.items()}

    def per_image(self, values: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """Each number's per-image values [n] (float64), whose mean over any resample is the report on it; None
        when a value has several entries per image (the mean of row means is not the report's mean bitwise)."""
        found = {number: values[key] for number, key in self.numbers.items()}
        if any(value.dim() != 1 for value in found.values()):
            return None
        return {number: value.to(torch.float64) for number, value in found.items()}

    def __repr__(self) -> str:
        return f"Means({', '.join(f'{number}={key!r}' for number, key in self.numbers.items())})"


class Stacked:
    """A metric's report that computes itself on many resamples of the images at once: ``numbers(values, positions,
    **options)`` takes the per-image values of the n images and ``positions`` [R, m] (each row a set of rows of them,
    repeats allowed) and gives each number on every set [R]; called as a report, it is that on the whole set. For a
    report that is neither a mean over the images nor cheap per call (sufficiency's distances between every two maps,
    which it computes once for all the resamples): :func:`bootstrap` hands it every resample in a few calls, and the
    whole set and the resamples go through the same arithmetic."""

    def __init__(self, numbers: Callable[..., dict[str, Tensor]]):
        self.numbers = numbers
        functools.update_wrapper(self, numbers)     # its signature is numbers' (the options a reporter hands it)

    def __call__(self, values: dict[str, Tensor], **options) -> dict[str, float]:
        whole = torch.arange(next(iter(values.values())).shape[0])[None]
        return {number: value[0].item() for number, value in self.numbers(values, whole, **options).items()}


def has_interval(images: int) -> bool:
    """Whether a number over ``images`` images gets a bootstrap interval (at least :data:`MIN_IMAGES`)."""
    return images >= MIN_IMAGES


@functools.lru_cache(maxsize=32)
def resampled_positions(n: int, seed: int, resamples: int = RESAMPLES) -> Tensor:
    """Row r: the n positions in 0 … n-1 of resample r, drawn with replacement by ``default_rng(seed)``,
    one resample after the other [resamples, n]. Kept for the next number of a run (a bench reduces hundreds
    on the same images and seed): read it, never write to it."""
    generator = np.random.default_rng(seed)
    return torch.from_numpy(np.stack([generator.integers(0, n, n) for _ in range(resamples)]))


def bootstrap(values: dict[str, Tensor], report: Report, seed: int) -> dict[str, np.ndarray]:
    """Per reported number, its value on each resample of the images (rows of ``values``) [resamples]."""
    positions = resampled_positions(next(iter(values.values())).shape[0], seed)
    declared, options = _declared(report)
    if isinstance(declared, Stacked):
        chunks = [declared.numbers(values, rows, **options) for rows in positions.split(STACKED_CHUNK)]
        return {key: torch.cat([chunk[key] for chunk in chunks]).to("cpu", torch.float64).numpy() for key in chunks[0]}
    means = declared.per_image(values) if isinstance(declared, Means) else None
    means = means if means is not None else _as_means(values, report, positions)
    if means is not None:
        return {key: per_image[positions].mean(1).numpy() for key, per_image in means.items()}
    resampled = {key: value[positions] for key, value in values.items()}      # [resamples, n, ...] each
    rows = [report({key: value[r] for key, value in resampled.items()}) for r in range(positions.shape[0])]
    return {key: np.array([float(row[key]) for row in rows]) for key in rows[0]}


def _declared(report: Report) -> tuple[Report, dict]:
    """The report a metric registered and the options it is called with: ``report`` itself, or what a
    :meth:`~vitexplain.metrics.Metric.reporter` wraps (``functools.partial(reduce, **options)``)."""
    if isinstance(report, functools.partial) and not report.args:
        return report.func, dict(report.keywords)
    return report, {}


def _as_means(values: dict[str, Tensor], report: Report, positions: Tensor) -> dict[str, Tensor] | None:
    """Each reported number's per-image values [n] (float64) when the report is their mean on the whole set and
    on the first :data:`PROBES` resamples; None otherwise, or when that test costs more than it saves."""
    count = positions.shape[1]
    if count > positions.shape[0] // 2:
        return None
    singles = [report({key: value[i:i + 1] for key, value in values.items()}) for i in range(count)]
    means = {key: torch.tensor([float(single[key]) for single in singles], dtype=torch.float64) for key in singles[0]}
    if not all(torch.isfinite(mean).all() for mean in means.values()):
        return None
    checks = [(torch.arange(count), report(values))]
    checks += [(positions[r], report({key: value[positions[r]] for key, value in values.items()}))
               for r in range(min(PROBES, positions.shape[0]))]
    for rows, found in checks:
        if found.keys() != means.keys() or not all(
                np.isclose(float(found[key]), means[key][rows].mean().item(), rtol=1e-9, atol=1e-12) for key in means):
            return None
    return means


def interval(replicates: np.ndarray) -> tuple[float, float]:
    """The central :data:`CONFIDENCE` percentile interval of bootstrap replicates (resamples without a
    finite value left out; NaN when none has one)."""
    finite = replicates[np.isfinite(replicates)]
    if not finite.size:
        return float("nan"), float("nan")
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)
