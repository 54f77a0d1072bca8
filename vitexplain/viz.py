"""Maps as pictures: the one colour convention, overlays with colour bars, grids of methods, curve plots.

The colour convention (docs/decisions/explorer.md, "Colour convention") is decided here and used by
the PNG overlays and grids (:func:`save_overlay`, :func:`save_grid`), the bench report's gallery
(:func:`overlay`) and the interactive explorer (which colours in the browser with the palettes of
:func:`palette` and the ends of :func:`map_scale`, computed here):

* a map with a negative value is **signed** (LRP, Integrated Gradients, logit-weighted RISE ...):
  diverging palette :data:`DIVERGING`, 0 at its centre, symmetric, its ends at ± the
  :data:`ROBUST_PERCENTILE`-th percentile of |v|;
* any other map is **sequential**: palette :data:`SEQUENTIAL` from the map's minimum to the
  :data:`ROBUST_PERCENTILE`-th percentile of its values.

Values beyond the ends saturate. A robust end, not the extreme, because explanation maps are heavy
tailed: one pixel of an LRP or Integrated Gradients map can be a hundred times the typical
magnitude, and scaled by it every other pixel is drawn as 0. Where the percentile is degenerate
(more than 99 % of the values tie with the minimum, or are 0 for a signed map) the extreme is the
end instead. Percentiles are taken over the map as the method returns it (tokens or pixels), before
upsampling, so the overlay, the gallery and the explorer draw one map on one scale. Each map has its
own scale: methods' units are not comparable.

Figures are drawn on :class:`matplotlib.figure.Figure` objects and saved directly, without pyplot:
no backend is selected and no global matplotlib state changes, so notebooks keep their inline plots.
Nothing here imports torch before a tensor has to be upsampled (the explorer uses the convention
without torch).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: palette of sequential maps (no negative value): perceptually uniform, legible without colour vision
SEQUENTIAL = "viridis"
#: palette of signed maps: blue negative, near-white 0, red positive (the LRP literature's convention)
DIVERGING = "RdBu_r"
#: the percentile (of the values, or of |v| for signed maps) at the saturating end of a map's colour scale
ROBUST_PERCENTILE = 99.0
#: colours per palette: odd, so that the middle one (index 128) is exactly a diverging palette's centre
PALETTE_SIZE = 257
#: how strongly a map's colour covers the image, (1 - a) * image + a * colour
OVERLAY_ALPHA = 0.5


def is_signed(values) -> bool:
    """Whether a map (or the maps of one method) holds a negative value, and so is drawn as signed."""
    return bool((_array(values) < 0).any())


def _ordinal(percentile: float) -> str:
    number = f"{percentile:g}"
    suffix = "th" if number.endswith(("11", "12", "13")) else {"1": "st", "2": "nd", "3": "rd"}.get(number[-1], "th")
    return number + suffix


def scale_rule(signed: bool, percentile: float = ROBUST_PERCENTILE) -> str:
    """The rule of a colour scale in words, as legends and captions state it (100: the extreme)."""
    if signed:
        end = "max |v|" if percentile >= 100 else f"the {_ordinal(percentile)} percentile of |v|"
        return f"0 at the centre, ends at ± {end}"
    return "minimum to maximum" if percentile >= 100 else f"minimum to {_ordinal(percentile)} percentile"


@dataclass(frozen=True)
class MapScale:
    """Which values one map's colours span: ``low`` is drawn in the palette's first colour, ``high``
    in its last (``low = -high`` for a signed map), values beyond them saturate.

    ``percentile`` is the percentile that set the saturating end: :data:`ROBUST_PERCENTILE`, or 100
    where that percentile was degenerate and the extreme was taken instead.
    """

    signed: bool
    low: float
    high: float
    minimum: float
    maximum: float
    percentile: float

    @property
    def palette(self) -> str:
        """The convention's palette for this map."""
        return DIVERGING if self.signed else SEQUENTIAL

    @property
    def rule(self) -> str:
        """This scale's rule in words (:func:`scale_rule`)."""
        return scale_rule(self.signed, self.percentile)

    def label(self, palette_name: str | None = None) -> str:
        """A colour bar's label, short enough for a grid's panels: the palette and the rule, abbreviated."""
        end = "max" if self.percentile >= 100 else f"{_ordinal(self.percentile)} pct"
        return f"{palette_name or self.palette}: " + (f"0 centred, ±{end} of |v|" if self.signed else f"min to {end}")

    @property
    def saturated(self) -> tuple[bool, bool]:
        """Whether some values lie below ``low`` and above ``high``."""
        return self.minimum < self.low, self.maximum > self.high

    def positions(self, values) -> np.ndarray:
        """Where ``values`` fall on the palette, in [0, 1] (clipped: saturated beyond the ends)."""
        values = _array(values)
        if self.signed:
            where = 0.5 + values / (2 * self.high) if self.high > 0 else np.full(values.shape, 0.5)
        else:
            span = self.high - self.low
            where = (values - self.low) / span if span > 0 else np.zeros(values.shape)
        return np.clip(where, 0.0, 1.0)


def map_scale(values, *, signed: bool | None = None, percentile: float = ROBUST_PERCENTILE) -> MapScale:
    """The colour scale of one map [h, w] as the method returns it (module docstring).

    ``signed`` overrides the map's own sign (e.g. the gallery draws all maps of a method alike).
    """
    values = _array(values)
    signed = is_signed(values) if signed is None else signed
    minimum, maximum = float(values.min()), float(values.max())
    if signed:
        magnitudes = np.abs(values)
        end, used = float(np.percentile(magnitudes, percentile)), percentile
        if end <= 0:
            end, used = float(magnitudes.max()), 100.0
        return MapScale(True, -end, end, minimum, maximum, used)
    end, used = float(np.percentile(values, percentile)), percentile
    if end <= minimum:
        end, used = maximum, 100.0
    return MapScale(False, minimum, end, minimum, maximum, used)


@cache
def palette(name: str) -> np.ndarray:
    """:data:`PALETTE_SIZE` colours of matplotlib's colour map ``name``, uint8 RGB [PALETTE_SIZE, 3] (read-only)."""
    from matplotlib import colormaps

    colours = colormaps[name].resampled(PALETTE_SIZE)(np.arange(PALETTE_SIZE), bytes=True)[:, :3]
    colours.setflags(write=False)
    return colours


def palette_indices(positions: np.ndarray) -> np.ndarray:
    """The palette colour of each position in [0, 1]: the nearest of the :data:`PALETTE_SIZE` (halves round up)."""
    return np.floor(np.asarray(positions) * (PALETTE_SIZE - 1) + 0.5).astype(np.int64)


def colours(values, scale: MapScale, palette_name: str | None = None) -> np.ndarray:
    """uint8 RGB [..., 3] of ``values`` on ``scale``, in the convention's palette unless ``palette_name`` is given."""
    return palette(palette_name or scale.palette)[palette_indices(scale.positions(values))]


def overlay(image, saliency, *, scale: MapScale | None = None, signed: bool | None = None,
            alpha: float = OVERLAY_ALPHA, palette_name: str | None = None) -> np.ndarray:
    """``saliency`` [h, w] upsampled (bilinear) to ``image`` [H, W, 3], coloured by the convention
    (on ``scale``, else :func:`map_scale` of the map with ``signed``) and blended over the image:
    float RGB [H, W, 3] in [0, 1]. ``image``: uint8, or floats in [0, 1]."""
    import torch

    from .maps import resize

    picture = as_array(image)
    picture = picture / 255.0 if picture.dtype == np.uint8 else picture.astype(np.float64)
    saliency = torch.as_tensor(saliency).detach().float().cpu()
    scale = map_scale(saliency, signed=signed) if scale is None else scale
    heat = resize(saliency, tuple(picture.shape[:2])).numpy().astype(np.float64)
    return (1 - alpha) * picture + alpha * colours(heat, scale, palette_name) / 255.0


def palette_strip(name: str, height: int = 12) -> np.ndarray:
    """A palette from its first colour to its last, float RGB [height, PALETTE_SIZE, 3] (a legend's colour bar)."""
    return np.repeat(palette(name)[None] / 255.0, height, axis=0)


def as_array(value) -> np.ndarray:
    """A numpy array from an array or a torch tensor (without importing torch; float16 / bfloat16 as float64)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        value = (value.double() if value.is_floating_point() else value).numpy()
    return np.asarray(value)


def _array(values) -> np.ndarray:
    return np.asarray(as_array(values), dtype=np.float64)


def _draw(fig, ax, image: np.ndarray, saliency: torch.Tensor, cmap: str | None, diverging_cmap: str | None,
          alpha: float):
    """One overlay on ``ax`` with its colour bar (ticks in the map's units, arrows where values saturate)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize

    scale = map_scale(saliency)
    name = (diverging_cmap if scale.signed else cmap) or scale.palette
    ax.imshow(overlay(image, saliency, scale=scale, alpha=alpha, palette_name=name))
    ax.set_axis_off()
    below, above = scale.saturated
    arrows = "both" if below and above else "min" if below else "max" if above else "neither"
    shown = ScalarMappable(Normalize(scale.low, scale.high), ListedColormap(palette(name) / 255.0, name=name))
    bar = fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, extend=arrows)
    bar.set_label(scale.label(name), fontsize=7)
    bar.ax.tick_params(labelsize=7)
    return bar


def save_overlay(path: str | Path, image: np.ndarray, saliency: torch.Tensor, *, title: str = "",
                 cmap: str | None = None, diverging_cmap: str | None = None, alpha: float = OVERLAY_ALPHA):
    """Write one heatmap over its image, with a colour bar, as PNG; returns the figure (shown inline in notebooks).

    Colours by the convention (module docstring); ``cmap`` / ``diverging_cmap`` name other palettes
    for sequential / signed maps.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.4, 4), layout="constrained")
    ax = fig.add_subplot()
    _draw(fig, ax, image, saliency, cmap, diverging_cmap, alpha)
    if title:
        ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=100)
    return fig


def save_grid(path: str | Path, image: np.ndarray, maps: dict[str, torch.Tensor], *, title: str = "",
              cmap: str | None = None, diverging_cmap: str | None = None, alpha: float = OVERLAY_ALPHA,
              columns: int = 6):
    """Write the image and one overlay per method side by side, as PNG; returns the figure
    (colour maps as in :func:`save_overlay`)."""
    from matplotlib.figure import Figure

    panels = 1 + len(maps)
    cols = min(columns, panels)
    rows = -(-panels // cols)
    fig = Figure(figsize=(3.2 * cols, 3.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("input", fontsize=9)
    for ax, (name, saliency) in zip(axes.flat[1:], maps.items()):
        _draw(fig, ax, image, saliency, cmap, diverging_cmap, alpha)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=100)
    return fig
