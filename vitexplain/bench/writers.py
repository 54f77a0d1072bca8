"""Writing a benchmark's results: results.json, results.csv, results.md, plots/, report.html and explorer.html."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .cache import CACHE_FOLDER
from .html import render_html
from .lock import LOCK_NAME
from .plots import curve_plots, model_styles
from .result import BenchResult
from .store import atomic_write, safe_name

#: the reports :func:`write_reports` writes, by kind (plots: a folder)
REPORTS = {"json": "results.json", "csv": "results.csv", "markdown": "results.md", "html": "report.html",
           "explorer": "explorer.html", "plots": "plots"}
#: every name a bench writes into its output folder: what claiming the folder checks (vitexplain.output_folders)
OUTPUT_NAMES = (*REPORTS.values(), CACHE_FOLDER, LOCK_NAME)
#: what the bench calls itself when it claims a folder
WHO = "vitexplain bench"


def made_by_earlier_bench(folder: Path) -> bool:
    """Whether ``folder``, which holds no marker, is the output folder of a bench of a version from before the
    marker: its results.json is a bench's results (an object with scores, errors and settings), or it holds only
    a lock file a bench wrote (a run holding it, or just taking it: empty or the holder's pid and config)."""
    try:
        found = json.loads((folder / REPORTS["json"]).read_text())
    except (OSError, ValueError):
        found = None
    if isinstance(found, dict) and {"dataset", "scores", "errors", "settings"} <= set(found):
        return True
    lock = folder / LOCK_NAME
    try:
        text = lock.read_text() if lock.is_file() else None
    except OSError:
        text = None
    if text is None:
        return False
    try:
        holder = json.loads(text or "{}")
    except ValueError:
        return False
    others = [name for name in OUTPUT_NAMES if name != LOCK_NAME and (folder / name).exists()]
    return isinstance(holder, dict) and set(holder) <= {"pid", "host", "config"} and not others


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
                    found = result.intervals[model][method][label][number]
                    low, high = ("", "") if isinstance(found, str) else map(repr, found)   # too few images: none
                    writer.writerow([model, method, label, number, repr(value), low, high,
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
    files: dict[str, Any] = {kind: output_dir / REPORTS[kind] for kind in ("json", "csv", "markdown", "html")}
    files["plots"] = []
    items = explorer_items(result)
    if items:
        from ..explorer import explorer_html

        files["explorer"] = output_dir / REPORTS["explorer"]
        atomic_write(files["explorer"], explorer_html(items, title=f"vitexplain bench: {result.dataset}").encode())
    plots = curve_plots(result)
    styles = {model: model_styles(result, model) for model in result.scores}
    for plot in plots:
        name = f"{safe_name(plot.metric)}-{safe_name(plot.value)}.png"
        path = output_dir / REPORTS["plots"] / safe_name(plot.model) / name
        atomic_write(path, plot.render(styles[plot.model]))
        files["plots"].append(path)
    atomic_write(files["html"], render_html(result, plots).encode())
    result.files = {kind: [str(p) for p in path] if isinstance(path, list) else str(path)
                    for kind, path in files.items()}
    atomic_write(files["csv"], csv_text(result).encode())
    atomic_write(files["markdown"], result.markdown().encode())
    atomic_write(files["json"], json.dumps(result.to_dict(), indent=2, default=repr).encode())
