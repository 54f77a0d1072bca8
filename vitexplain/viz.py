"""Maps as pictures: the one colour convention, overlays with colour bars, grids of methods, curve plots.

The colour convention (docs/decisions/explorer.md, "Colour convention") is decided here and used by
the PNG overlays and grids (:func:`save_overlay`, :func:`save_grid`), the notebook grids of :func:`plot`
(all three drawn by one function, ``_panel_figure``), the bench report's gallery
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

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

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


# ------------------------------------------------------------------------------------------ inputs as given

#: how far outside [0, 1] a float image may reach (rounding, resampling) before it counts as normalised
_RANGE_TOLERANCE = 0.02


def pictures(images, *, mean=None, std=None, config: Mapping | None = None) -> list[np.ndarray]:
    """Images as they are drawn: [H, W, 3] each, uint8 as given, anything else float in [0, 1].

    ``images``: a batch (tensor or array) [B, 3, H, W] or [B, H, W, 3], one image, or a sequence of
    PIL images, [H, W, 3] arrays or [3, H, W] tensors. Torch tensors are channels first (the model's
    inputs), numpy arrays and PIL images channels last. Channels-first float images are un-normalised
    with ``mean`` and ``std`` (3 numbers or one), or those of ``config`` (a model's data config, as
    :func:`vitexplain.models.load_model` and :func:`~vitexplain.models.data_config` return it); without
    them a float image must already be in [0, 1], and one clearly outside (a preprocessed batch) is refused.
    """
    mean, std = _mean_and_std(mean, std, config)
    if _is_image(images):
        images = [images]
    elif hasattr(images, "ndim") and images.ndim == 4:
        images = list(images)
    elif hasattr(images, "ndim") or not isinstance(images, Sequence) or isinstance(images, str):
        shape = f"shape {list(images.shape)}" if hasattr(images, "shape") else type(images).__name__
        raise ValueError(f"images must be a batch [B, 3, H, W] (or [B, H, W, 3]), one image, or a list of PIL "
                         f"images / [H, W, 3] arrays; got {shape}")
    if not images:
        raise ValueError("images is empty")
    return [_picture(image, f"image {i}", mean, std) for i, image in enumerate(images)]


def _is_image(value) -> bool:
    return _is_pil(value) or (hasattr(value, "ndim") and value.ndim == 3 and 3 in (value.shape[0], value.shape[-1]))


def _is_pil(value) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "convert")


def _mean_and_std(mean, std, config: Mapping | None):
    if config is not None:
        if mean is not None or std is not None:
            raise ValueError("give mean and std, or config, not both")
        missing = [key for key in ("mean", "std") if key not in config]
        if missing:
            raise ValueError(f"config has no {' or '.join(missing)} (a model's data config, as load_model returns it)")
        mean, std = config["mean"], config["std"]
    if (mean is None) != (std is None):
        raise ValueError("mean and std go together: give both (or config)")
    if mean is None:
        return None, None
    mean, std = (np.asarray(as_array(value), dtype=np.float64).reshape(-1, 1, 1) for value in (mean, std))
    if mean.shape[0] not in (1, 3) or std.shape[0] not in (1, 3):
        raise ValueError(f"mean and std must be 3 numbers (one per channel) or one; got {mean.ravel().tolist()} and "
                         f"{std.ravel().tolist()}")
    return mean, std


def _picture(image, where: str, mean, std) -> np.ndarray:
    if _is_pil(image):
        return np.asarray(image.convert("RGB"))
    array = as_array(image)
    if array.ndim != 3 or 3 not in (array.shape[0], array.shape[-1]) or 0 in array.shape:
        raise ValueError(f"{where} must be [H, W, 3] or [3, H, W]; got shape {list(array.shape)}")
    channels_first = array.shape[0] == 3 and (array.shape[-1] != 3 or hasattr(image, "detach"))
    if array.dtype.kind in "iu":
        if array.min() < 0 or array.max() > 255:
            raise ValueError(f"{where}: integer images must hold 0 to 255; got {array.min()} to {array.max()}")
        array = array.astype(np.uint8)
        return np.ascontiguousarray(array.transpose(1, 2, 0) if channels_first else array)
    if array.dtype.kind != "f":
        raise ValueError(f"{where}: images must hold numbers; got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"{where} holds non-finite values (NaN or inf)")
    if channels_first and mean is not None:
        array = array * std + mean
    elif array.min() < -_RANGE_TOLERANCE or array.max() > 1 + _RANGE_TOLERANCE:
        hint = ("it looks preprocessed (normalised): give mean= and std=, or config= (the model's data config), "
                "to draw it" if channels_first else "float pictures must be in [0, 1] (uint8 in 0 to 255)")
        raise ValueError(f"{where} holds values from {array.min():.3g} to {array.max():.3g}, outside [0, 1]: {hint}")
    return np.clip(array.transpose(1, 2, 0) if channels_first else array, 0.0, 1.0)


def method_maps(maps, images: int) -> dict[str, list[np.ndarray]]:
    """Each method's maps, one [h, w] array per image, checked against the number of ``images``.

    ``maps``: one method's maps [B, h, w] (labelled ``"map"``; [h, w] for one image), or a dict
    ``{method: maps}`` of such (tensors, arrays, or sequences of [h, w]), as :func:`vitexplain.explain`
    returns them method by method.
    """
    if isinstance(maps, Mapping):
        if not maps:
            raise ValueError("maps is empty: give one method's maps [B, h, w] or a dict {method: maps [B, h, w]}")
        named, where = {str(name): value for name, value in maps.items()}, "maps of {!r}".format
    else:
        named, where = {"map": maps}, lambda _: "maps"
    found = {}
    for name, value in named.items():
        if hasattr(value, "ndim") and value.ndim in (2, 3):
            value = [value] if value.ndim == 2 else list(value)
        elif hasattr(value, "ndim") or not isinstance(value, Sequence) or isinstance(value, str):
            shape = f"shape {list(value.shape)}" if hasattr(value, "shape") else type(value).__name__
            raise ValueError(f"{where(name)} must be [B, h, w] (or [h, w] for one image); got {shape}")
        if len(value) != images:
            raise ValueError(f"{where(name)}: {len(value)} maps for {images} images (the batch sizes must match)")
        arrays = []
        for i, saliency in enumerate(value):
            saliency = as_array(saliency)
            if saliency.ndim != 2 or 0 in saliency.shape:
                raise ValueError(f"{where(name)}: the map of image {i} must be 2-D [h, w]; got shape "
                                 f"{list(saliency.shape)}")
            if saliency.dtype.kind not in "iuf":
                raise ValueError(f"{where(name)}: maps must hold real numbers; got dtype {saliency.dtype}")
            if not np.isfinite(saliency).all():
                raise ValueError(f"{where(name)}: the map of image {i} holds non-finite values (NaN or inf)")
            arrays.append(saliency)
        found[name] = arrays
    return found


# ------------------------------------------------------------------------------------------ figures

@cache
def _figure_class():
    """:class:`matplotlib.figure.Figure` that also shows itself in notebooks where pyplot was never imported."""
    from matplotlib.figure import Figure

    class MapFigure(Figure):
        """A figure of maps. IPython shows a figure through the formatter an inline backend registers, and
        that happens when pyplot is imported; ``_repr_png_`` shows it in a notebook that never did."""

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100)
            return buffer.getvalue()

    MapFigure.__module__, MapFigure.__qualname__ = __name__, "MapFigure"   # pickled by name: __getattr__ finds it
    return MapFigure


def __getattr__(name: str):
    if name == "MapFigure":
        return _figure_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _new_figure(figsize: tuple[float, float]):
    return _figure_class()(figsize=figsize, layout="constrained")


def _frameless(ax) -> None:
    """No ticks and no frame, but the axis labels still drawn (a grid's row label is the first panel's y label)."""
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def _draw(fig, ax, image: np.ndarray, saliency, cmap: str | None, diverging_cmap: str | None, alpha: float,
          signed: bool | None = None, colorbar: bool = True):
    """One overlay on ``ax``, with its colour bar (ticks in the map's units, arrows where values saturate)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import ListedColormap, Normalize

    scale = map_scale(saliency, signed=signed)
    name = (diverging_cmap if scale.signed else cmap) or scale.palette
    ax.imshow(overlay(image, saliency, scale=scale, alpha=alpha, palette_name=name))
    _frameless(ax)
    if not colorbar:
        return None
    below, above = scale.saturated
    arrows = "both" if below and above else "min" if below else "max" if above else "neither"
    shown = ScalarMappable(Normalize(scale.low, scale.high), ListedColormap(palette(name) / 255.0, name=name))
    bar = fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, extend=arrows)
    bar.set_label(scale.label(name), fontsize=7)
    bar.ax.tick_params(labelsize=7)
    return bar


@dataclass
class _Panel:
    """One panel of a figure: the image alone (``saliency`` None) or a map over it."""

    image: np.ndarray
    saliency: object = None
    title: str = ""
    signed: bool | None = None


def _panel_figure(grid: list[list[_Panel | None]], *, cell: tuple[float, float], figsize=None,
                  row_labels: Sequence[str] = (), title: str = "", cmap: str | None = None,
                  diverging_cmap: str | None = None, alpha: float = OVERLAY_ALPHA, colorbar: bool = True):
    """The one drawing of panels in rows (shorter rows and None left blank): every figure of this module."""
    rows, cols = len(grid), max(len(row) for row in grid)
    fig = _new_figure(figsize or (cell[0] * cols, cell[1] * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for r, row in enumerate(grid):
        for c, ax in enumerate(axes[r]):
            panel = row[c] if c < len(row) else None
            if panel is None:
                ax.set_axis_off()
                continue
            if panel.saliency is None:
                ax.imshow(panel.image)
                _frameless(ax)
            else:
                _draw(fig, ax, panel.image, panel.saliency, cmap, diverging_cmap, alpha, panel.signed, colorbar)
            if panel.title:
                ax.set_title(panel.title, fontsize=9)
        if r < len(row_labels) and row_labels[r]:
            axes[r, 0].set_ylabel(row_labels[r], fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot(images, maps, *, titles: Sequence[str] | None = None, mean=None, std=None, config: Mapping | None = None,
         rows: Literal["images", "methods"] = "images", show_input: bool = True, signed: bool | None = None,
         colorbar: bool = True, figsize: tuple[float, float] | None = None,
         cell_size: tuple[float, float] | None = None, cmap: str | None = None, diverging_cmap: str | None = None,
         alpha: float = OVERLAY_ALPHA):
    """A grid of maps over their images, as a matplotlib ``Figure`` (a notebook shows it once; nothing is
    registered with pyplot, so no ``plt.show()`` and no duplicate).

    One row per image (``rows="methods"``: one per method): the image itself (unless ``show_input=False``),
    then one panel per method, titled with the method's name, each image's row labelled with ``titles``.
    Each map is upsampled (bilinear) to its image and coloured by the module's convention, with its
    own colour bar (``colorbar=False``: none) and its own scale; a method's maps are all drawn as signed
    when one of them has a negative value (as the bench gallery does; ``signed`` forces it either way).

    Args:
        images: a preprocessed batch [B, 3, H, W] with ``mean`` / ``std`` or ``config`` (the model's
            data config) to un-normalise it, or pictures: PIL images, [H, W, 3] uint8 or [0, 1] float
            arrays (see :func:`pictures`).
        maps: one method's maps [B, h, w] (token- or pixel-level, as :func:`vitexplain.explain` returns
            them), or ``{method: maps [B, h, w]}``.
        figsize: the whole figure in inches; else ``cell_size`` (width, height) per panel.
        cmap / diverging_cmap: other palettes for sequential / signed maps; ``alpha``: the map's share of a pixel.

    Example::

        from vitexplain.models import data_config

        config = data_config(model)
        maps = {name: vitexplain.explain(model, images, name) for name in ("gae", "tokentm")}
        vitexplain.plot(images, maps, config=config, titles=["cat", "dog"])   # 2 rows: input, gae, tokentm
        vitexplain.plot(images, maps, config=config).savefig("maps.png")

    Inputs that do not fit (a batch size that differs, a map that is not [B, h, w], normalised images
    without ``mean`` / ``std``) raise a ``ValueError`` naming the problem.
    """
    if rows not in ("images", "methods"):
        raise ValueError(f"rows must be 'images' or 'methods'; got {rows!r}")
    shown = pictures(images, mean=mean, std=std, config=config)
    per_method = method_maps(maps, len(shown))
    labels = [] if titles is None else [str(title) for title in titles]
    if titles is not None and len(labels) != len(shown):
        raise ValueError(f"titles: {len(labels)} titles for {len(shown)} images")
    signs = {name: signed if signed is not None else any(is_signed(saliency) for saliency in values)
             for name, values in per_method.items()}
    columns = ([("input", None)] if show_input else []) + list(per_method.items())
    grid = [[_Panel(picture, None if values is None else values[i], signed=signs.get(name))
             for name, values in columns] for i, picture in enumerate(shown)]
    headers = [name for name, _ in columns]
    if rows == "methods":
        grid, headers, labels = [list(column) for column in zip(*grid)], labels, headers
    for panel, header in zip(grid[0], headers):
        panel.title = header
    return _panel_figure(grid, cell=cell_size or ((3.2, 3.0) if colorbar else (2.6, 2.6)), figsize=figsize,
                         row_labels=labels, cmap=cmap, diverging_cmap=diverging_cmap, alpha=alpha, colorbar=colorbar)


def save_overlay(path: str | Path, image: np.ndarray, saliency: torch.Tensor, *, title: str = "",
                 cmap: str | None = None, diverging_cmap: str | None = None, alpha: float = OVERLAY_ALPHA):
    """Write one heatmap over its image, with a colour bar, as PNG; returns the figure (shown inline in notebooks).

    Colours by the convention (module docstring); ``cmap`` / ``diverging_cmap`` name other palettes
    for sequential / signed maps.
    """
    fig = _panel_figure([[_Panel(image, saliency, title)]], cell=(4.4, 4), cmap=cmap, diverging_cmap=diverging_cmap,
                        alpha=alpha)
    fig.savefig(path, dpi=100)
    return fig


def save_grid(path: str | Path, image: np.ndarray, maps: dict[str, torch.Tensor], *, title: str = "",
              cmap: str | None = None, diverging_cmap: str | None = None, alpha: float = OVERLAY_ALPHA,
              columns: int = 6):
    """Write the image and one overlay per method side by side (``columns`` panels a row), as PNG; returns
    the figure (colour maps as in :func:`save_overlay`; :func:`plot` draws several images)."""
    panels = [_Panel(image, None, "input")] + [_Panel(image, saliency, name) for name, saliency in maps.items()]
    cols = min(columns, len(panels))
    grid = [panels[start:start + cols] for start in range(0, len(panels), cols)]
    fig = _panel_figure(grid, cell=(3.2, 3.0), title=title, cmap=cmap, diverging_cmap=diverging_cmap, alpha=alpha)
    fig.savefig(path, dpi=100)
    return fig
