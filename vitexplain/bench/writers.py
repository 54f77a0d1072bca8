"""Writing a benchmark's results: results.json, results.csv, results.md, plots/ and report.html."""
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
    """One row per (model, method, metric, reported number)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["model", "method", "metric", "number", "value", "higher_is_better", "images"])
    for model, per_method in result.scores.items():
        for method, per_metric in per_method.items():
            for label, numbers in per_metric.items():
                for number, value in numbers.items():
                    better = result.higher_is_better.get(label, {}).get(number)
                    writer.writerow([model, method, label, number, repr(value), "" if better is None else better,
                                     result.images[model][method][label]])
    return buffer.getvalue()


def write_reports(result: BenchResult, output_dir: Path) -> None:
    """results.json, results.csv, results.md, plots/<model>/<metric>-<value>.png (one line per method)
    and report.html (everything in one self-contained page, see :mod:`vitexplain.bench.html`)."""
    files: dict[str, Any] = {"json": output_dir / "results.json", "csv": output_dir / "results.csv",
                             "markdown": output_dir / "results.md", "html": output_dir / "report.html", "plots": []}
    plots = curve_plots(result)
    styles = {model: model_styles(result, model) for model in result.scores}
    for plot in plots:
        path = output_dir / "plots" / safe_name(plot.model) / f"{safe_name(plot.metric)}-{safe_name(plot.value)}.png"
        atomic_write(path, plot.render(styles[plot.model]))
        files["plots"].append(path)
    atomic_write(files["html"], render_html(result, plots).encode())
    result.files = {kind: [str(p) for p in path] if isinstance(path, list) else str(path) for kind, path in files.items()}
    atomic_write(files["csv"], csv_text(result).encode())
    atomic_write(files["markdown"], result.markdown().encode())
    atomic_write(files["json"], json.dumps(result.to_dict(), indent=2, default=repr).encode())
