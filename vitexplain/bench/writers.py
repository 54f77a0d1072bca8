"""Writing a benchmark's results: results.json, results.csv, results.md, plots/, report.html and explorer.html."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .html import render_html
from .plots import curve_plots, model_styles
from .result import BenchResult
from .store import atomic_write, safe_name


def csv_text(result: BenchResult) -> str:
    """One row per (model, method, metric, reported number): its value, the bounds of its 95 % interval and its
    images."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", "method", "metric", "number", "value", "low", "high", "higher_is_better", "images"])
    for model, per_method in result.scores.items():
        for method, per_metric in per_method.items():
            for label, numbers in per_metric.items():
                for number, value in numbers.items():
                    better = result.higher_is_better.get(label, {}).get(number)
                    low, high = result.intervals[model][method][label][number]
                    writer.writerow([model, method, label, number, repr(value), repr(low), repr(high),
                                     "" if better is None else better, result.images[model][method][label]])
    return buffer.getvalue()


def explorer_items(result: BenchResult) -> list:
    """The galleries' images as pages of the interactive explorer (:mod:`vitexplain.explorer`): one per
    model and image, with every method's map and the options it was made with."""
    from ..explorer import ExplorerItem
    from ..registry import METHODS

    items = []
    for gallery in result.galleries:
        for i, image_id in enumerate(gallery.ids):
            maps = {label: found[i].numpy() for label, found in gallery.maps.items() if found is not None}
            if not maps:
                continue
            options = {}
            for label in maps:
                setting = result.settings.get("methods", {}).get(label, {})
                defaults = METHODS.get(setting["name"]).options if setting.get("name") in METHODS else {}
                options[label] = {**defaults, **setting.get("options", {})}
            name = lambda c: gallery.class_names[c] if 0 <= c < len(gallery.class_names) else str(c)  # noqa: E731
            items.append(ExplorerItem(
                name=f"{gallery.model} · {image_id}", image=(gallery.images[i].numpy() * 255).round().astype("uint8"),
                maps=maps, options=options, top5=[(name(c), p) for c, p in gallery.top5[i]] if gallery.top5 else [],
                target=name(gallery.predicted[i]), grid=gallery.grid))
    return items


def write_reports(result: BenchResult, output_dir: Path) -> None:
    """results.json, results.csv, results.md, plots/<model>/<metric>-<value>.png (one line per method),
    report.html (everything in one self-contained page, see :mod:`vitexplain.bench.html`) and, when
    there is a gallery, explorer.html (its images and maps in the interactive explorer)."""
    files: dict[str, Any] = {"json": output_dir / "results.json", "csv": output_dir / "results.csv",
                             "markdown": output_dir / "results.md", "html": output_dir / "report.html", "plots": []}
    items = explorer_items(result)
    if items:
        from ..explorer import explorer_html

        files["explorer"] = output_dir / "explorer.html"
        atomic_write(files["explorer"], explorer_html(items, title=f"vitexplain bench: {result.dataset}").encode())
    plots = curve_plots(result)
    styles = {model: model_styles(result, model) for model in result.scores}
    for plot in plots:
        path = output_dir / "plots" / safe_name(plot.model) / f"{safe_name(plot.metric)}-{safe_name(plot.value)}.png"
        atomic_write(path, plot.render(styles[plot.model]))
        files["plots"].append(path)
    atomic_write(files["html"], render_html(result, plots).encode())
    result.files = {kind: [str(p) for p in path] if isinstance(path, list) else str(path)
                    for kind, path in files.items()}
    atomic_write(files["csv"], csv_text(result).encode())
    atomic_write(files["markdown"], result.markdown().encode())
    atomic_write(files["json"], json.dumps(result.to_dict(), indent=2, default=repr).encode())
