"""The bench's pictures: curves of per-image values, the randomisation plot, and PNG bytes of the gallery's
overlays (coloured by :mod:`vitexplain.viz`'s convention).

Curves are described once (:class:`CurvePlot`) and drawn twice: as PNG files under ``plots/`` and as
inline SVG in report.html, where each line can be shown and hidden. With many methods the lines are
told apart by role (docs/decisions/bench.md): the config's ``highlight`` methods in colour, wider
and on top, the controls dashed / dotted in black and grey, every other method thin light grey.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from .. import viz
from .result import BenchResult

CONTROL_STYLES = ({"color": "#4d4d4d", "linestyle": "--"}, {"color": "#000000", "linestyle": ":"},
                  {"color": "#8c8c8c", "linestyle": "-."})
GREY = {"color": "#c3c8ce", "linestyle": "-", "linewidth": 1.0, "zorder": 1}


def curve_styles(names: list[str], highlight: list[str] = (), controls: set[str] = frozenset()) -> dict[str, dict]:
    """``Axes.plot`` keyword arguments per method (see the module docstring); without ``highlight``
    every method that is not a control gets its own colour."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    if highlight:
        palette = [c for k, c in enumerate(colormaps["tab10"].colors) if k != 7]      # tab10's grey is the others'
    else:
        palette = list(colormaps["tab20"].colors + colormaps["Dark2"].colors)
    styles, coloured, dashed = {}, 0, 0
    for name in names:
        if name in controls:
            styles[name] = {**CONTROL_STYLES[dashed % len(CONTROL_STYLES)], "linewidth": 1.5, "zorder": 3}
            dashed += 1
        elif highlight and name not in highlight:
            styles[name] = dict(GREY)
        else:
            styles[name] = {"color": to_hex(palette[coloured % len(palette)]), "linestyle": "-",
                            "linewidth": 2.0 if highlight else 1.4, "zorder": 4}
            coloured += 1
    return styles


@dataclass
class CurvePlot:
    """One plot of one model: a line per method."""

    model: str
    metric: str
    value: str
    title: str
    xlabel: str
    ylabel: str
    curves: dict[str, list[float]]
    ticks: list[str] | None = None
    reference: float | None = None
    size: tuple[float, float] = (7.6, 3.9)

    def render(self, styles: dict[str, dict], image_format: str = "png", *, legend: bool = True,
               ids: dict[str, str] | None = None) -> bytes:
        return viz.line_plot(self.curves, styles, title=self.title, xlabel=self.xlabel, ylabel=self.ylabel, ticks=self.ticks,
                             reference=self.reference, size=self.size, image_format=image_format, legend=legend, ids=ids)


def curve_plots(result: BenchResult) -> list[CurvePlot]:
    """Every per-image value with steps, averaged over the images: one plot per (model, metric, value)."""
    return [CurvePlot(model, label, key, f"{model}: {label} / {key}", "fraction of the perturbation steps", key, curves)
            for model, per_metric in result.curves.items() for label, per_key in per_metric.items()
            for key, curves in per_key.items()]


def cascade_plot(model: str, check: dict) -> CurvePlot:
    """The mean correlation per randomisation level, one line per method, the flag threshold dotted."""
    curves = {method: found["correlation"] for method, found in check["methods"].items()}
    return CurvePlot(model, "sanity", "correlation", f"{model}: cascading randomisation ({check['images']} images)",
                     "re-initialised down to", "Spearman correlation with original", curves, ticks=check["levels"],
                     reference=check["threshold"], size=(10, 4.8))


def model_styles(result: BenchResult, model: str) -> dict[str, dict]:
    """The curve style of each method of ``model`` (the same in every plot of the model)."""
    return curve_styles(list(result.scores.get(model, {})), result.highlight, result.controls(model))


def png_of(pixels: np.ndarray) -> bytes:
    """PNG of an RGB array [H, W, 3] in [0, 1]."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()
