"""Running a recipe: plan what the code can run, check data and weights, bench each setting, fill the table.

Order of work, so that nothing is computed when something is missing:

1. plan: rows whose method, columns whose metric and settings whose dataset are not registered in
   this vitexplain (or refuse the recipe's options) are set aside with the reason; their cells say it;
2. check: every model of a setting that can run is loaded (``load_model``'s ``ModelLoadError``) and
   every dataset is opened with its loader (``DatasetNotFoundError`` ...); all problems are gathered
   and raised together as :class:`RecipeInputError`, which lists what to provide and where;
3. run: one :func:`vitexplain.bench.run_benchmark` per setting, all sharing one cache folder, so
   maps computed for one table are reused by another (same model, images, target and options);
4. collect the reported numbers into a :class:`~vitexplain.reproduce.table.ReproducedTable`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ..bench import BenchConfig, BenchResult, MethodEntry, MetricEntry, run_benchmark
from ..datasets import available_datasets
from ..devices import resolve_device
from ..metrics import available_metrics, get_metric
from ..models import ModelLoadError, data_config, load_model, load_text_model
from ..registry import available_methods, get_method
from .data import bench_dataset, check_dataset
from .published import load_published
from .recipe import DATA_INPUTS, MODELS, Setting, TableRecipe, get_recipe
from .table import Cell, ReproducedTable

NOT_IN_PAPER = "the paper has no number in this cell"


class RecipeInputError(ValueError):
    """Data or weights a recipe needs are missing or unreadable; the message lists what to provide and where."""


@dataclass
class SettingPlan:
    """What of one setting the registered code can run.

    Attributes:
        reason: why nothing of the setting can run (its dataset is not registered), else None.
        methods: row label -> bench entry, for the rows that can run.
        metrics: metric label -> bench entry, for the metrics that can run.
        row_reasons, metric_reasons: label -> why that row / metric cannot run.
    """

    setting: Setting
    reason: str | None = None
    methods: dict[str, MethodEntry] = field(default_factory=dict)
    metrics: dict[str, MetricEntry] = field(default_factory=dict)
    row_reasons: dict[str, str] = field(default_factory=dict)
    metric_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def runnable(self) -> bool:
        return self.reason is None and bool(self.methods) and bool(self.metrics)


def _check_overrides(overrides: dict[str, dict[str, Any]], kind: str) -> None:
    """Refuse override options a registered method / metric does not have (typos would silently do nothing)."""
    for name, options in overrides.items():
        if kind == "method" and name in available_methods():
            valid = set(get_method(name).options)
        elif kind == "metric" and name in available_metrics():
            valid = set(get_metric(name).options)
        else:
            continue
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"{kind} {name!r} has no option {', '.join(map(repr, unknown))}")


def plan_recipe(recipe: TableRecipe, method_options: dict[str, dict[str, Any]] | None = None,
                metric_options: dict[str, dict[str, Any]] | None = None) -> list[SettingPlan]:
    """Which rows, metrics and settings of ``recipe`` the registered code can run, with the options they run with.

    ``method_options`` / ``metric_options`` (``{name: {option: value}}``) override the recipe's
    options of every row using that method / metric (a changed protocol: for quick checks and tests).
    """
    method_options, metric_options = method_options or {}, metric_options or {}
    _check_overrides(method_options, "method")
    _check_overrides(metric_options, "metric")
    methods, metrics, datasets = set(available_methods()), set(available_metrics()), set(available_datasets())
    plans = []
    for setting in recipe.settings:
        plan = SettingPlan(setting)
        if setting.data.dataset not in datasets:
            plan.reason = f"dataset {setting.data.dataset!r} is not registered in vitexplain"
        for row in recipe.rows:
            if not setting.covers(row.label):
                continue
            options = {**row.options, **method_options.get(row.method, {})}
            if row.method not in methods:
                plan.row_reasons[row.label] = f"explanation method {row.method!r} is not registered in vitexplain"
                continue
            if MODELS[setting.model].text and "text" not in get_method(row.method).modalities:
                plan.row_reasons[row.label] = f"explanation method {row.method!r} does not explain text in vitexplain"
                continue
            try:
                get_method(row.method).check_options(options)
            except TypeError as error:
                plan.row_reasons[row.label] = str(error)
                continue
            plan.methods[row.label] = MethodEntry(row.method, options, label=row.label)
        for use in setting.metrics:
            if use.name not in metrics:
                plan.metric_reasons[use.label] = f"metric {use.name!r} is not registered in vitexplain"
                continue
            options = {**use.options, **metric_options.get(use.name, {})}
            unknown = sorted(set(options) - set(get_metric(use.name).options))
            if unknown:
                plan.metric_reasons[use.label] = f"metric {use.name!r} has no option {', '.join(map(repr, unknown))}"
                continue
            plan.metrics[use.label] = MetricEntry(use.name, options, label=use.label)
        plans.append(plan)
    return plans


# ------------------------------------------------------------------------------------- models, data

@dataclass
class Loaded:
    """A model ready to run: the module, its timm data config (empty for text) and where it came from."""

    model: nn.Module
    data_config: dict[str, Any]
    source: str


def _load(key: str, override: nn.Module | str | None) -> Loaded:
    """Model ``key`` as the recipe names it, or as the user replaced it (loaded on the CPU: the bench
    moves it to its device); raises ModelLoadError."""
    spec = MODELS[key]
    if isinstance(override, nn.Module):
        if spec.text:
            raise ModelLoadError("a text model is given as its local model directory (with its tokenizer), "
                                 "not an object")
        return Loaded(override.eval(), data_config(override), f"substitute {type(override).__name__} object")
    source = override if override is not None else spec.source
    if source is None:
        raise ModelLoadError("no public weights: give a checkpoint")
    if spec.text:
        try:
            _, model = load_text_model(source)
        except (OSError, ImportError, ValueError) as error:
            raise ModelLoadError(f"cannot load a text classifier from {source}: {error}") from error
        return Loaded(model, {}, str(source))
    card = Path(source).with_suffix(".json").is_file()  # a model card beside a checkpoint names its architecture
    model, config = load_model(str(source), arch=None if card else spec.arch, device="cpu")
    return Loaded(model, config, str(source))


def _model_problem(key: str, error: Exception) -> str:
    spec = MODELS[key]
    given = f"timm name {spec.source} (downloaded, or from the cache offline) or a checkpoint" if spec.source else \
        "a model directory" if spec.text else "a checkpoint"
    return (f"model {key}: {spec.description}. {error}\n    provide {given}: --model {key}=PATH_OR_NAME "
            f"(a checkpoint of timm architecture {spec.arch}, or with a model card beside it); "
            f"python: models={{'{key}': path, name or nn.Module}}")


def _data_problem(key: str, error: str | None) -> str:
    item = DATA_INPUTS[key]
    head = f"{item.flag} PATH: {item.description}; python: data={{'{key}': PATH}}"
    return head if error is None else f"{head}\n" + "\n".join(f"      {line}" for line in error.splitlines())


def prepare(recipe: TableRecipe, plans: list[SettingPlan], data: dict[str, Any],
            models: dict[str, Any]) -> dict[str, Loaded]:
    """Load the models of the runnable settings and check their datasets; raise RecipeInputError listing every
    problem."""
    problems, loaded = [], {}
    runnable = [plan.setting for plan in plans if plan.runnable]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model key(s) {', '.join(map(repr, unknown))}; valid: {', '.join(MODELS)}")
    for key in dict.fromkeys(setting.model for setting in runnable):
        try:
            loaded[key] = _load(key, models.get(key))
        except ModelLoadError as error:
            problems.append(_model_problem(key, error))
    for setting in runnable:
        spec, root = setting.data, data.get(setting.data.input)
        if root is None:
            problem = _data_problem(spec.input, None)
        else:
            indices = data.get(spec.indices_input) if spec.indices_input else None
            if spec.preprocess == "tokenizer" and setting.model not in loaded:
                continue  # the text loader needs the model's tokenizer; the model's problem is listed
            tokenizer = loaded[setting.model].source if spec.preprocess == "tokenizer" else None
            error = check_dataset(spec, root, indices, tokenizer)
            problem = None if error is None else _data_problem(spec.input, error)
        if problem and problem not in problems:
            problems.append(problem)
    if problems:
        raise RecipeInputError(f"{recipe.name} cannot start; provide:\n" + "\n".join(f"  - {p}" for p in problems))
    return loaded


# ----------------------------------------------------------------------------------------- running

def _describe_options(options: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in options.items())


def _setup_line(plan: SettingPlan, source: str, root: Any, result: BenchResult | None) -> str:
    setting = plan.setting
    per_model = result.images.get(setting.model, {}) if result else {}
    counts = [n for per_metric in per_model.values() for n in per_metric.values()]
    metrics = "; ".join(f"{entry.name}({_describe_options(entry.options)})" for entry in plan.metrics.values())
    return (f"{setting.key}: model {setting.model} = {source}; data {setting.data.dataset} from {root} "
            f"({max(counts, default=0)} images evaluated, the paper: {setting.data.size:,}); "
            f"target: {'ground-truth label' if setting.target == 'label' else 'predicted class'}; metrics: {metrics}")


def _cell(recipe: TableRecipe, plans: dict[str, SettingPlan], results: dict[str, BenchResult], row: str, column,
          published: float | None, source: str) -> Cell:
    cell = Cell(row, column.key, None, published, source)
    setting = recipe.setting_for(row, column)
    if setting is None:
        cell.reason = NOT_IN_PAPER
        return cell
    plan = plans[setting.key]
    reason = plan.reason or plan.row_reasons.get(row) or plan.metric_reasons.get(column.metric)
    if reason:
        cell.reason = f"not run: {reason}"
        return cell
    result = results[setting.key]
    numbers = result.scores.get(setting.model, {}).get(row, {}).get(column.metric, {})
    cell.reproduced = numbers.get(column.number)
    threshold = numbers.get(f"{column.number}_threshold")       # the segmentation threshold chosen for this number
    if threshold is not None:
        cell.note = f"binarised at threshold {threshold:g}"
    cell.images = result.images.get(setting.model, {}).get(row, {}).get(column.metric, 0)
    errors = [e for e in result.errors
              if e["model"] in ("", setting.model) and e["method"] in ("", row)     # "": a protocol refused for all
              and e["metric"] in (None, column.metric)]
    cell.failed = sum(len(e["images"]) for e in errors)
    if cell.reproduced is None:
        cell.reason = f"failed: {errors[0]['error']}" if errors else f"the metric reported no {column.number!r}"
    return cell


def run_recipe(name: str, *, data: dict[str, Any] | None = None, models: dict[str, nn.Module | str] | None = None,
               output_dir: str | Path = "vitexplain-reproduce", device: str | None = None, precision: str = "float32",
               batch_size: int = 16,
               limit: int | None = None, method_options: dict[str, dict[str, Any]] | None = None,
               metric_options: dict[str, dict[str, Any]] | None = None, num_workers: int = 0,
               progress: bool = True, force: bool = False) -> ReproducedTable:
    """Reproduce one published table and write it as Markdown, CSV, HTML and JSON.

    Args:
        name: a recipe (see :func:`vitexplain.reproduce.available_recipes`).
        data: input key -> path (``imagenet_seg``, ``imagenet``, ``cifar10``, ``cifar100``, ``voc``,
            ``movie_reviews``, optional ``tis_indices``); see :data:`~vitexplain.reproduce.recipe.DATA_INPUTS`.
        models: model key -> an ``nn.Module``, a timm name or a checkpoint path, replacing the
            recipe's model (required for models without public weights).
        output_dir: ``<output_dir>/<name>/table.{md,csv,html,json}``; the bench's cache and reports
            in ``<output_dir>/bench`` (shared by all recipes, so a rerun resumes and tables share maps).
        device: ``cpu``, ``cuda`` ... (default: CUDA when available; under ``torchrun`` each process
            takes the GPU of its local rank, as in the bench); checked first (:func:`vitexplain.models.resolve_device`).
        precision: what the models run in (the bench's ``precision``: ``float32``, the papers', ``tf32``,
            ``bfloat16``, ``float16``); a precision other than float32 is recorded as a deviation.
        batch_size: images per batch.
        limit: evaluate a seeded random subset of this many images per setting instead of the
            recipe's (a changed protocol).
        method_options, metric_options: ``{method or metric name: {option: value}}`` overriding the
            recipe's protocol (quick checks, tests); recorded as deviations.
        num_workers: DataLoader workers; progress: show progress bars.
        force: let the bench replace the files of a ``<output_dir>/bench`` folder vitexplain did not make (the
            bench's ``force``).

    Raises:
        RecipeInputError: before any computation, listing every missing or unreadable input.
    """
    recipe = get_recipe(name)
    device = resolve_device(device)  # before any model or data is read
    published = load_published(recipe)
    data, models = dict(data or {}), dict(models or {})
    unknown = sorted(set(data) - set(DATA_INPUTS))
    if unknown:
        raise ValueError(f"unknown data input(s) {', '.join(unknown)}; valid: {', '.join(DATA_INPUTS)}")
    plans = plan_recipe(recipe, method_options, metric_options)
    loaded = prepare(recipe, plans, data, models)

    output_dir = Path(output_dir)
    results: dict[str, BenchResult] = {}
    setup = []
    for plan in plans:
        setting = plan.setting
        if not plan.runnable:
            setup.append(f"{setting.key}: not run ({plan.reason or 'no registered method or metric'})")
            continue
        model = loaded[setting.model]
        root = data[setting.data.input]
        indices = data.get(setting.data.indices_input) if setting.data.indices_input else None
        subset = None if indices is not None else setting.data.subset
        chosen = [n for n in (subset, limit) if n]
        results[setting.key] = run_benchmark(BenchConfig(
            models={setting.model: model.model}, methods=list(plan.methods.values()),
            metrics=list(plan.metrics.values()),
            dataset=bench_dataset(setting.data, root, indices, model.data_config, model.source), batch_size=batch_size,
            output_dir=output_dir / "bench", device=str(device), precision=precision, seed=recipe.seed,
            limit=min(chosen) if chosen else None,
            target=setting.target, num_workers=num_workers, progress=progress, gallery=0, force=force))
        setup.append(_setup_line(plan, model.source, root, results[setting.key]))

    by_key = {plan.setting.key: plan for plan in plans}
    cells = {(row.label, column.key): _cell(recipe, by_key, results, row.label, column,
                                            published.values[row.label, column.key], published.source_of(row.label))
             for row in recipe.rows for column in recipe.columns}
    deviations = [f"limit: {limit} images per setting"] if limit else []
    if precision != "float32":
        deviations.append(f"precision: the models ran in {precision} (the papers: float32)")
    deviations += [f"method {n} options {_describe_options(o)}" for n, o in (method_options or {}).items()]
    deviations += [f"metric {n} options {_describe_options(o)}" for n, o in (metric_options or {}).items()]
    deviations += [f"model {key} ({MODELS[key].source}) replaced by {loaded[key].source}"
                   for key in models if key in loaded and MODELS[key].source is not None]
    table = ReproducedTable(recipe.name, recipe.paper, recipe.title, published.decimals,
                            [row.label for row in recipe.rows],
                            [(column.key, column.header) for column in recipe.columns], cells, setup,
                            list(recipe.notes), deviations, [e for r in results.values() for e in r.errors])
    table.write(output_dir / recipe.name)
    return table
