"""The bench's pictures: curves of per-image values, the randomisation plot, and PNG bytes of the gallery's
overlays (coloured by :mod:`vitexplain.viz`'s convention).

Curves are described once (:class:`CurvePlot`) and drawn twice (:func:`draw_curves`): as PNG files under
``plots/`` and as inline SVG in report.html, where each line can be shown, hidden and highlighted. Each
point sits at the x the metric really took (the share of pixels removed, inserted or grouped: the
metric's :class:`~vitexplain.metrics.base.Curves`), the axes say what is plotted. Lines are told apart
by role and by look (docs/decisions/bench.md): every method that is not a control gets its own colour
and dash pattern (9 colours x 4 dashes), the config's ``highlight`` methods wider and on top with the
others thinner and paler, the controls black and grey, dashed / dotted.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from .result import BenchResult

CONTROL_STYLES = ({"color": "#4d4d4d", "linestyle": "--"}, {"color": "#000000", "linestyle": ":"},
                  {"color": "#8c8c8c", "linestyle": "-."})
#: the dash patterns that, with the colours, tell the methods apart (the first colours all solid, then dashed ...)
LINESTYLES = ("-", "--", "-.", ":")
#: a method that is not highlighted, when some are
BACKGROUND = {"linewidth": 1.1, "alpha": 0.6, "zorder": 2}


def curve_styles(names: list[str], highlight: list[str] = (), controls: set[str] = frozenset()) -> dict[str, dict]:
    """``Axes.plot`` keyword arguments per method (see the module docstring): no two methods that are
    not controls share a colour and dash pattern (up to 36 of them)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    palette = [to_hex(c) for k, c in enumerate(colormaps["tab10"].colors) if k != 7]      # tab10's grey: the controls'
    styles, coloured, dashed = {}, 0, 0
    for name in names:
        if name in controls:
            styles[name] = {**CONTROL_STYLES[dashed % len(CONTROL_STYLES)], "linewidth": 1.5, "zorder": 3}
            dashed += 1
            continue
        look = {"color": palette[coloured % len(palette)],
                "linestyle": LINESTYLES[coloured // len(palette) % len(LINESTYLES)]}
        coloured += 1
        if highlight and name not in highlight:
            styles[name] = {**look, **BACKGROUND}
        else:
            styles[name] = {**look, "linewidth": 2.4 if highlight else 1.5, "zorder": 4}
    return styles


@dataclass
class CurvePlot:
    """One plot of one model: a line per method, its points at ``x`` (or at the named ``ticks``)."""

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
    x: list[float] | None = None

    def render(self, styles: dict[str, dict], image_format: str = "png", *, legend: bool = True,
               ids: dict[str, str] | None = None) -> bytes:
        return draw_curves(self, styles, image_format, legend=legend, ids=ids)


def draw_curves(plot: CurvePlot, styles: dict[str, dict], image_format: str = "png", *, legend: bool = True,
                ids: dict[str, str] | None = None) -> bytes:
    """``plot`` as PNG or SVG bytes, drawn with the Agg canvas (the global backend is left alone); ``ids``:
    in an SVG, the ``id`` of each method's line (so a page can show, hide and highlight it)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=plot.size)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, curve in plot.curves.items():
        if plot.ticks is not None:
            where = np.arange(len(curve))
        else:
            where = plot.x if plot.x is not None else np.arange(1, len(curve) + 1)
        (line,) = axes.plot(where, curve, label=name, marker="." if len(curve) <= 16 else None, markersize=4,
                            **{"linewidth": 1.5, **styles.get(name, {})})
        if ids and name in ids:
            line.set_gid(ids[name])
    if plot.reference is not None:
        axes.axhline(plot.reference, color="#cf222e", linestyle=":", linewidth=1)
    axes.set_title(plot.title, fontsize=10)
    axes.set_xlabel(plot.xlabel, fontsize=8.5)
    axes.set_ylabel("\n".join(wrapped(plot.ylabel, 38)), fontsize=8.5)
    if plot.ticks is not None:
        axes.set_xticks(range(len(plot.ticks)), plot.ticks, rotation=40, ha="right", fontsize=8)
    elif plot.x is not None and min(plot.x) >= 0 and max(plot.x) <= 1:
        axes.set_xlim(0, 1)
    axes.grid(alpha=0.3)
    if legend:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                    ncol=1 if len(plot.curves) <= 16 else 2)
    figure.tight_layout()
    buffer = io.BytesIO()
    metadata = {"Date": None, "Creator": None, "Format": None, "Type": None} if image_format == "svg" else None
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format=image_format, dpi=110, metadata=metadata)
    return buffer.getvalue()


def wrapped(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words."""
    import textwrap

    return textwrap.wrap(text, width) or [""]


def curve_plots(result: BenchResult) -> list[CurvePlot]:
    """Every per-image value with steps, averaged over the images: one plot per (model, metric, value),
    drawn at the metric's true x (:attr:`BenchResult.axes`)."""
    plots = []
    for model, per_metric in result.curves.items():
        for label, per_key in per_metric.items():
            for key, curves in per_key.items():
                axes = result.axes.get(label, {}).get(key, {})
                count = min(result.images.get(model, {}).get(m, {}).get(label, 0) for m in curves)
                plots.append(CurvePlot(model, label, key, f"{model}: {label} / {key} (mean of {count} images)",
                                       axes.get("xlabel", "step"), axes.get("ylabel", key), curves, x=axes.get("x")))
    return plots


def cascade_plot(model: str, check: dict) -> CurvePlot:
    """Per method, its mean correlation per randomisation level less its noise floor; 0 dotted (a method
    passes only where its line ends clearly below 0: :data:`vitexplain.bench.randomisation.VERDICT_RULE`)."""
    curves = {method: [value - found["floor"] for value in found["correlation"]]
              for method, found in check["methods"].items()}
    return CurvePlot(model, "sanity", "correlation", f"{model}: cascading randomisation ({check['images']} images)",
                     "re-initialised down to",
                     "Spearman correlation with the trained model's maps, less the noise floor",
                     curves, ticks=check["levels"], reference=0.0, size=(10, 4.8))


def model_styles(result: BenchResult, model: str) -> dict[str, dict]:
    """The curve style of each method of ``model`` (the same in every plot of the model)."""
    return curve_styles(list(result.scores.get(model, {})), result.highlight, result.controls(model))


def png_of(pixels: np.ndarray) -> bytes:
    """PNG of an RGB array [H, W, 3] in [0, 1]."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()
