"""What a benchmark found: per-image values reduced to the reported numbers, tables and ranks of them."""
from __future__ import annotations

import math
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from ..metrics import get_metric
from ..registry import METHODS
from .config import DatasetSpec
from .tables import Ranking, Table, ranking_markdown, ranking_text, sanity_markdown, sanity_text, score_markdown, score_text


@dataclass
class Share:
    """Per-image values of one (model, method, metric) for some images (one process's share)."""

    model: str
    method: str
    metric: str
    indices: list[int]
    values: dict[str, Tensor]


@dataclass
class Gallery:
    """A few images of one model with every method's map, for the overlays of report.html.

    Attributes:
        model: the model's name.
        ids: image ids.
        images: the images for display, [G, H, W, 3] in [0, 1] (preprocessing undone).
        labels: ground-truth class per image (-1 when unknown).
        predicted: the model's top-1 class per image, and ``probability`` its softmax probability.
        class_names: readable name of every class index.
        maps: method label -> its maps of the images [G, h, w] (None when they could not be made).
        top5: per image, the five most probable classes with their probabilities.
        grid: the model's patch grid (h, w), to read token-level maps by token.
    """

    model: str
    ids: list[str]
    images: Tensor
    labels: list[int]
    predicted: list[int]
    probability: list[float]
    class_names: list[str]
    maps: dict[str, Tensor | None]
    top5: list[list[tuple[int, float]]] = field(default_factory=list)
    grid: tuple[int, ...] | None = None


@dataclass
class BenchResult:
    """What a benchmark found.

    Attributes:
        dataset: the dataset's name.
        scores: model -> method -> metric label -> reported number -> value.
        images: model -> method -> metric label -> how many images the numbers are reduced from.
        curves: model -> metric label -> per-image value with steps -> method -> its mean over the images.
        higher_is_better: metric label (in config order) -> reported number -> whether higher is better.
        errors: one entry per failed item: model, method, metric (None for loading/explaining), image ids, error.
        settings: what was run: target, seed, limit, and the options (and own dataset and limit) of
            every method and metric.
        files: the report files written, by kind.
        sanity: model -> the model-randomisation check (:mod:`vitexplain.bench.sanity`): ``levels``,
            ``images``, ``threshold`` and per method ``correlation`` (mean per level) and ``flagged``.
        notes: the config's notes, shown at the top of the reports.
        seconds: wall time of the run that wrote the reports (a resumed run counts its own work only).
        timings: model -> method -> seconds this run spent on its ``maps``, on each metric label and on
            the ``sanity`` check (all processes added up).
        galleries: images and maps for report.html's overlays (not in results.json).
    """

    dataset: str
    scores: dict[str, dict[str, dict[str, dict[str, float]]]]
    images: dict[str, dict[str, dict[str, int]]]
    curves: dict[str, dict[str, dict[str, dict[str, list[float]]]]]
    higher_is_better: dict[str, dict[str, bool]]
    errors: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    sanity: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    galleries: list[Gallery] = field(default_factory=list, repr=False)

    def columns(self, model: str) -> list[tuple[str, str, str]]:
        """(metric label, number, header) of the model's table, metrics in config order."""
        pairs = []
        for label in self.higher_is_better:
            for per_metric in self.scores[model].values():
                pairs += [(label, number) for number in per_metric.get(label, {}) if (label, number) not in pairs]
        names = Counter(number for _, number in pairs)
        return [(label, number, number if names[number] == 1 else f"{label}/{number}") for label, number in pairs]

    @property
    def precision(self) -> str:
        """What the models ran in (``float32`` for results written before precisions existed)."""
        return self.settings.get("precision", "float32")

    @property
    def highlight(self) -> list[str]:
        """Labels of the methods the curves draw in colour (the config's ``highlight``)."""
        return list(self.settings.get("highlight", []))

    def controls(self, model: str) -> set[str]:
        """The model's rows whose method is a control (registered with ``control=True``)."""
        names = {label: entry.get("name") for label, entry in self.settings.get("methods", {}).items()}
        return {m for m in self.scores.get(model, {}) if names.get(m) in METHODS and METHODS.get(names[m]).control}

    def table(self, model: str) -> Table:
        """The model's table; control methods never count as best."""
        columns = self.columns(model)
        better = [self.higher_is_better.get(label, {}).get(number) for label, number, _ in columns]
        methods = list(self.scores[model])
        controls = self.controls(model)
        values = [[self.scores[model][m].get(label, {}).get(number) for label, number, _ in columns] for m in methods]
        best = [[False] * len(columns) for _ in methods]
        for j, direction in enumerate(better):
            found = [row[j] for m, row in zip(methods, values) if m not in controls and row[j] is not None]
            if direction is None or not found:
                continue
            top = max(found) if direction else min(found)
            for i, m in enumerate(methods):
                best[i][j] = m not in controls and values[i][j] == top
        counts = {}
        for label in dict.fromkeys(label for label, _, _ in columns):
            found = sorted({per_metric.get(label, 0) for per_metric in self.images.get(model, {}).values()})
            counts[label] = "/".join(map(str, found))
        return Table(model, [label for label, _, _ in columns], [header for _, _, header in columns], better, methods,
                     values, best, controls, [number for _, number, _ in columns], counts)

    def ranking(self, model: str) -> Ranking:
        """Each method's rank per protocol and mean rank (definition: docs/decisions/bench.md).

        A protocol's rank is the mean of the method's ranks over that protocol's reported numbers that
        have a direction; on each number the methods that are not controls are ranked 1 (best) to n,
        ties sharing the mean of their places, and each control gets the place it would take among
        them alone (so controls move nobody). The mean rank is the mean over the protocols ranked.
        """
        table = self.table(model)
        ranked = [m for m in table.methods if m not in table.controls]
        protocols = [label for label in dict.fromkeys(table.metrics)
                     if any(metric == label and direction is not None for metric, direction in zip(table.metrics, table.better))]
        ranks = []
        for i, method in enumerate(table.methods):
            row = []
            for protocol in protocols:
                places = []
                for j, (metric, direction) in enumerate(zip(table.metrics, table.better)):
                    mine = table.values[i][j]
                    if metric != protocol or direction is None or not _finite(mine):
                        continue
                    others = [table.values[table.methods.index(m)][j] for m in ranked if m != method]
                    places.append(_place(mine, [v for v in others if _finite(v)], direction))
                row.append(sum(places) / len(places) if places else None)
            ranks.append(row)
        mean = [_mean([r for r in row if r is not None]) for row in ranks]
        order = sorted(range(len(table.methods)), key=lambda i: (mean[i] is None, mean[i] or 0.0))
        return Ranking(model, protocols, [table.methods[i] for i in order], [ranks[i] for i in order],
                       [mean[i] for i in order], table.controls)

    def markdown(self) -> str:
        """Per model: the ranks, then the table in the papers' layout (methods as rows, reported numbers
        as columns); the randomisation check and the errors."""
        lines = [f"# Benchmark on {self.dataset}, {self.precision}", ""] + [f"> {note}" for note in self.notes] + ([""] if self.notes else [])
        if self.scores:
            lines += ["## Ranks", "", "Rank per protocol: 1 = best; the mean of the method's ranks on the protocol's numbers "
                      "with a direction; controls placed among the methods for reference.", ""]
        for model in self.scores:
            lines += [f"### {model}", ""] + ranking_markdown(self.ranking(model))
        for model in self.scores:
            lines += [f"## {model}", ""] + score_markdown(self.table(model))
        for model, check in self.sanity.items():
            lines += [f"## {model}: model randomisation (Spearman correlation with the original maps)", ""]
            lines += sanity_markdown(check)
            lines += [f"Flagged: mean correlation > {check['threshold']} once the whole model is random "
                      f"({check['images']} images).", ""]
        if self.errors:
            lines += ["## Errors", "", "| model | method | metric | images | error |", "| --- | --- | --- | ---: | --- |"]
            for (model, method, metric, message), count in self.grouped_errors().items():
                lines.append(f"| {model} | {method} | {metric} | {count} | {message.replace('|', '/')} |")
            lines.append("")
        return "\n".join(lines)

    def grouped_errors(self) -> Counter:
        """(model, method, metric or '–', message) -> number of images."""
        grouped = Counter()
        for error in self.errors:
            grouped[error["model"], error["method"], error["metric"] or "–", error["error"]] += len(error["images"])
        return grouped

    def text(self, width: int = 100) -> str:
        """Everything for a terminal, no line wider than ``width``: per model its ranks, then its scores
        (one group of columns per protocol, best values marked ``*``), then the randomisation check,
        errors and seconds."""
        def say(text: str, indent: str = "") -> list[str]:
            return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False)

        lines = say(f"Benchmark on {self.dataset}, {self.precision}" + (f" ({self.seconds:.0f} s)" if self.seconds else "")) + [""]
        for model in self.scores:
            lines += say(f"{model}: rank per protocol (1 = best; controls placed among the methods for reference)")
            lines += ranking_text(self.ranking(model), width)
            lines += say(f"{model}: scores (* best among the methods; ↑/↓ higher/lower is better)")
            lines += score_text(self.table(model), width)
        for model, check in self.sanity.items():
            lines += say(f"{model}: model randomisation, Spearman correlation with the original maps ({check['images']} "
                         f"images; flagged if > {check['threshold']} with the whole model random)")
            lines += sanity_text(check, width)
        if self.errors:
            lines += say("Errors (model / method / metric: images: error)")
            for (model, method, metric, message), count in self.grouped_errors().items():
                lines += say(f"{model} / {method} / {metric}: {count}: {message}", "  ")
        for model, per_method in self.timings.items():
            phases: dict[str, float] = {}
            for spent in per_method.values():
                for phase, value in spent.items():
                    phases[phase] = phases.get(phase, 0.0) + value
            if phases:
                detail = ", ".join(f"{phase} {value:.0f}" for phase, value in phases.items())
                lines += say(f"{model}: {sum(phases.values()):.0f} s of work ({detail})")
        return "\n".join(lines).rstrip()

    def to_dict(self) -> dict[str, Any]:
        """Everything but the galleries' pixels, as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "galleries"}


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _place(value: float, others: list[float], higher_is_better: bool) -> float:
    """1 + the number of ``others`` better than ``value`` + half the number tied with it."""
    better = sum(other > value if higher_is_better else other < value for other in others)
    return 1 + better + sum(other == value for other in others) / 2


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def describe_dataset(dataset: Any) -> dict[str, Any] | str:
    """A dataset spec as plain data (a Dataset object by its class name)."""
    return asdict(dataset) if isinstance(dataset, DatasetSpec) else type(dataset).__name__


def build_result(config, shares: list[Share], errors: list[dict[str, Any]], *, galleries: list[Gallery] | None = None,
                 sanity: dict[str, Any] | None = None, seconds: float = 0.0,
                 timings: dict[str, dict[str, dict[str, float]]] | None = None) -> BenchResult:
    """Merge every process's shares in dataset order and reduce them with each metric's ``reduce``."""
    merged: dict[tuple[str, str, str], list[Share]] = {}
    for share in shares:
        merged.setdefault((share.model, share.method, share.metric), []).append(share)
    dataset = config.dataset.name if isinstance(config.dataset, DatasetSpec) else type(config.dataset).__name__
    metrics = {}
    for m in config.metrics:
        metrics[m.label] = {"name": m.name, "options": m.options, "limit": config.limit_of(m),
                            "dataset": describe_dataset(m.dataset or config.dataset)}
    settings = {"precision": config.precision, "target": config.target, "seed": config.seed, "limit": config.limit, "dataset": describe_dataset(config.dataset),
                "methods": {m.label: {"name": m.name, "options": m.options} for m in config.methods}, "metrics": metrics,
                "sanity": None if config.sanity is None else asdict(config.sanity), "highlight": list(config.highlight)}
    ordered_errors = sorted(errors, key=lambda e: (e["model"], e["method"], e["metric"] or "", e["images"]))
    result = BenchResult(dataset, {}, {}, {}, {}, ordered_errors, settings, sanity=sanity or {}, notes=list(config.notes),
                         seconds=seconds, timings=timings or {}, galleries=galleries or [])
    for entry in config.metrics:
        result.higher_is_better[entry.label] = dict(get_metric(entry.name).higher_is_better)
    for model in config.models:
        for method in config.methods:
            for entry in config.metrics:
                parts = [part for part in merged[model.name, method.label, entry.label] if part.indices]
                count = sum(len(part.indices) for part in parts)
                result.images.setdefault(model.name, {}).setdefault(method.label, {})[entry.label] = count
                scores = result.scores.setdefault(model.name, {}).setdefault(method.label, {})
                if not count:
                    continue
                order = torch.tensor([i for part in parts for i in part.indices]).argsort()
                values = {key: torch.cat([part.values[key] for part in parts])[order] for key in parts[0].values}
                try:
                    reported = get_metric(entry.name).report(values, entry.options)
                    scores[entry.label] = {key: float(value) for key, value in reported.items()}
                except Exception as error:  # noqa: BLE001 - one metric's reduction must not lose the other reports
                    result.errors.append({"model": model.name, "method": method.label, "metric": entry.label, "images": [],
                                          "error": f"reduce failed: {type(error).__name__}: {error}"})
                for key, value in values.items():
                    if value.ndim == 2:
                        curves = result.curves.setdefault(model.name, {}).setdefault(entry.label, {})
                        curves.setdefault(key, {})[method.label] = value.double().mean(0).tolist()
    return result
