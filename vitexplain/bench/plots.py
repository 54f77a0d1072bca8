"""The bench's pictures: curves of per-image values, the randomisation plot, and the gallery's overlays.

Curves are described once (:class:`CurvePlot`) and drawn twice: as PNG files under ``plots/`` and as
inline SVG in report.html, where each line can be shown and hidden. With many methods the lines are
told apart by role (docs/decisions/bench.md): the config's ``highlight`` methods in colour, wider
and on top, the controls dashed / dotted in black and grey, every other method thin light grey.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from .. import viz
from .result import BenchResult

OVERLAY_ALPHA = 0.5
#: maps without negative values: min-max scaled
SEQUENTIAL = "jet"
#: maps with negative values: 0 in the middle of the scale, ± the magnitude of :func:`signed_scale` at the ends
DIVERGING = "RdBu_r"
#: a signed map's largest magnitudes, this percentile and up, saturate the diverging scale
SATURATED_PERCENTILE = 99
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
    """Per method, its mean correlation per randomisation level less its noise floor; 0 dotted (a method
    whose line ends clearly above 0 is flagged)."""
    curves = {method: [value - found["floor"] for value in found["correlation"]] for method, found in check["methods"].items()}
    return CurvePlot(model, "sanity", "correlation", f"{model}: cascading randomisation ({check['images']} images)",
                     "re-initialised down to", "Spearman correlation less noise floor", curves, ticks=check["levels"],
                     reference=0.0, size=(10, 4.8))


def model_styles(result: BenchResult, model: str) -> dict[str, dict]:
    """The curve style of each method of ``model`` (the same in every plot of the model)."""
    return curve_styles(list(result.scores.get(model, {})), result.highlight, result.controls(model))


def png_of(pixels: np.ndarray) -> bytes:
    """PNG of an RGB array [H, W, 3] in [0, 1]."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((np.clip(pixels, 0, 1) * 255).round().astype(np.uint8)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def is_signed(maps: Tensor) -> bool:
    """Whether maps hold negative values (then they are drawn on the diverging scale)."""
    return bool((maps < 0).any())


def signed_scale(values: np.ndarray) -> float:
    """The magnitude at the ends of the diverging scale: the 99th percentile of |value| (the largest
    when that is 0), so the few extreme pixels of a heavy-tailed map (LRP puts about a third of its
    relevance on 1 % of the pixels of a digit) saturate instead of washing every other value out."""
    magnitudes = np.abs(values)
    scale = float(np.percentile(magnitudes, SATURATED_PERCENTILE))
    return scale if scale > 0 else float(magnitudes.max())


def overlay(image: Tensor, saliency: Tensor, signed: bool = False) -> np.ndarray:
    """``saliency`` upsampled to ``image`` [H, W, 3], coloured and blended over it.

    Unsigned: min-max scaled on the sequential scale (as :mod:`vitexplain.viz` draws maps). Signed: 0
    at the middle of the diverging scale and ± :func:`signed_scale` at its ends (beyond: clipped), so
    positive and negative evidence keep their sign and a map of small values does not turn
    uniformly mid-scale.
    """
    from matplotlib import colormaps

    upsampled = viz.upsample(saliency.float(), tuple(image.shape[:2])).numpy().astype(np.float64)
    if signed:
        scale = signed_scale(upsampled)
        heat = 0.5 + 0.5 * np.clip(upsampled / scale, -1, 1) if scale > 0 else np.full_like(upsampled, 0.5)
    else:
        heat = viz.normalise(upsampled)
    colours = colormaps[DIVERGING if signed else SEQUENTIAL](heat)[..., :3]
    return (1 - OVERLAY_ALPHA) * image.numpy() + OVERLAY_ALPHA * colours


def colour_scale(name: str) -> bytes:
    """PNG of a colour map from low to high, 256 x 12 pixels."""
    from matplotlib import colormaps

    return png_of(np.repeat(colormaps[name](np.linspace(0, 1, 256))[None, :, :3], 12, axis=0))
