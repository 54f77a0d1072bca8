"""What a benchmark run is: models x methods x metrics on one dataset, from Python, YAML or CLI flags.

A config is checked whole when it is made: every key's type (a wrong one is a one-line error naming the
key: ``output_dir must be a folder path, got 5``), names, labels, and every method's and metric's option
values (against their annotated types), so a mistake stops the run before any work, not at the first
batch.
"""
from __future__ import annotations

import math
import os
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..metrics import available_metrics, get_metric
from ..metrics.base import BoundMetric
from ..options import PRECISIONS, scale_pixels, seeded
from ..registry import BoundMethod, available_methods, get_method

TARGETS = ("predicted", "label")

#: the standard deviation of the multiplicative weight noise of a noisy copy when none is given: MetaQuantus's
#: minor model perturbation ("Model Resilience Test": weights times N(1, 0.001), docs/decisions/metric-trust.md)
MINOR_WEIGHT_NOISE = 0.001


@dataclass
class ModelEntry:
    """One model to benchmark.

    Attributes:
        name: how the model is named in tables and in the cache.
        source: what :func:`vitexplain.models.load_model` loads (shipped name, timm name or checkpoint
            file; default ``name``), or a model object.
        arch: timm architecture of a checkpoint file.
        noise_of: makes this entry a noisy copy of the run's model of that name: loaded as it is, then every
            floating parameter multiplied by ``1 + weight_noise * N(0, 1)``. The run then says, beside each
            number of the original, whether the metric keeps its scores and its ranking of the methods
            under this minor perturbation (noise resilience, docs/decisions/metric-trust.md). Doubles the
            run's cost, so opt-in.
        weight_noise: the noise's standard deviation (default :data:`MINOR_WEIGHT_NOISE`); 0 gives an identical
            copy. Only with ``noise_of``.
        seed: seeds the noise (a CPU generator: the same copy on every device); default the run's seed. Only
            with ``noise_of``.
    """

    name: str
    source: str | nn.Module | None = None
    arch: str | None = None
    noise_of: str | None = None
    weight_noise: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_type("a model's name", self.name, str, "a text")
        _check_type(f"model {self.name!r}: source", self.source, (str, os.PathLike, nn.Module, type(None)),
                    "a model name, a checkpoint path or a model object")
        for key in ("arch", "noise_of"):
            _check_type(f"model {self.name!r}: {key}", getattr(self, key), (str, type(None)), "a name (text)")
        if self.noise_of is None:
            if self.weight_noise is not None or self.seed is not None:
                raise ValueError(f"model {self.name!r}: weight_noise and seed belong to a noisy copy; name the "
                                 "model it copies with noise_of")
            return
        if self.source is not None or self.arch is not None:
            raise ValueError(f"model {self.name!r} is a noisy copy of {self.noise_of!r}: it loads what that model "
                             "loads, so it takes no source or arch")
        if self.weight_noise is None:
            self.weight_noise = MINOR_WEIGHT_NOISE
        if (isinstance(self.weight_noise, bool) or not isinstance(self.weight_noise, (int, float))
                or not math.isfinite(self.weight_noise) or self.weight_noise < 0):
            raise ValueError(f"model {self.name!r}: weight_noise must be a finite number >= 0, got "
                             f"{self.weight_noise!r}")
        self.weight_noise = float(self.weight_noise)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise TypeError(f"model {self.name!r}: seed must be an integer, got {self.seed!r}")


@dataclass
class MethodEntry:
    """One explanation method with its options; ``label`` names its row (default: name and options)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str | None = None

    def __post_init__(self) -> None:
        _check_type("a method's name", self.name, str, "a text")
        _check_type(f"method {self.name!r}: label", self.label, (str, type(None)), "a text")
        _check_options_mapping(self.name, self.options)
        if self.label is None:
            given = ", ".join(f"{key}={value}" for key, value in sorted(self.options.items()))
            self.label = f"{self.name}({given})" if given else self.name
        #: the method resolved and its options checked, once, here (:meth:`~vitexplain.registry.MethodSpec.bind`)
        self.bound = get_method(self.name).bind(self.options, label=self.label)


@dataclass
class MetricEntry:
    """One evaluation protocol with its options; ``label`` names its columns (default: name).

    ``dataset`` evaluates this metric on another dataset than the run's (e.g. the two-digit canvases
    of the class-sensitivity test); ``limit`` evaluates it on a random subset of that many of the
    run's images (drawn with the run's seed, so a smaller limit picks a subset of a larger one), for
    protocols too costly for every image. Both default to the run's.
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    dataset: Any = None
    limit: int | None = None

    def __post_init__(self) -> None:
        _check_type("a metric's name", self.name, str, "a text")
        _check_type(f"metric {self.name!r}: label", self.label, (str, type(None)), "a text")
        _check_options_mapping(self.name, self.options)
        if self.label is None:
            self.label = self.name
        #: the protocol resolved and its options checked, once, here (:meth:`~vitexplain.metrics.base.Metric.bind`)
        self.bound = get_metric(self.name).bind(self.options, label=self.label)
        if self.dataset is not None:
            self.dataset = _dataset(self.dataset, f"metric {self.name!r}: dataset")
        _check_count(f"metric {self.name!r}: limit", self.limit)


#: the protocol the ``sanity`` key runs (:mod:`vitexplain.metrics.model_randomisation`), and the label its entry
#: has in the run (its errors, seconds and timeline phase)
SANITY_METRIC, SANITY_LABEL = "model_randomisation", "sanity"


@dataclass
class SanityCheck:
    """The model-randomisation check of :mod:`vitexplain.bench.randomisation` (Adebayo et al., NeurIPS 2018): the
    ``sanity`` key of a config, run as the registered protocol ``model_randomisation`` entry :attr:`entry`
    (labelled ``sanity``, ``limit`` = :attr:`images`) on the methods it checks, its verdict in the reports'
    sanity section (docs/decisions/default-bench.md).

    Attributes:
        images: on how many of the run's images it runs, drawn as a protocol's ``limit`` draws them (a seeded
            subset; a smaller limit picks a subset of a larger one); at least 2 (a deterministic method's noise
            floor compares two images' maps), and more to decide: the verdict is a bootstrap interval over
            these images.
        methods: labels of the methods to check (default: all of the run's).
    """

    images: int = 8
    methods: list[str] | None = None

    def __post_init__(self) -> None:
        _check_count("sanity: images", self.images)
        if self.methods is not None:
            self.methods = _texts(self.methods, "sanity: methods")
        if self.images < 2:
            raise ValueError(f"the sanity check needs at least 2 images (its noise floor compares two images' maps), "
                             f"got {self.images}")

    @property
    def entry(self) -> MetricEntry:
        """The protocol entry the check runs as."""
        return MetricEntry(SANITY_METRIC, label=SANITY_LABEL, limit=self.images)

    def checks(self, label: str) -> bool:
        """Whether the check runs on the method labelled ``label``."""
        return self.methods is None or label in self.methods


@dataclass
class ModelBinding:
    """What :meth:`BenchConfig.bind_for` finds for one model: each method and metric as it runs there, by label, and
    the pixel scalings in words (empty without ``pixels_at``, or when nothing changed)."""

    methods: dict[str, BoundMethod]
    metrics: dict[str, BoundMetric]
    scalings: list[str]
    #: the sanity check's protocol as it runs there (None without the check)
    sanity: BoundMetric | None = None

    def scaled(self, label: str, fn, options: dict[str, Any], ratio: float | None) -> dict[str, Any]:
        """``options`` scaled by ``ratio`` (:func:`vitexplain.options.scale_pixels`; none when None), the changes
        added to :attr:`scalings` under ``label``."""
        if ratio is None:
            return options
        options, changes = scale_pixels(fn, options, ratio)
        if changes:
            self.scalings.append(f"{label}: {', '.join(changes)}")
        return options


@dataclass
class DatasetSpec:
    """A dataset from the :func:`vitexplain.datasets.get_dataset` registry."""

    name: str
    root: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_type("dataset: name", self.name, str, "a registered dataset's name (text)")
        _check_type(f"dataset {self.name!r}: root", self.root, (str, os.PathLike, type(None)), "a folder path")
        _check_type(f"dataset {self.name!r}: options", self.options, dict, "a mapping of option names to values")


@dataclass
class BenchConfig:
    """A benchmark run.

    Attributes:
        models: names / checkpoint paths, :class:`ModelEntry`, dicts ``{name, source, arch}`` (or
            ``{name, noise_of, weight_noise, seed}``: a noisy copy of another model, for noise resilience), or a
            mapping ``{name: model object or source}``.
        methods: method names, :class:`MethodEntry` or dicts ``{name, options, label}``; the name ``all``
            stands for every registered image method (controls included) that no other entry names, so a
            new method joins a config that says ``all`` without an edit (entries name a method's options).
        metrics: metric names, :class:`MetricEntry` or dicts ``{name, options, label}``; ``all`` as for
            methods (every registered metric no other entry names).
        exclude_methods, exclude_metrics: names that ``all`` leaves out.
        dataset: a :class:`DatasetSpec` (or dict) or a torch Dataset of dict samples.
        batch_size: images per batch.
        output_dir: where the cache, the per-image values and the reports go.
        device: ``cpu``, ``cuda``, ``cuda:1`` ... (default: CUDA when available). Under ``torchrun``
            each process takes the GPU of its local rank.
        precision: what the models run in: ``float32`` (the papers'), ``tf32`` (TF32 products and
            convolutions), ``bfloat16`` or ``float16`` (autocast). Explanations keep computing in float32;
            the forwards that only score inputs (sampling methods, perturbation metrics) take it
            (docs/decisions/precision.md). Cached separately per precision.
        seed: seeds the image subset drawn by ``limit`` and is the ``seed`` option of randomised
            methods and metrics that are not given one.
        limit: benchmark a random subset of this many images (drawn with ``seed``), or all when None.
        target: the class explained: each image's ``predicted`` class, or its ground-truth ``label``.
        num_workers: DataLoader worker processes.
        progress: show tqdm progress bars.
        gallery: how many images report.html shows with every method's overlay (0: no gallery).
        sanity: options of the model-randomisation check (a :class:`SanityCheck` or its dict), or
            None to skip it.
        notes: lines shown at the top of the reports (e.g. why a setting differs from a paper's).
        highlight: labels of the methods the reports' curves draw in colour (the others grey, the
            controls dashed); empty: every method in colour.
        plugins: plug-ins imported before anything else is read: ``.py`` files (in a YAML file, relative
            to its folder) or module names, registering methods, metrics, datasets or model families
            (:mod:`vitexplain.plugins`).
        pixels_at: the side, in pixels, of the images the config's options that count pixels are written for (LATEC's
            224); each model's are then scaled to its input size (lengths such as occlusion's window by the ratio of
            the sides, pixel counts such as faithfulness correlation's subset by its square, the defaults of the
            options a config does not give included: :func:`vitexplain.options.scale_pixels`), and the reports' notes
            say what each became. None: options are used as written.
        ranks: add LATEC's view to the reports: each method's mean rank over the numbers of each kind of protocol, with
            its bootstrap interval (:mod:`vitexplain.bench.ranks`); changes no score.
        force: write into ``output_dir`` even when vitexplain did not make it and it holds files the bench writes
            (results.json, report.html ...: they are replaced, and a warning names them). Without it such a folder
            is refused; a folder a bench made (its marker file, :mod:`vitexplain.output_folders`), an empty or new
            one, or one holding only other files is written into. Changes no result.
    """

    models: Any
    methods: Any
    metrics: Any
    dataset: Any
    exclude_methods: Any = ()
    exclude_metrics: Any = ()
    batch_size: int = 16
    output_dir: str | Path = "vitexplain-bench"
    device: str | None = None
    precision: str = "float32"
    seed: int = 0
    limit: int | None = None
    target: str = "predicted"
    num_workers: int = 0
    progress: bool = True
    gallery: int = 4
    sanity: Any = None
    notes: Any = ()
    highlight: Any = ()
    plugins: Any = ()
    force: bool = False
    ranks: bool = False
    pixels_at: int | None = None

    def __post_init__(self) -> None:
        from ..plugins import load_plugins

        self.plugins = _texts(self.plugins, "plugins")
        load_plugins(self.plugins)
        self.models = _models(self.models)
        self.models = _check_copies(self.models, self.seed)
        self.methods = _entries(MethodEntry, self.methods, "methods", self.exclude_methods,
                                lambda: available_methods("image"))
        if isinstance(self.sanity, dict):
            valid = sorted(f.name for f in fields(SanityCheck))
            unknown = sorted(set(self.sanity) - set(valid))
            if unknown:
                raise ValueError(f"unknown sanity option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
            self.sanity = SanityCheck(**self.sanity)
        elif self.sanity is not None and not isinstance(self.sanity, SanityCheck):
            raise TypeError("sanity must be a mapping of SanityCheck options or None, got "
                            f"{type(self.sanity).__name__}")
        # with the sanity key, its protocol is named: "all" does not run it a second time as a column of the tables
        self.metrics = _entries(MetricEntry, self.metrics, "metrics", self.exclude_metrics, available_metrics,
                                () if self.sanity is None else (SANITY_METRIC,))
        self.dataset = _dataset(self.dataset)
        _check_type("output_dir", self.output_dir, (str, os.PathLike), "a folder path")
        self.output_dir = Path(self.output_dir)
        _check_type("device", self.device, (str, torch.device, type(None)), "a device (cpu, cuda, cuda:1 ...) or null")
        _check_type("progress", self.progress, bool, "true or false")
        self.notes = _texts(self.notes, "notes")
        self.highlight = _texts(self.highlight, "highlight")
        for what, entries in (("model", self.models), ("method", self.methods), ("metric", self.metrics)):
            names = [entry.name if what == "model" else entry.label for entry in entries]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"two {what}s are named {duplicates[0]!r}; give them distinct labels")
        if self.sanity is not None and SANITY_LABEL in [entry.label for entry in self.metrics]:
            raise ValueError(f"a metric is labelled {SANITY_LABEL!r}, the label of the sanity check's entry; give it "
                             "another label")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for name in ("batch_size", "limit", "num_workers", "seed", "gallery"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        for name in ("force", "ranks"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")
        _check_count("pixels_at", self.pixels_at)
        if (self.batch_size < 1 or (self.limit is not None and self.limit < 1) or self.num_workers < 0
                or self.gallery < 0):
            raise ValueError("batch_size and limit must be positive, num_workers and gallery not negative")
        labels = [entry.label for entry in self.methods]
        for what, named in (("sanity", [] if self.sanity is None else self.sanity.methods or []),
                            ("highlight", self.highlight)):
            unknown = [label for label in named if label not in labels]
            if unknown:
                raise ValueError(f"{what} names method(s) {', '.join(map(repr, unknown))} that this run does not have")

    def bind_for(self, input_size: tuple[int, int]) -> ModelBinding:
        """Each method and metric as it runs on a model of ``input_size`` (height, width) pixels: the entry's (a
        metric's defaults filled in), with ``pixels_at`` the options that count pixels scaled to the model's input,
        and the run's seed for a randomised one given none (:func:`~vitexplain.options.seeded`, the one rule)."""
        ratio = None if self.pixels_at is None else math.sqrt(input_size[0] * input_size[1]) / self.pixels_at
        found = ModelBinding({}, {}, [])
        for entry in self.methods:
            spec = entry.bound.spec
            options = found.scaled(entry.label, spec.fn, seeded(spec.options, entry.options, self.seed), ratio)
            found.methods[entry.label] = replace(entry.bound, options=options)
        for entry in self.metrics:
            metric = entry.bound.metric
            options = {**metric.options, **seeded(metric.options, entry.options, self.seed)}
            found.metrics[entry.label] = replace(entry.bound, options=found.scaled(entry.label, metric.compute,
                                                                                  options, ratio))
        if self.sanity is not None:
            bound = self.sanity.entry.bound
            found.sanity = replace(bound, options={**bound.metric.options,
                                                   **seeded(bound.metric.options, bound.options, self.seed)})
        if found.scalings:
            found.scalings.insert(0, f"options that count pixels, written for {self.pixels_at} px images, scaled to "
                                     f"the model's {input_size[0]} × {input_size[1]} px")
        return found

    def limit_of(self, metric: MetricEntry) -> int | None:
        """How many images ``metric`` is evaluated on: its own limit, else the run's; never more than the run's
        (``--limit 2`` runs every protocol on at most 2 images, whatever the config gives one)."""
        if metric.limit is None or self.limit is None:
            return self.limit if metric.limit is None else metric.limit
        return min(metric.limit, self.limit)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchConfig:
        """A config from plain data (what a YAML file holds); unknown keys are refused."""
        if not isinstance(data, dict):
            raise TypeError(f"a bench config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown bench config key(s) {', '.join(unknown)}; valid keys: "
                             f"{', '.join(sorted(known))}")
        missing = sorted(name for name in ("models", "methods", "metrics", "dataset") if name not in data)
        if missing:
            raise ValueError(f"the bench config lacks {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> BenchConfig:
        """A config from a YAML file with the keys of :class:`BenchConfig`; errors name the file."""
        data = read_config(path)
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as error:
            raise type(error)(f"{path}: {error}") from error


#: the configs shipped with vitexplain, by the name ``--config`` takes: ``default`` (what ``vitexplain bench`` runs),
#: ``latec`` (LATEC's methods and protocols on the digits data) ...: ``vitexplain/bench/<name>_digits.yaml``
SHIPPED_CONFIGS = {path.name.removesuffix("_digits.yaml"): path
                   for path in sorted(Path(__file__).parent.glob("*_digits.yaml"))}


def config_path(name: str | Path) -> Path:
    """The file a config is read from: a shipped config's name (:data:`SHIPPED_CONFIGS`) unless a file of that name
    exists, else the path itself."""
    if isinstance(name, str) and name in SHIPPED_CONFIGS and not Path(name).exists():
        return SHIPPED_CONFIGS[name]
    return Path(name)


def read_config(path: str | Path) -> dict[str, Any]:
    """The mapping a bench config file holds (empty for an empty file), its plug-in files as seen from its folder;
    ``path`` may name a shipped config (:func:`config_path`)."""
    path = config_path(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a bench config must be a mapping of BenchConfig keys, got {type(data).__name__}")
    if data.get("plugins"):
        try:
            plugins = _texts(data["plugins"], "plugins")
        except TypeError as error:
            raise TypeError(f"{path}: {error}") from None
        data["plugins"] = [_beside(path, plugin) for plugin in plugins]
    return data


def read_yaml(path: str | Path) -> Any:
    """The content of a YAML file (None when empty); invalid YAML raises one line naming file:line:column."""
    import yaml

    if not Path(path).is_file():
        raise ValueError(f"config file {path} {'is a folder' if Path(path).is_dir() else 'not found'}; name a YAML "
                         f"file of BenchConfig keys, or a shipped config: {', '.join(SHIPPED_CONFIGS)}")
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = " ".join(part for part in (getattr(error, "problem", None), getattr(error, "context", None)) if part)
        raise ValueError(f"{where}: invalid YAML: {problem or error}") from None


def _beside(config: str | Path, plugin: Any) -> str:
    """A plug-in a YAML file names: a relative file path as seen from the file's folder; a module name as it is."""
    from ..plugins import is_file_plugin

    path = Path(str(plugin)).expanduser()
    return str(Path(config).parent / path) if is_file_plugin(str(plugin)) and not path.is_absolute() else str(plugin)


def _check_options_mapping(name: str, options: Any) -> None:
    if not isinstance(options, dict):
        raise TypeError(f"the options of {name!r} must be a mapping of option names to values, got {options!r}")


def _check_count(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_type(what: str, value: Any, kinds: type | tuple[type, ...], expected: str) -> None:
    """Refuse a value of a wrong type in one line that names its key: ``WHAT must be EXPECTED, got VALUE``."""
    if not isinstance(value, kinds):
        raise TypeError(f"{what} must be {expected}, got {reprlib.repr(value)}")


def _texts(value: Any, what: str) -> list[str]:
    """A key that takes a text or a list of them, as a list (an item YAML read as a number is kept as its text)."""
    if isinstance(value, (str, os.PathLike)):
        return [str(value)]
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(item, (str, os.PathLike, int, float))
                                                               for item in value):
        return [str(item) for item in value]
    raise TypeError(f"{what} must be a text or a list of texts, got {reprlib.repr(value)}")


def _as_list(value: Any, what: str) -> list:
    if isinstance(value, (str, dict, nn.Module, MethodEntry, MetricEntry, ModelEntry)):
        items = [value]
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        raise TypeError(f"{what} must be a name, a mapping or a list of them, got {reprlib.repr(value)}")
    if not items:
        raise ValueError(f"the bench config names no {what}")
    return items


def _entries(kind: type, value: Any, what: str, excluded: Any, registered, named_elsewhere: Iterable[str] = ()) -> list:
    """The entries of ``value``, its ``all`` expanded to every registered name no other entry names, in
    registry order, but the ``excluded`` ones (which must be registered names) and those ``named_elsewhere`` (the
    sanity key's protocol)."""
    excluded = _texts(excluded, f"exclude_{what}")
    unknown = sorted(set(excluded) - set(registered()))
    if unknown:
        raise ValueError(f"exclude_{what} names {', '.join(map(repr, unknown))}, which are not registered {what}")
    items = _as_list(value, what)
    explicit = [_entry(kind, item, what) for item in items if item != "all"]
    if "all" not in items:
        return explicit
    named = {entry.name for entry in explicit} | set(excluded) | set(named_elsewhere)
    expanded = [kind(name) for name in registered() if name not in named]
    at = items.index("all")
    return explicit[:at] + expanded + explicit[at:]


def _entry(kind: type, item: Any, what: str):
    if isinstance(item, kind):
        return item
    if isinstance(item, str):
        return kind(item)
    if isinstance(item, dict):
        valid = {f.name for f in fields(kind)}
        unknown = sorted(set(item) - valid)
        if unknown or "name" not in item:
            raise ValueError(f"each entry of {what} needs 'name' and may have {sorted(valid - {'name'})}; got "
                             f"{sorted(item)}")
        return kind(**item)
    raise TypeError(f"an entry of {what} must be a name or a mapping, got {type(item).__name__}")


def _models(value: Any) -> list[ModelEntry]:
    if isinstance(value, dict) and "name" not in value:
        return [ModelEntry(str(name), source) for name, source in value.items()]
    entries = []
    for item in _as_list(value, "models"):
        if isinstance(item, nn.Module):
            raise TypeError("a model object needs a name: pass models={'name': model} or ModelEntry(name, model)")
        entries.append(_entry(ModelEntry, item, "models"))
    return entries


def _check_copies(models: list[ModelEntry], seed: int) -> list[ModelEntry]:
    """The models, each noisy copy checked: it names another model of the run that is not a copy, at most one copy
    per model (its trust record is one comparison); a copy without a seed takes the run's (in a new entry: the
    caller's is left as it was)."""
    names = [entry.name for entry in models]
    originals = [entry.noise_of for entry in models if entry.noise_of is not None]
    for entry in models:
        if entry.noise_of is None:
            continue
        original = next((other for other in models if other.name == entry.noise_of), None)
        if original is None or original is entry:
            raise ValueError(f"model {entry.name!r} is a noisy copy of {entry.noise_of!r}, which is not another model "
                             f"of this run ({', '.join(map(repr, names))})")
        if original.noise_of is not None:
            raise ValueError(f"model {entry.name!r} copies {original.name!r}, itself a noisy copy; name the original")
        if originals.count(entry.noise_of) > 1:
            raise ValueError(f"model {entry.noise_of!r} has more than one noisy copy; give it one")
    return [replace(entry, seed=seed) if entry.noise_of is not None and entry.seed is None else entry
            for entry in models]


def _dataset(value: Any, what: str = "dataset") -> DatasetSpec | Dataset:
    if isinstance(value, (DatasetSpec, Dataset)):
        return value
    if isinstance(value, str):
        return DatasetSpec(value)
    if isinstance(value, dict):
        return _entry(DatasetSpec, value, "dataset")
    raise TypeError(f"{what} must be a dataset name, a mapping or a torch Dataset, got {reprlib.repr(value)}")
