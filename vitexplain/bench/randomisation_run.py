"""The model-randomisation check inside a benchmark: which images, cached records, errors and seconds.

The computation is :mod:`vitexplain.bench.randomisation`; here it runs on rank 0 for one model, compares
with the bench's cached maps, finds each method's noise floor (a randomised method explains the
images once more with another seed), and keeps each method's correlations and floor beside its maps
(a checksummed JSON record keyed by the images, the seed and the check's options), so a resumed or
extended run recomputes only what is missing.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import explain
from ..metrics.sensitivity import sample_seeds
from ..registry import get_method
from .cache import MethodCache
from .config import SanityCheck
from .data import one_batch
from .findings import Findings, add_seconds, error_entry
from .randomisation import cascading_randomisation, image_to_image, spearman, verdict
from .store import discard, options_key, read_record, write_record

#: what a record holds (part of its key: records of an earlier check are not read)
RECORD = "correlations per image and level, noise floor per image"


def _valid(record: dict[str, Any] | None) -> bool:
    """Whether a stored record has the shape written below: level names, one row of correlations per
    image and one floor per image."""
    try:
        levels, rows, floor = record["levels"], record["correlations"], record["floor"]
        return (all(isinstance(level, str) for level in levels) and len(rows) > 0 and len(floor) == len(rows)
                and record["floor_kind"] in ("seed", "image") and all(isinstance(v, (int, float)) for v in floor)
                and all(len(row) == len(levels) and all(isinstance(v, (int, float)) for v in row) for row in rows))
    except (KeyError, TypeError):
        return False


def _floor(model: nn.Module, cache: MethodCache, images: Tensor, original: dict[str, Tensor]) -> tuple[Tensor, str]:
    """The method's noise floor per image and its kind: ``seed`` (randomised methods: the trained model's
    maps with another seed) or ``image`` (the map of another image of the check)."""
    if not get_method(cache.method).randomised:
        return image_to_image(original["maps"]), "image"
    options = {**cache.options, "seed": sample_seeds(cache.options.get("seed", 0), 1)[0]}
    other = explain(model, images, cache.method, target=original["targets"], **options)
    return spearman(original["maps"], other.to(original["maps"])), "seed"


def _spent(work: Findings, model_name: str, label: str, started: float) -> None:
    """The sanity seconds of ``label`` since ``started``, in the timings and the timeline alike."""
    ended = time.perf_counter()
    add_seconds(work.seconds, model_name, label, {"sanity": ended - started})
    work.mark(model_name, label, "sanity", started, ended)


def check_model(model: nn.Module, model_name: str, dataset: Dataset, indices: list[int], caches: dict[str, MethodCache],
                check: SanityCheck, seed: int, device: torch.device, work: Findings) -> dict[str, Any]:
    """The check of ``check.methods`` (default: all) on the images at ``indices``, as
    :attr:`vitexplain.bench.BenchResult.sanity` holds it for one model ({} without images or results).

    Errors (a method without cached maps, or failing on a randomised model) and the seconds each
    method took go to ``work``.
    """
    labels = check.methods or list(caches)
    batch = one_batch(dataset, indices, device)
    if batch is None:
        return {}
    if len(batch.indices) < 2:      # a deterministic method's floor compares two images: refused once, before work
        work.errors.append(error_entry(model_name, "", "sanity", batch.ids,
                                       "the model-randomisation check needs at least 2 images (its noise floor "
                                       "compares the maps of two images); this run gives it 1: raise --limit or "
                                       "sanity.images"))
        return {}
    key = options_key({"images": batch.keys, "seed": seed, "check": repr(check), "record": RECORD})
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
        work.errors.append(error_entry(model_name, label, "sanity", batch.ids,
                                       "no maps of these images to compare with"))
    todo = {label: maps for label, maps in found.items() if maps is not None}
    if todo:
        def explain_randomised(label: str, randomised: nn.Module, images: Tensor, targets: Tensor) -> Tensor:
            started = time.perf_counter()
            try:
                return explain(randomised, images, caches[label].method, target=targets, **caches[label].options)
            finally:
                _spent(work, model_name, label, started)

        targets = next(iter(todo.values()))["targets"]
        maps = {label: entry["maps"] for label, entry in todo.items()}
        cascade = cascading_randomisation(model, batch.data["images"], targets, maps, explain_randomised, seed=seed)
        for label, message in cascade.errors.items():
            work.errors.append(error_entry(model_name, label, "sanity", batch.ids, message))
        for label, correlations in cascade.correlations.items():
            started = time.perf_counter()
            try:
                floor, kind = _floor(model, caches[label], batch.data["images"], todo[label])
            except Exception as error:  # noqa: BLE001 - one method failing must not stop the others
                work.errors.append(error_entry(model_name, label, "sanity", batch.ids, error))
                continue
            finally:
                _spent(work, model_name, label, started)
            done[label] = {"levels": cascade.levels, "correlations": correlations.tolist(),
                           "floor": floor.cpu().tolist(), "floor_kind": kind}
            write_record(paths[label], done[label])
    if not done:
        return {}
    methods = {}
    for label in [label for label in labels if label in done]:
        correlations = torch.tensor(done[label]["correlations"], dtype=torch.float64)
        floor = torch.tensor(done[label]["floor"], dtype=torch.float64)
        methods[label] = {"correlation": correlations.mean(0).tolist(), "floor": floor.mean().item(),
                          "floor_kind": done[label]["floor_kind"], **verdict(correlations, floor, seed)}
    return {"levels": next(iter(done.values()))["levels"], "images": len(batch.indices), "methods": methods}
