"""The bench loop: for each model and method, explain the images, evaluate every metric, cache it all.

Work is cached per image on disk (see :mod:`vitexplain.bench.store`): explanation maps per
(model, dataset, target mode, method and its options), per-image metric values per metric and its
options below that. A run only computes what is missing, so an interrupted run resumes where it
stopped and a metric added later reuses the maps. Reported numbers are always reduced from the
stored per-image values of every image, in dataset order, so they do not depend on batching, on
interruptions, or on the number of processes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..api import explain
from ..instrumentation import adapter_for
from ..metrics import EvalBatch, Metric, get_metric, model_probabilities
from ..registry import get_method
from .config import BenchConfig, DatasetSpec, MethodEntry, MetricEntry, ModelEntry
from .data import Batch, build_dataset, loader, select_indices, take
from .distributed import Place, place
from .report import BenchResult, Gallery, Share, build_result, write_reports
from .sanity import cascading_randomisation, flagged
from .store import ShardStore, atomic_write, options_key, safe_name


def run_benchmark(config: BenchConfig | dict | str | Path) -> BenchResult:
    """Run (or resume) a benchmark and write its reports; see :class:`BenchConfig`.

    ``config`` may also be a dict of its fields or the path of a YAML file. Under ``torchrun`` every
    process takes images r::world; rank 0 reduces and writes the reports (and alone builds the
    gallery and runs the model-randomisation check, on its own images), and every process returns
    the same :class:`BenchResult`. Errors of single items (an unreadable image, a method or metric
    raising on a batch) are recorded in ``BenchResult.errors`` and the run goes on.
    """
    started = time.perf_counter()
    if isinstance(config, (str, Path)):
        config = BenchConfig.from_yaml(config)
    elif isinstance(config, dict):
        config = BenchConfig.from_dict(config)
    methods = [(entry, _method_options(entry, config.seed)) for entry in config.methods]
    for entry in config.metrics:
        _metric_options(entry, config.seed)
    with place(config.device) as where:
        work = _Work()
        for model_entry in config.models:
            _bench_model(model_entry, methods, config, where, work)
        gathered = where.gather((work.shares, work.errors, work.seconds))
        result = None
        if where.rank == 0:
            seconds: dict[str, dict[str, dict[str, float]]] = {}
            for _, _, part in gathered:
                for model, per_method in part.items():
                    for method, spent in per_method.items():
                        _add_seconds(seconds, model, method, spent)
            result = build_result(config, [s for part, _, _ in gathered for s in part], [e for _, part, _ in gathered for e in part],
                                  galleries=work.galleries, sanity=work.sanity, seconds=time.perf_counter() - started,
                                  timings=seconds)
            write_reports(result, config.output_dir)
        return where.broadcast(result)


@dataclass
class _Work:
    """What this process found: per-image values, errors, seconds; on rank 0 also galleries and sanity."""

    shares: list[Share] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    galleries: list[Gallery] = field(default_factory=list)
    sanity: dict[str, Any] = field(default_factory=dict)


def _add_seconds(into: dict[str, dict[str, dict[str, float]]], model: str, method: str, spent: dict[str, float]) -> None:
    found = into.setdefault(model, {}).setdefault(method, {})
    for phase, value in spent.items():
        found[phase] = found.get(phase, 0.0) + value


def _bench_model(model_entry: ModelEntry, methods: list[tuple[MethodEntry, dict[str, Any]]], config: BenchConfig,
                 where: Place, work: _Work) -> None:
    """Every method and metric on one model (metrics grouped by dataset), then its gallery and sanity check."""
    model, data_config = _load_model(model_entry, where.device, config.dataset)
    model_dir = config.output_dir / "cache" / f"{safe_name(model_entry.name)}-{fingerprint(model)}"
    main: tuple[Any, dict[str, MethodRun], list[int]] | None = None
    for group, (spec, entries) in enumerate(_dataset_groups(config)):
        dataset, dataset_key = build_dataset(spec, data_config)
        normalisation = _normalisation(dataset)
        metrics = [(entry, get_metric(entry.name), _metric_options(entry, config.seed, normalisation)) for entry in entries]
        wanted = {entry.label: _mine(len(dataset), config.limit_of(entry), config, where) for entry in entries}
        shown = []
        if group == 0 and where.rank == 0:
            shown = _mine(len(dataset), config.limit, config, where)[:max(config.gallery, _sanity_images(config))]
        base = model_dir / safe_name(dataset_key) / f"target-{config.target}"
        runs = {}
        for method_entry, options in methods:
            run = MethodRun(model, model_entry.name, method_entry, options, metrics, base, config, where)
            work.errors += run.run(dataset, wanted, shown)
            work.shares += run.shares(wanted)
            _add_seconds(work.seconds, model_entry.name, method_entry.label, run.seconds)
            runs[method_entry.label] = run
        if group == 0:
            main = (dataset, runs, shown)
    if where.rank != 0 or main is None:
        return
    dataset, runs, shown = main
    gallery = _gallery(model, model_entry.name, dataset, shown[:config.gallery], runs, data_config, where.device)
    if gallery is not None:
        work.galleries.append(gallery)
    if config.sanity is not None:
        work.sanity[model_entry.name] = _sanity(model, model_entry.name, dataset, shown[:config.sanity.images], runs,
                                                config, where.device, work)


def _mine(size: int, limit: int | None, config: BenchConfig, where: Place) -> list[int]:
    """This process's share of the images a limit selects."""
    return select_indices(size, limit, config.seed)[where.rank::where.world]


def _sanity_images(config: BenchConfig) -> int:
    return 0 if config.sanity is None else config.sanity.images


def _dataset_groups(config: BenchConfig) -> list[tuple[Any, list[MetricEntry]]]:
    """The metrics grouped by the dataset they run on; the run's dataset first (even with no metric)."""
    groups: list[tuple[Any, list[MetricEntry]]] = [(config.dataset, [])]
    for entry in config.metrics:
        spec = config.dataset if entry.dataset is None else entry.dataset
        for known, members in groups:
            if known is spec or known == spec:
                members.append(entry)
                break
        else:
            groups.append((spec, [entry]))
    return groups


def _normalisation(dataset: Any) -> tuple[list[float], list[float]] | None:
    """(mean, std) the dataset normalised its images with (its ``preprocess``), or None when unknown."""
    preprocess = getattr(dataset, "preprocess", None)
    mean, std = getattr(preprocess, "mean", None), getattr(preprocess, "std", None)
    if mean is None or std is None:
        return None
    return [float(v) for v in mean], [float(v) for v in std]


def _method_options(entry: MethodEntry, seed: int) -> dict[str, Any]:
    spec = get_method(entry.name)
    spec.check_options(entry.options)
    options = dict(entry.options)
    if spec.randomised:
        options.setdefault("seed", seed)
    return options


def _metric_options(entry: MetricEntry, seed: int,
                    normalisation: tuple[list[float], list[float]] | None = None) -> dict[str, Any]:
    """The metric's effective options; ``pixel_mean`` / ``pixel_std`` not given are the normalisation
    the bench preprocessed the images with (so "black" is black whatever the model's timm config says)."""
    metric = get_metric(entry.name)
    unknown = sorted(set(entry.options) - set(metric.options))
    if unknown:
        raise ValueError(f"metric {entry.name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"its options are: {', '.join(sorted(metric.options)) or 'none'}")
    options = {**metric.options, **entry.options}
    if "seed" in metric.options and "seed" not in entry.options:
        options["seed"] = seed
    if normalisation is not None and {"pixel_mean", "pixel_std"} <= set(metric.options):
        for key, value in zip(("pixel_mean", "pixel_std"), normalisation):
            if entry.options.get(key) is None:
                options[key] = value
    return options


def _load_model(entry: ModelEntry, device: torch.device, dataset: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The model on ``device`` and its preprocessing config (only needed to build a named dataset)."""
    if isinstance(entry.source, nn.Module):
        model = entry.source.to(device)
        if not isinstance(dataset, DatasetSpec):
            return model, {}
        from ..models import data_config

        return model, data_config(model)
    from ..models import load_model

    return load_model(entry.source or entry.name, arch=entry.arch, device=device)


def fingerprint(model: nn.Module) -> str:
    """Hash of the model's weights: a model changed under the same name gets a fresh cache."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


def _error(model: str, method: str, metric: str | None, ids: list[str], error: BaseException | str) -> dict[str, Any]:
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"model": model, "method": method, "metric": metric, "images": list(ids), "error": message}


def _check_requirements(metric: Metric, batch: Batch) -> None:
    provided = {key: batch.data.get(key) is not None for key in ("masks", "boxes", "second")}
    provided["labels"] = bool((batch.data["labels"] >= 0).all())
    missing = [need for need in metric.requires if not provided.get(need, False)]
    if missing:
        raise ValueError(f"metric {metric.name!r} needs {', '.join(missing)}, which these images do not have")


def _check_values(metric: Metric, values: Any, count: int) -> dict[str, Tensor]:
    if not isinstance(values, dict) or not all(isinstance(v, Tensor) for v in values.values()):
        raise TypeError(f"metric {metric.name!r} must return a dict of per-image tensors, got {type(values).__name__}")
    for key, value in values.items():
        if value.ndim not in (1, 2) or value.shape[0] != count:
            raise ValueError(f"metric {metric.name!r} returned {key!r} of shape {tuple(value.shape)}; "
                             f"expected [{count}] or [{count}, steps]")
    return values


class MethodRun:
    """One (model, method): its caches, and the loop over the images that still miss something."""

    def __init__(self, model: nn.Module, model_name: str, method: MethodEntry, options: dict[str, Any],
                 metrics: list[tuple[MetricEntry, Metric, dict[str, Any]]], base: Path, config: BenchConfig, where: Place):
        self.model, self.model_name, self.method, self.options = model, model_name, method, options
        self.metrics = metrics
        self.config, self.where = config, where
        effective = {**get_method(method.name).options, **options}
        directory = base / f"{safe_name(method.name)}-{options_key(effective)}"
        self.directory = directory
        self.wanted: dict[str, set[int]] = {}
        #: seconds spent by this process: "maps" (explaining) and each metric label
        self.seconds: dict[str, float] = {}
        self.maps = ShardStore(directory / "maps")
        _describe(directory, {"method": method.name, "options": effective})
        self.values: dict[str, ShardStore] = {}
        for entry, metric, metric_options in metrics:
            metric_dir = directory / "metrics" / f"{safe_name(metric.name)}-{options_key(metric_options)}"
            self.values[entry.label] = ShardStore(metric_dir)
            _describe(metric_dir, {"metric": metric.name, "options": metric_options})

    def explain(self, images: Tensor, targets: Tensor) -> Tensor:
        return explain(self.model, images, self.method.name, target=targets, **self.options)

    def run(self, dataset, wanted: dict[str, list[int]], shown: list[int] = ()) -> list[dict[str, Any]]:
        """Process the images that miss maps or a metric value; returns the errors.

        ``wanted`` gives each metric's images (by label); ``shown`` are images that need maps only
        (the gallery's and the sanity check's).
        """
        self.maps.scan()
        for store in self.values.values():
            store.scan()
        self.wanted = {label: set(indices) for label, indices in wanted.items()}
        needed = sorted(set(shown).union(*self.wanted.values()))
        todo = [i for i in needed if i not in self.maps
                or any(i in self.wanted[label] and i not in store for label, store in self.values.items())]
        errors: list[dict[str, Any]] = []
        show = self.config.progress and self.where.rank == 0
        with tqdm(total=len(todo), desc=f"{self.model_name} / {self.method.label}", unit="img", disable=not show) as bar:
            for batch in loader(dataset, todo, self.config.batch_size, self.config.num_workers):
                for index, message in batch.failed:
                    errors.append(_error(self.model_name, self.method.label, None, [f"#{index}"], message))
                if batch.indices:
                    errors += self._process(batch.to(self.where.device))
                bar.update(len(batch.indices) + len(batch.failed))
        return errors

    def _targets(self, images: Tensor, labels: Tensor) -> Tensor:
        if self.config.target == "label":
            return labels
        return adapter_for(self.model).logits(images).argmax(-1)

    def _eval_batch(self, batch: Batch, maps: Tensor, targets: Tensor) -> EvalBatch:
        data = batch.data
        return EvalBatch(images=data["images"], maps=maps, targets=targets, labels=data["labels"], explain=self.explain,
                         ids=batch.ids, masks=data.get("masks"), boxes=data.get("boxes"), second=data.get("second"),
                         ignore=data.get("void"))

    def _maps(self, batch: Batch) -> tuple[Tensor, Tensor, list[int]]:
        """Maps and targets of the batch (cached or computed, on the device) and the rows computed now."""
        cached = [row for row, index in enumerate(batch.indices) if index in self.maps]
        fresh = [row for row, index in enumerate(batch.indices) if index not in self.maps]
        parts = []
        if cached:
            stored = self.maps.read([batch.indices[r] for r in cached], [batch.ids[r] for r in cached], self.where.device)
            parts.append((stored["maps"], stored["targets"]))
        if fresh:
            images = take(batch.data["images"], fresh)
            targets = self._targets(images, take(batch.data["labels"], fresh))
            with self._timed("maps"):
                parts.append((self.explain(images, targets), targets))
        order = torch.tensor(cached + fresh, device=self.where.device).argsort()
        maps = torch.cat([m for m, _ in parts])[order]
        targets = torch.cat([t for _, t in parts])[order]
        return maps, targets, fresh

    @contextlib.contextmanager
    def _timed(self, what: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - started

    def _process(self, batch: Batch) -> list[dict[str, Any]]:
        errors = []
        if self.config.target == "label":
            unlabelled = [row for row, label in enumerate(batch.data["labels"].tolist()) if label < 0]
            if unlabelled:
                errors.append(_error(self.model_name, self.method.label, None, [batch.ids[r] for r in unlabelled],
                                     "target='label' but the image has no ground-truth label"))
                batch = batch.take([row for row in range(len(batch.indices)) if row not in unlabelled])
                if not batch.indices:
                    return errors
        try:
            maps, targets, fresh = self._maps(batch)
            evaluated = self._eval_batch(batch, maps, targets)
            if fresh:
                self.maps.write([batch.indices[r] for r in fresh], [batch.ids[r] for r in fresh],
                                {"maps": maps[fresh], "targets": targets[fresh]})
        except Exception as error:  # noqa: BLE001 - a method failing on a batch must not lose the rest
            return errors + [_error(self.model_name, self.method.label, None, batch.ids, error)]
        for entry, metric, options in self.metrics:
            store = self.values[entry.label]
            rows = [row for row, index in enumerate(batch.indices) if index in self.wanted[entry.label] and index not in store]
            if not rows:
                continue
            part = batch if len(rows) == len(batch.indices) else batch.take(rows)
            try:
                _check_requirements(metric, part)
                subset = evaluated if part is batch else self._eval_batch(part, maps[rows], targets[rows])
                with self._timed(entry.label):
                    values = _check_values(metric, metric.compute(self.model, subset, **options), len(rows))
                store.write(part.indices, part.ids, values)
            except Exception as error:  # noqa: BLE001 - a metric failing on a batch must not lose the rest
                errors.append(_error(self.model_name, self.method.label, entry.label, part.ids, error))
        return errors

    def shares(self, wanted: dict[str, list[int]]) -> list[Share]:
        """The stored per-image values of each metric's wanted images that have them."""
        found = []
        for entry, _, _ in self.metrics:
            store = self.values[entry.label]
            done = [i for i in wanted[entry.label] if i in store]
            values = store.read(done) if done else {}
            found.append(Share(self.model_name, self.method.label, entry.label, done, values))
        return found


def _describe(directory: Path, description: dict[str, Any]) -> None:
    """A readable note of what a cache folder holds."""
    path = directory / "spec.json"
    if not path.exists():
        atomic_write(path, json.dumps(description, indent=2, sort_keys=True, default=repr).encode())


def _one_batch(dataset, indices: list[int], device: torch.device) -> Batch | None:
    """The images at ``indices`` that load, as one batch on ``device`` (None when none is asked or loads)."""
    if not indices:
        return None
    batch = next(iter(loader(dataset, list(indices), len(indices), 0)))
    return batch.to(device) if batch.indices else None


def _cached_maps(runs: dict[str, MethodRun], labels: list[str], batch: Batch) -> dict[str, dict[str, Tensor] | None]:
    """Each method's cached maps and targets of the batch's images (None when some image has none)."""
    found = {}
    for label in labels:
        run = runs[label]
        complete = all(index in run.maps for index in batch.indices)
        found[label] = run.maps.read(batch.indices, batch.ids, batch.data["images"].device) if complete else None
    return found


def _gallery(model: nn.Module, model_name: str, dataset, indices: list[int], runs: dict[str, MethodRun],
             data_config: dict[str, Any], device: torch.device) -> Gallery | None:
    """The gallery images of one model with every method's (cached) maps and the model's prediction
    (None without images)."""
    from ..models import class_names_for

    batch = _one_batch(dataset, indices, device)
    if batch is None:
        return None
    images = batch.data["images"]
    probabilities = model_probabilities(model, images)
    normalisation = _normalisation(dataset)
    if normalisation is None:  # unknown preprocessing: stretch each image to [0, 1] for display
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        display = (images - low) / (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp_min(1e-12)
    else:
        mean, std = (torch.tensor(v, device=device).view(1, -1, 1, 1) for v in normalisation)
        display = images * std + mean
    found = _cached_maps(runs, list(runs), batch)
    return Gallery(model_name, batch.ids, display.clamp(0, 1).permute(0, 2, 3, 1).cpu(), batch.data["labels"].tolist(),
                   probabilities.argmax(-1).tolist(), probabilities.amax(-1).tolist(), class_names_for(model, data_config),
                   {label: None if maps is None else maps["maps"].cpu() for label, maps in found.items()})


def _sanity(model: nn.Module, model_name: str, dataset, indices: list[int], runs: dict[str, MethodRun],
            config: BenchConfig, device: torch.device, work: _Work) -> dict[str, Any]:
    """The model-randomisation check of the methods (cached per method beside its maps); its errors and
    the seconds each method took go to ``work``."""
    check = config.sanity
    labels = check.methods or list(runs)
    batch = _one_batch(dataset, indices, device)
    if batch is None:
        return {}
    found = _cached_maps(runs, labels, batch)
    key = options_key({"images": batch.indices, "seed": config.seed, "check": repr(check)})
    paths = {label: runs[label].directory / f"sanity-{key}.json" for label in labels}
    done = {label: json.loads(path.read_text()) for label, path in paths.items() if path.exists()}
    todo = {label: maps for label, maps in found.items() if label not in done and maps is not None}
    for label in [label for label, maps in found.items() if maps is None]:
        work.errors.append(_error(model_name, label, "sanity", batch.ids, "no maps of these images to compare with"))
    if todo:
        targets = next(iter(todo.values()))["targets"]

        def explain_randomised(label: str, randomised: nn.Module, images: Tensor, targets: Tensor) -> Tensor:
            started = time.perf_counter()
            try:
                return explain(randomised, images, runs[label].method.name, target=targets, **runs[label].options)
            finally:
                _add_seconds(work.seconds, model_name, label, {"sanity": time.perf_counter() - started})

        cascade = cascading_randomisation(model, batch.data["images"], targets, {l: m["maps"] for l, m in todo.items()},
                                          explain_randomised, seed=config.seed)
        for label, message in cascade.errors.items():
            work.errors.append(_error(model_name, label, "sanity", batch.ids, message))
        for label, correlations in cascade.correlations.items():
            done[label] = {"levels": cascade.levels, "correlations": correlations.tolist()}
            atomic_write(paths[label], json.dumps(done[label]).encode())
    if not done:
        return {}
    levels = next(iter(done.values()))["levels"]
    methods = {}
    for label in [label for label in labels if label in done]:
        mean = torch.tensor(done[label]["correlations"], dtype=torch.float64).mean(0).tolist()
        methods[label] = {"correlation": mean, "flagged": flagged(mean, check.threshold)}
    return {"levels": levels, "images": len(batch.indices), "threshold": check.threshold, "methods": methods}
