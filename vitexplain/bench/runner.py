"""The bench loop: for each model and method, explain the images, evaluate every metric, cache it all.

Work is cached per image on disk (:mod:`vitexplain.bench.cache`, :mod:`vitexplain.bench.store`):
explanation maps per (model, dataset, target mode, method and its options), per-image metric values
per metric and its options below that. A run only computes what is missing, so an interrupted run
resumes where it stopped and a metric added later reuses the maps. Reported numbers are always
reduced from the stored per-image values of every image, in dataset order, so they do not depend on
batching, on interruptions, or on the number of processes, except through floating-point rounding: the
matrix kernels may round an image's maps differently in the last bits in a batch of other images or
with another thread count, which a number ranking pixels (a threshold at the map's mean, an AP) can
show in its last digits (docs/decisions/performance.md, the bench at ImageNet-Segmentation scale).

Each model is run through one instrumentation adapter: it picks the explained classes, explains,
gives the metrics the model's forward (:attr:`vitexplain.metrics.EvalBatch.logits`) and the gallery
its predictions.
"""
from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..api import AllZeroMapWarning
from ..datasets.base import NOT_TRUTH
from ..evaluation import NOT_TRUTH_REQUIREMENTS, model_fields, reexplainer, score, scoring
from ..instrumentation import ModelAdapter, UnsupportedModelError, adapter_for
from ..instrumentation.adapter import Call
from ..instrumentation.lrp.memory import collecting
from ..instrumentation.modifying import modifier
from ..instrumentation.precision import precision_mode
from ..instrumentation.randomisation import randomisation_levels
from ..maps import check_finite
from ..metrics import EvalBatch, Metric
from ..metrics.base import BoundMetric, alternatives, describe_need
from ..metrics.numerical_stability import noisy_weights
from ..registry import BoundMethod
from .cache import MethodCache, model_folder
from .config import SANITY_LABEL, BenchConfig, DatasetSpec, MetricEntry, ModelEntry
from .data import Batch, build_dataset, dataset_normalisation, identities, loader, select_indices, take
from .distributed import Place, place
from .findings import Findings, Memory, add_memory, add_seconds, error_entry, record_decisions
from .gallery import build_gallery
from .lock import FolderInUse, config_key, folder_lock
from .result import BenchResult, Share, build_result
from .store import safe_name
from .writers import write_reports

Normalisation = tuple[tuple[float, ...], tuple[float, ...]]


def run_benchmark(config: BenchConfig | dict | str | Path) -> BenchResult:
    """Run (or resume) a benchmark and write its reports; see :class:`BenchConfig`.

    ``config`` may also be a dict of its fields or the path of a YAML file. Under ``torchrun`` every
    process takes images r::world (the model-randomisation check's too: it is a protocol); rank 0 reduces and
    writes the reports (and alone builds the gallery, on its own images), and every process returns
    the same :class:`BenchResult`, whose timeline is rank 0's (its clock; the other processes' work is in
    ``timings``). Errors of single items (an unreadable image, a method or metric
    raising on a batch) are recorded in ``BenchResult.errors`` and the run goes on. While it runs, the
    output folder is locked (:mod:`vitexplain.bench.lock`): a run of the same config waits for it, one
    of another config raises :class:`~vitexplain.bench.lock.FolderInUse`. Before that the folder is claimed
    (:mod:`vitexplain.output_folders`): a folder vitexplain did not make that holds a file the bench writes raises
    :class:`~vitexplain.output_folders.FolderNotOurs`, unless ``config.force`` (then a warning names the files).
    """
    from ..output_folders import FolderNotOurs, check_folder, mark_folder, unmark_unused
    from .lock import LOCK_NAME
    from .writers import OUTPUT_NAMES, WHO, made_by_earlier_bench

    started = time.perf_counter()
    if isinstance(config, (str, Path)):
        config = BenchConfig.from_yaml(config)
    elif isinstance(config, dict):
        config = BenchConfig.from_dict(config)
    with place(config.device) as where, contextlib.ExitStack() as held:
        refusal, taken = None, []
        if where.rank == 0:                     # the process that writes the reports claims the folder, then locks it
            try:
                taken = check_folder(config.output_dir, OUTPUT_NAMES, WHO, config.force, made_by_earlier_bench)
                held.enter_context(folder_lock(config.output_dir, config_key(config)))
                if mark_folder(config.output_dir, WHO):    # taken back if the run ends having written nothing
                    held.callback(unmark_unused, config.output_dir, (LOCK_NAME,))
            except (FolderInUse, FolderNotOurs) as error:
                refusal = (isinstance(error, FolderNotOurs), str(error))
        refusal = where.broadcast(refusal)
        if refusal:
            raise (FolderNotOurs if refusal[0] else FolderInUse)(refusal[1])
        if taken:
            warnings.warn(f"force: replacing {', '.join(taken)} in {config.output_dir}, which vitexplain did not "
                          "make", stacklevel=2)
        work = Findings(origin=started if where.rank == 0 else None)
        # explain's all-zero notice would repeat for every batch and perturbed call; the report shows the maps
        with precision_mode(config.precision, where.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", AllZeroMapWarning)
            for model_entry in config.models:
                _bench_model(model_entry, config, where, work)
        gathered = where.gather((work.shares, work.errors, work.seconds, work.memory))
        result = None
        if where.rank == 0:
            seconds: dict[str, dict[str, dict[str, float]]] = {}
            memory: Memory = {}
            for _, _, spent_part, memory_part in gathered:
                for model, per_method in spent_part.items():
                    for method, spent in per_method.items():
                        add_seconds(seconds, model, method, spent)
                for model, per_method in memory_part.items():
                    for method, paths in per_method.items():
                        add_memory(memory, model, method, paths)
            with work.timed("", "", "reduce"):
                result = build_result(config, [s for part, _, _, _ in gathered for s in part],
                                      [e for _, part, _, _ in gathered for e in part], galleries=work.galleries,
                                      sanity=work.sanity, seconds=time.perf_counter() - started, timings=seconds,
                                      memory=memory, notes=work.notes)
            result.timeline = work.timeline     # the same list: the reports' interval joins it once written
            with work.timed("", "", "reports"):
                write_reports(result, config.output_dir)
        return where.broadcast(result)


def _load_model(entry: ModelEntry, device: torch.device,
                models: list[ModelEntry] = ()) -> tuple[nn.Module, dict[str, Any]]:
    """The model on ``device`` and its preprocessing config (see :func:`vitexplain.models.load_model`); a noisy
    copy (``entry.noise_of``, one of ``models``) is its original loaded again, or copied when the original is a
    model object (which stays as it was), its weights changed by numerical stability's ``noisy_weights``."""
    from ..models import data_config, load_model

    if entry.noise_of is not None:
        original = next(other for other in models if other.name == entry.noise_of)
        model, config = _load_model(original, device)
        if isinstance(original.source, nn.Module):
            model = copy.deepcopy(model)
        seed = 0 if entry.seed is None else entry.seed         # a config gives it the run's; 0 is the run default
        noisy_weights(seed, entry.weight_noise)(model)
        return model, config
    if isinstance(entry.source, nn.Module):
        return entry.source.to(device), data_config(entry.source)

    return load_model(entry.source or entry.name, arch=entry.arch, device=device)


def _bench_model(model_entry: ModelEntry, config: BenchConfig, where: Place, work: Findings) -> None:
    """Every method and metric on one model (metrics grouped by dataset; the sanity check's protocol with the run's
    dataset), then its gallery."""
    from ..models import class_names_for

    model, data_config = _load_model(model_entry, where.device, config.models)
    adapter = adapter_for(model)
    folder = model_folder(config.output_dir, model_entry.name, model)
    bound = config.bind_for(data_config["input_size"][-2:])
    if bound.scalings and where.rank == 0:
        work.notes.append(f"{model_entry.name}: {'; '.join(bound.scalings)}.")
    main = None
    for group, (spec, entries) in enumerate(_dataset_groups(config)):
        dataset, dataset_key = build_dataset(spec, data_config)
        normal = dataset_normalisation(dataset, data_config)
        metrics = [bound.metrics[entry.label] for entry in entries]
        wanted = {entry.label: _mine(len(dataset), config.limit_of(entry), config, where) for entry in entries}
        provides = _provided(dataset, [entry.bound.metric for entry in entries], config)
        for entry in entries:
            lacking = _not_provided(entry.bound.metric, provides)
            if lacking:     # refused before any method runs: one entry per protocol, for every model and method
                wanted[entry.label] = []
                refusal = error_entry("", "", entry.label,
                                      [f"#{i}" for i in select_indices(len(dataset), config.limit_of(entry),
                                                                       config.seed)],
                                      f"metric {entry.name!r} needs {', '.join(lacking)}, which dataset "
                                      f"{_dataset_name(spec)} does not provide")
                if where.rank == 0 and refusal not in work.errors:
                    work.errors.append(refusal)
        checked = group == 0 and _sanity(model, model_entry.name, dataset, config, where, work)
        if checked:
            wanted[SANITY_LABEL] = _sanity_indices(len(dataset), config)[where.rank::where.world]
        shown = []
        if group == 0 and where.rank == 0:
            shown = _mine(len(dataset), config.limit, config, where)[:config.gallery]
        base = folder / safe_name(dataset_key) / f"target-{config.target}"
        if config.precision != "float32":  # float32 keeps the folders of runs made before precisions existed
            base = base / f"precision-{config.precision}"
        caches = {}
        needed = sorted(set(shown).union(*wanted.values()))
        keys = identities(dataset, needed, config.batch_size, config.num_workers)
        for method_entry in config.methods:
            sanity = [bound.sanity] if checked and config.sanity.checks(method_entry.label) else []
            run = MethodRun(adapter, model_entry.name, bound.methods[method_entry.label], metrics + sanity, base,
                            normal, config, where, work)
            work.errors += run.run(dataset, wanted, keys, shown)
            work.shares += run.shares(wanted)
            add_seconds(work.seconds, model_entry.name, method_entry.label, run.seconds)
            add_memory(work.memory, model_entry.name, method_entry.label, run.memory)
            caches[method_entry.label] = run.cache
        if group == 0:
            main = (dataset, caches, shown, normal)
    if where.rank != 0 or main is None:
        return
    dataset, caches, shown, normal = main
    with work.timed(model_entry.name, "", "gallery"):
        gallery = build_gallery(adapter, model_entry.name, dataset, shown[:config.gallery], caches, normal,
                                class_names_for(model, data_config), where.device)
    if gallery is not None:
        work.galleries.append(gallery)


def _sanity_indices(size: int, config: BenchConfig) -> list[int]:
    """The images the model-randomisation check explains again: the first ``sanity.images`` of the run's selection
    (those the gallery shows first), as the check has always taken them, so its verdicts stay comparable."""
    return select_indices(size, config.limit, config.seed)[:config.sanity.images]


def _sanity(model: nn.Module, model_name: str, dataset: Dataset, config: BenchConfig, where: Place,
            work: Findings) -> bool:
    """Whether the model-randomisation check runs on this model (the config's ``sanity``, as its protocol entry):
    not on fewer than 2 images (a deterministic method's noise floor compares two images' maps: refused once, before
    any work). Rank 0 keeps the names of the model's levels for the reports (a model without a cascade has none:
    the protocol then says why for every method)."""
    if config.sanity is None:
        return False
    indices = _sanity_indices(len(dataset), config)
    if len(indices) < 2:
        if where.rank == 0:
            work.errors.append(error_entry(model_name, "", SANITY_LABEL, [f"#{i}" for i in indices],
                                           "the model-randomisation check needs at least 2 images (its noise floor "
                                           "compares the maps of two images); this run gives it "
                                           f"{len(indices)}: raise --limit or sanity.images"))
        return False
    if where.rank == 0:
        try:
            work.sanity[model_name] = {"levels": [level.name for level in randomisation_levels(model)]}
        except UnsupportedModelError:
            pass
    return True


def _not_provided(metric: Metric, provides: tuple[str, ...] | None) -> list[str]:
    """The ground truth ``metric`` needs that a dataset serving ``provides`` does not serve, in words ("boxes or
    masks" for an entry naming alternatives); none when what it serves is unknown (None)."""
    if provides is None:
        return []
    return [describe_need(need) for need in metric.requires
            if not any(name in (*NOT_TRUTH_REQUIREMENTS, *provides) for name in alternatives(need))]


def _provided(dataset: Dataset, metrics: list[Metric], config: BenchConfig) -> tuple[str, ...] | None:
    """The ground truth ``dataset`` serves: its ``provides``; for a dataset that declares none (a Dataset object of
    the user's), the truth its first image's sample carries (every sample has the same keys, or they cannot be
    batched), looked at only when a metric needs ground truth; None when that image cannot be read."""
    provides = getattr(dataset, "provides", None)
    if provides is not None:
        return tuple(provides)
    needs = {name for metric in metrics for need in metric.requires for name in alternatives(need)}
    first = select_indices(len(dataset), config.limit, config.seed)[:1]
    if not needs - set(NOT_TRUTH_REQUIREMENTS) or not first:
        return None
    from .data import one_batch

    batch = one_batch(dataset, first, torch.device("cpu"))
    if batch is None:
        return None
    return tuple(key for key, value in batch.data.items() if key not in NOT_TRUTH and value is not None)


def _dataset_name(spec: DatasetSpec | Dataset) -> str:
    return repr(spec.name) if isinstance(spec, DatasetSpec) else type(spec).__name__


def _mine(size: int, limit: int | None, config: BenchConfig, where: Place) -> list[int]:
    """This process's share of the images a limit selects."""
    return select_indices(size, limit, config.seed)[where.rank::where.world]


def _dataset_groups(config: BenchConfig) -> list[tuple[DatasetSpec | Dataset, list[MetricEntry]]]:
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


class MethodRun:
    """One (model, method): the loop over the images that still miss maps or a metric value."""

    def __init__(self, adapter: ModelAdapter, model_name: str, method: BoundMethod, metrics: list[BoundMetric],
                 base: Path, normal: Normalisation | None, config: BenchConfig, where: Place,
                 work: Findings | None = None):
        self.adapter, self.model_name, self.method = adapter, model_name, method
        self.metrics, self.normalisation = metrics, normal
        self.config, self.where, self.work = config, where, work
        self.cache = MethodCache(base, method, metrics)
        self.explain = reexplainer(adapter, method)
        self.wanted: dict[str, set[int]] = {}
        #: dataset index -> the image's identity (what the cache is keyed by), set by :meth:`run`
        self.keys: dict[int, str] = {}
        #: seconds spent by this process: "maps" (explaining) and each metric label
        self.seconds: dict[str, float] = {}
        #: the recompute paths its maps took (:attr:`BenchResult.memory`)
        self.memory: dict[str, dict[str, Any]] = {}

    def run(self, dataset: Dataset, wanted: dict[str, list[int]], keys: dict[int, str],
            shown: list[int] = ()) -> list[dict[str, Any]]:
        """Process the images that miss maps or a metric value; returns the errors.

        ``wanted`` gives each metric's images (by label), ``keys`` the identity of every image that could be read
        (:func:`~vitexplain.bench.data.identities`: what the cache is keyed by; an image without one is loaded,
        to report why); ``shown`` are images that need maps only (the gallery's).
        """
        self.cache.scan()
        self.keys = keys
        self.wanted = {label: set(indices) for label, indices in wanted.items()}
        needed = sorted(set(shown).union(*self.wanted.values()))
        todo = [i for i in needed if i not in keys or self._missing(i, keys[i])]
        errors: list[dict[str, Any]] = []
        show = self.config.progress and self.where.rank == 0
        with tqdm(total=len(todo), desc=f"{self.model_name} / {self.method.label}", unit="img",
                  disable=not show) as bar:
            for batch in loader(dataset, todo, self.config.batch_size, self.config.num_workers):
                for index, message in batch.failed:
                    errors.append(error_entry(self.model_name, self.method.label, None, [f"#{index}"], message))
                if batch.indices:
                    errors += self._process(batch)
                bar.update(len(batch.indices) + len(batch.failed))
        return errors

    def _missing(self, index: int, key: str) -> bool:
        """Whether the image ``index`` (identity ``key``) misses its maps or a value of a metric that wants it."""
        return key not in self.cache.maps or any(index in self.wanted[label] and key not in store
                                                 for label, store in self.cache.values.items())

    def _targets(self, images: Tensor, labels: Tensor) -> Tensor:
        if self.config.target == "label":
            return labels
        return self.adapter.target(images, None).classes  # the float32 prediction, whatever the precision

    def _eval_batch(self, batch: Batch, maps: Tensor, targets: Tensor, call: Call) -> EvalBatch:
        """The batch as the protocols score it, its forwards those of the :func:`scoring` ``call``."""
        data = batch.data
        mean, std = self.normalisation or (None, None)
        truth = {key: value for key, value in data.items() if key not in NOT_TRUTH}
        explain = reexplainer(call, self.method)
        return EvalBatch(images=data["images"], maps=maps, targets=targets, labels=data["labels"], ids=batch.ids,
                         truth=truth, mean=mean, std=std, randomised=self.method.spec.randomised,
                         **model_fields(call, explain, modifier(self.adapter.model)))

    def _maps(self, batch: Batch) -> tuple[Tensor, Tensor, list[int]]:
        """Maps and targets of the batch (cached or computed, on the device) and the rows computed now."""
        stored = self.cache.maps
        cached = [row for row, key in enumerate(batch.keys) if key in stored]
        fresh = [row for row, key in enumerate(batch.keys) if key not in stored]
        parts = []
        if cached:
            found = stored.read([batch.keys[r] for r in cached], self.where.device)
            parts.append((found["maps"], found["targets"]))
        if fresh:
            images = take(batch.data["images"], fresh)
            targets = self._targets(images, take(batch.data["labels"], fresh))
            with self._timed("maps"), collecting() as decisions:
                parts.append((self.explain(images, targets), targets))
            record_decisions(self.memory, decisions)
        order = torch.tensor(cached + fresh, device=self.where.device).argsort()
        maps = torch.cat([m for m, _ in parts])[order]
        targets = torch.cat([t for _, t in parts])[order]
        return maps, targets, fresh

    @contextlib.contextmanager
    def _timed(self, what: str) -> Iterator[None]:
        """Add the block's seconds to ``what`` and, given the run's findings, its interval to the timeline."""
        started = time.perf_counter()
        try:
            yield
        finally:
            ended = time.perf_counter()
            self.seconds[what] = self.seconds.get(what, 0.0) + ended - started
            if self.work is not None:
                self.work.mark(self.model_name, self.method.label, what, started, ended)

    def _process(self, batch: Batch) -> list[dict[str, Any]]:
        """Maps and metric values of one batch as loaded; its labels are read before it moves to the device."""
        errors = []
        if self.config.target == "label":
            unlabelled = [row for row, label in enumerate(batch.data["labels"].tolist()) if label < 0]
            if unlabelled:
                errors.append(error_entry(self.model_name, self.method.label, None, [batch.ids[r] for r in unlabelled],
                                          "target='label' but the image has no ground-truth label"))
                batch = batch.take([row for row in range(len(batch.indices)) if row not in unlabelled])
                if not batch.indices:
                    return errors
        batch = batch.to(self.where.device)
        try:
            maps, targets, fresh = self._maps(batch)
            check_finite(maps, batch.ids)                       # as the batch's EvalBatch checks them
            self.adapter.check_inputs(batch.data["images"])     # once: the protocols' copies of them are trusted
            if fresh:
                self.cache.maps.write([batch.keys[r] for r in fresh], {"maps": maps[fresh], "targets": targets[fresh]})
        except Exception as error:  # noqa: BLE001 - a method failing on a batch must not lose the rest
            return errors + [error_entry(self.model_name, self.method.label, None, batch.ids, error)]
        with scoring(self.adapter) as call:
            evaluated = self._eval_batch(batch, maps, targets, call)
            for metric in self.metrics:
                store = self.cache.values[metric.label]
                rows = [row for row, (index, key) in enumerate(zip(batch.indices, batch.keys))
                        if index in self.wanted[metric.label] and key not in store]
                if not rows:
                    continue
                part = batch if len(rows) == len(batch.indices) else batch.take(rows)
                try:
                    subset = evaluated if part is batch else self._eval_batch(part, maps[rows], targets[rows], call)
                    with self._timed(metric.label):
                        values = score(metric.metric, subset, metric.options, call=call)
                    store.write(part.keys, values)
                except Exception as error:  # noqa: BLE001 - a metric failing on a batch must not lose the rest
                    errors.append(error_entry(self.model_name, self.method.label, metric.label, part.ids, error))
        return errors

    def shares(self, wanted: dict[str, list[int]]) -> list[Share]:
        """The stored per-image values of each metric's wanted images that have them."""
        found = []
        for metric in self.metrics:
            store = self.cache.values[metric.label]
            done = [i for i in wanted[metric.label] if i in self.keys and self.keys[i] in store]
            values = store.read([self.keys[i] for i in done]) if done else {}
            found.append(Share(self.model_name, self.method.label, metric.label, done, values))
        return found
