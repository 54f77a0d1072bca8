"""The model-randomisation check inside a benchmark: which images, cached records, errors and seconds.

The computation is :mod:`vitexplain.bench.sanity`; here it runs on rank 0 for one model, compares
with the bench's cached maps, and keeps each method's correlations beside its maps (a checksummed
JSON record keyed by the images, the seed and the check's options), so a resumed or extended run
recomputes only what is missing.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import explain
from .cache import MethodCache
from .config import SanityCheck
from .data import one_batch
from .sanity import cascading_randomisation, flagged
from .store import discard, options_key, read_record, write_record
from .work import Work, add_seconds, error_entry


def _valid(record: dict[str, Any] | None) -> bool:
    """Whether a stored record has the shape written below: level names and one row of correlations per image."""
    try:
        levels, rows = record["levels"], record["correlations"]
        return (all(isinstance(level, str) for level in levels) and len(rows) > 0
                and all(len(row) == len(levels) and all(isinstance(v, (int, float)) for v in row) for row in rows))
    except (KeyError, TypeError):
        return False


def check_model(model: nn.Module, model_name: str, dataset: Dataset, indices: list[int], caches: dict[str, MethodCache],
                check: SanityCheck, seed: int, device: torch.device, work: Work) -> dict[str, Any]:
    """The check of ``check.methods`` (default: all) on the images at ``indices``, as
    :attr:`vitexplain.bench.BenchResult.sanity` holds it for one model ({} without images or results).

    Errors (a method without cached maps, or failing on a randomised model) and the seconds each
    method took go to ``work``.
    """
    labels = check.methods or list(caches)
    batch = one_batch(dataset, indices, device)
    if batch is None:
        return {}
    key = options_key({"images": batch.indices, "seed": seed, "check": repr(check)})
    paths = {label: caches[label].sanity_record(key) for label in labels}
    done = {}
    for label, path in paths.items():
        record = read_record(path)
        if record is not None and not _valid(record):
            discard(path, "not a record of the randomisation check")
        elif record is not None:
            done[label] = record
    found = {label: caches[label].cached_maps(batch) for label in labels if label not in done}
    for label in [label for label, maps in found.items() if maps is None]:
        work.errors.append(error_entry(model_name, label, "sanity", batch.ids, "no maps of these images to compare with"))
    todo = {label: maps for label, maps in found.items() if maps is not None}
    if todo:
        def explain_randomised(label: str, randomised: nn.Module, images: Tensor, targets: Tensor) -> Tensor:
            started = time.perf_counter()
            try:
                return explain(randomised, images, caches[label].method, target=targets, **caches[label].options)
            finally:
                add_seconds(work.seconds, model_name, label, {"sanity": time.perf_counter() - started})

        targets = next(iter(todo.values()))["targets"]
        cascade = cascading_randomisation(model, batch.data["images"], targets, {l: m["maps"] for l, m in todo.items()},
                                          explain_randomised, seed=seed)
        for label, message in cascade.errors.items():
            work.errors.append(error_entry(model_name, label, "sanity", batch.ids, message))
        for label, correlations in cascade.correlations.items():
            done[label] = {"levels": cascade.levels, "correlations": correlations.tolist()}
            write_record(paths[label], done[label])
    if not done:
        return {}
    methods = {}
    for label in [label for label in labels if label in done]:
        mean = torch.tensor(done[label]["correlations"], dtype=torch.float64).mean(0).tolist()
        methods[label] = {"correlation": mean, "flagged": flagged(mean, check.threshold)}
    return {"levels": next(iter(done.values()))["levels"], "images": len(batch.indices), "threshold": check.threshold,
            "methods": methods}
