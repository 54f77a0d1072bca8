"""Reducing per-image values to the reported numbers, and writing them: JSON, CSV, Markdown, PNG curves, HTML."""
from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..metrics import get_metric
from ..registry import METHODS
from .config import DatasetSpec
from .store import atomic_write, safe_name

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
    """

    model: str
    ids: list[str]
    images: Tensor
    labels: list[int]
    predicted: list[int]
    probability: list[float]
    class_names: list[str]
    maps: dict[str, Tensor | None]


@dataclass
class Table:
    """One model's table: methods as rows, reported numbers as columns.

    ``metrics[j]`` is the metric label of column j, ``headers[j]`` its name in the table, ``better[j]``
    whether higher is better (None: no direction); ``best[i][j]`` marks
    the best value of a column among the methods that are not controls (ties all marked).
    """

    model: str
    metrics: list[str]
    headers: list[str]
    better: list[bool | None]
    methods: list[str]
    values: list[list[float | None]]
    best: list[list[bool]]
    controls: set[str]

    def header(self, column: int) -> str:
        arrow = {True: " ↑", False: " ↓", None: ""}[self.better[column]]
        return self.headers[column] + arrow


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

    def table(self, model: str) -> Table:
        """The model's table; control methods (registered with ``control=True``) never count as best."""
        columns = self.columns(model)
        better = [self.higher_is_better.get(label, {}).get(number) for label, number, _ in columns]
        methods = list(self.scores[model])
        controls = {m for m in methods if _is_control(self.settings.get("methods", {}).get(m, {}).get("name"))}
        values = [[self.scores[model][m].get(label, {}).get(number) for label, number, _ in columns] for m in methods]
        best = [[False] * len(columns) for _ in methods]
        for j, direction in enumerate(better):
            found = [row[j] for m, row in zip(methods, values) if m not in controls and row[j] is not None]
            if direction is None or not found:
                continue
            top = max(found) if direction else min(found)
            for i, m in enumerate(methods):
                best[i][j] = m not in controls and values[i][j] == top
        return Table(model, [label for label, _, _ in columns], [header for _, _, header in columns], better, methods,
                     values, best, controls)

    def markdown(self) -> str:
        """One table per model in the papers' layout: methods as rows, reported numbers as columns."""
        lines = [f"# Benchmark on {self.dataset}", ""] + [f"> {note}" for note in self.notes] + ([""] if self.notes else [])
        for model in self.scores:
            table = self.table(model)
            lines += [f"## {model}", "", "| method | " + " | ".join(map(table.header, range(len(table.headers)))) + " |",
                      "| --- |" + " ---: |" * len(table.headers)]
            for method, values, best in zip(table.methods, table.values, table.best):
                cells = [f"**{format_value(v)}**" if b else format_value(v) for v, b in zip(values, best)]
                name = f"*{method} (control)*" if method in table.controls else method
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += self._sanity_markdown()
        if self.errors:
            lines += ["## Errors", "", "| model | method | metric | images | error |", "| --- | --- | --- | ---: | --- |"]
            for (model, method, metric, message), count in self.grouped_errors().items():
                lines.append(f"| {model} | {method} | {metric} | {count} | {message.replace('|', '/')} |")
            lines.append("")
        return "\n".join(lines)

    def _sanity_markdown(self) -> list[str]:
        lines = []
        for model, check in self.sanity.items():
            lines += [f"## {model}: model randomisation (Spearman correlation with the original maps)", "",
                      "| method | " + " | ".join(check["levels"]) + " | flagged |", "| --- |" + " ---: |" * (len(check["levels"]) + 1)]
            for method, found in check["methods"].items():
                cells = [f"{v:.2f}" for v in found["correlation"]]
                lines.append(f"| {method} | " + " | ".join(cells) + f" | {'**yes**' if found['flagged'] else 'no'} |")
            lines += ["", f"Flagged: mean correlation > {check['threshold']} once the whole model is random "
                          f"({check['images']} images).", ""]
        return lines

    def grouped_errors(self) -> Counter:
        """(model, method, metric or '–', message) -> number of images."""
        grouped = Counter()
        for error in self.errors:
            grouped[error["model"], error["method"], error["metric"] or "–", error["error"]] += len(error["images"])
        return grouped

    def text(self, width: int = 110) -> str:
        """The tables as aligned plain text for a terminal; best values end in ``*``, wide tables wrap."""
        lines = [f"Benchmark on {self.dataset}" + (f" ({self.seconds:.0f} s)" if self.seconds else "")]
        for model in self.scores:
            table = self.table(model)
            names = [m + (" (control)" if m in table.controls else "") for m in table.methods]
            cells = [[format_value(v) + ("*" if b else " ") for v, b in zip(values, best)]
                     for values, best in zip(table.values, table.best)]
            columns = [(table.header(j), [row[j] for row in cells]) for j in range(len(table.headers))]
            lines += ["", f"{model}  (* best among the methods; ↑/↓ higher/lower is better)"]
            lines += _wrapped(names, columns, width)
        for model, check in self.sanity.items():
            lines += ["", f"{model}: model randomisation, Spearman correlation with the original maps "
                          f"({check['images']} images; flagged if > {check['threshold']} with the whole model random)"]
            names = list(check["methods"])
            columns = [(level, [f"{check['methods'][m]['correlation'][k]:.2f}" for m in names])
                       for k, level in enumerate(check["levels"])]
            columns.append(("flagged", ["FLAGGED" if check["methods"][m]["flagged"] else "" for m in names]))
            lines += _wrapped(names, columns, width)
        if self.errors:
            lines += ["", "Errors (model / method / metric: images: error)"]
            lines += [f"  {model} / {method} / {metric}: {count}: {message}"
                      for (model, method, metric, message), count in self.grouped_errors().items()]
        for model, per_method in self.timings.items():
            phases: dict[str, float] = {}
            for spent in per_method.values():
                for phase, value in spent.items():
                    phases[phase] = phases.get(phase, 0.0) + value
            if phases:
                detail = ", ".join(f"{phase} {value:.0f}" for phase, value in phases.items())
                lines.append(f"{model}: {sum(phases.values()):.0f} s of work ({detail})")
        return "\n".join(lines)

    def csv_text(self) -> str:
        """One row per (model, method, metric, reported number)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["model", "method", "metric", "number", "value", "higher_is_better", "images"])
        for model, per_method in self.scores.items():
            for method, per_metric in per_method.items():
                for label, numbers in per_metric.items():
                    for number, value in numbers.items():
                        better = self.higher_is_better.get(label, {}).get(number)
                        writer.writerow([model, method, label, number, repr(value), "" if better is None else better,
                                         self.images[model][method][label]])
        return buffer.getvalue()

    def to_dict(self) -> dict[str, Any]:
        """Everything but the galleries' pixels, as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "galleries"}


def _is_control(method: str | None) -> bool:
    return method in METHODS and METHODS.get(method).control


def format_value(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def _wrapped(names: list[str], columns: list[tuple[str, list[str]]], width: int) -> list[str]:
    """Aligned rows of ``names`` and ``columns`` (header, cells), split into blocks no wider than ``width``."""
    first = max(len(name) for name in ["method", *names])
    widths = [max(len(header), *(len(cell) for cell in cells)) for header, cells in columns]
    blocks, current, used = [], [], first
    for index, column_width in enumerate(widths):
        if current and used + 2 + column_width > width:
            blocks.append(current)
            current, used = [], first
        current.append(index)
        used += 2 + column_width
    blocks.append(current)
    lines = []
    for block in blocks:
        rule = "-" * (first + sum(2 + widths[j] for j in block))
        lines += [rule, "method".ljust(first) + "".join("  " + columns[j][0].rjust(widths[j]) for j in block), rule]
        for i, name in enumerate(names):
            lines.append(name.ljust(first) + "".join("  " + columns[j][1][i].rjust(widths[j]) for j in block))
        lines.append(rule)
    return lines


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
    settings = {"target": config.target, "seed": config.seed, "limit": config.limit, "dataset": describe_dataset(config.dataset),
                "methods": {m.label: {"name": m.name, "options": m.options} for m in config.methods}, "metrics": metrics,
                "sanity": None if config.sanity is None else asdict(config.sanity)}
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
                    scores[entry.label] = {key: float(value) for key, value in get_metric(entry.name).reduce(values).items()}
                except Exception as error:  # noqa: BLE001 - one metric's reduction must not lose the other reports
                    result.errors.append({"model": model.name, "method": method.label, "metric": entry.label, "images": [],
                                          "error": f"reduce failed: {type(error).__name__}: {error}"})
                for key, value in values.items():
                    if value.ndim == 2:
                        curves = result.curves.setdefault(model.name, {}).setdefault(entry.label, {})
                        curves.setdefault(key, {})[method.label] = value.double().mean(0).tolist()
    return result


def line_plot(title: str, xlabel: str, ylabel: str, curves: dict[str, list[float]], *, ticks: list[str] | None = None,
              dashed: set[str] = frozenset(), reference: float | None = None, size: tuple[float, float] = (7.6, 3.9)) -> bytes:
    """PNG of one line per method (``dashed`` ones dashed, ``reference`` as a dotted horizontal line),
    legend beside the axes, drawn with the Agg canvas (the global matplotlib backend is left alone).

    x runs over [0, 1], or over the named ``ticks`` (one per point) when given.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colours = colormaps["tab20"].colors + colormaps["Dark2"].colors
    control_styles = [{"color": "0.35", "linestyle": "--"}, {"color": "black", "linestyle": ":"}, {"color": "0.6", "linestyle": "-."}]
    controls = [method for method in curves if method in dashed]
    for index, (method, curve) in enumerate(curves.items()):
        where = torch.linspace(0, 1, len(curve)).tolist() if ticks is None else list(range(len(curve)))
        if method in dashed:
            style = control_styles[controls.index(method) % len(control_styles)]
        else:
            style = {"color": colours[index % len(colours)]}
        axes.plot(where, curve, label=method, linewidth=1.4, marker="." if len(curve) <= 12 else None, **style)
    if reference is not None:
        axes.axhline(reference, color="#cf222e", linestyle=":", linewidth=1)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if ticks is not None:
        axes.set_xticks(range(len(ticks)), ticks, rotation=40, ha="right", fontsize=8)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                ncol=1 if len(curves) <= 16 else 2)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def curve_plots(result: BenchResult) -> list[tuple[str, str, str, bytes]]:
    """(model, metric label, value name, PNG) of every per-image value with steps, averaged over the images."""
    plots = []
    for model, per_metric in result.curves.items():
        controls = result.table(model).controls
        for label, per_key in per_metric.items():
            for key, curves in per_key.items():
                png = line_plot(f"{model}: {label} / {key}", "fraction of the perturbation steps", key, curves, dashed=controls)
                plots.append((model, label, key, png))
    return plots


def write_reports(result: BenchResult, output_dir: Path) -> None:
    """results.json, results.csv, results.md, plots/<model>/<metric>-<value>.png (one line per method)
    and report.html (everything in one self-contained page, see :mod:`vitexplain.bench.html`)."""
    from .html import render_html

    files: dict[str, Any] = {"json": output_dir / "results.json", "csv": output_dir / "results.csv",
                             "markdown": output_dir / "results.md", "html": output_dir / "report.html", "plots": []}
    plots = curve_plots(result)
    for model, label, key, png in plots:
        path = output_dir / "plots" / safe_name(model) / f"{safe_name(label)}-{safe_name(key)}.png"
        atomic_write(path, png)
        files["plots"].append(path)
    atomic_write(files["html"], render_html(result, plots).encode())
    result.files = {kind: [str(p) for p in path] if isinstance(path, list) else str(path) for kind, path in files.items()}
    atomic_write(files["csv"], result.csv_text().encode())
    atomic_write(files["markdown"], result.markdown().encode())
    atomic_write(files["json"], json.dumps(result.to_dict(), indent=2, default=repr).encode())
