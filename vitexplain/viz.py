"""Heatmap overlays with colour bars, and side-by-side grids of several methods.

Figures are drawn on :class:`matplotlib.figure.Figure` objects and saved directly, without pyplot:
no backend is selected and no global matplotlib state changes, so notebooks keep their inline plots.

A map with any negative value is signed (LRP, logit-weighted RISE ...): it is drawn with a diverging
colour map centred at 0, scaled by its largest absolute value, so the sign stays visible. Other maps
are min-max scaled to [0, 1]. The colour bar's label names the scaling and the colour map.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def normalise(saliency: torch.Tensor | np.ndarray) -> np.ndarray:
    """Min-max scale one map to [0, 1] (a constant map becomes all zeros)."""
    values = np.asarray(saliency.detach().cpu() if isinstance(saliency, torch.Tensor) else saliency, dtype=np.float64)
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def upsample(saliency: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear upsampling of a map [h, w] to ``size`` (H, W)."""
    return F.interpolate(saliency[None, None].float(), size=size, mode="bilinear", align_corners=False)[0, 0]


def _draw(fig, ax, image: np.ndarray, saliency: torch.Tensor, cmap: str, diverging_cmap: str, alpha: float):
    """One overlay on ``ax`` with its colour bar; returns the colour bar."""
    saliency = torch.as_tensor(saliency).detach().float().cpu()
    heat = upsample(saliency, image.shape[:2]).numpy()
    ax.imshow(image)
    if (saliency < 0).any():
        shown = ax.imshow(heat / np.abs(heat).max(), cmap=diverging_cmap, alpha=alpha, vmin=-1.0, vmax=1.0)
        label = f"relevance / max |relevance| ({diverging_cmap}, centred at 0)"
    else:
        shown = ax.imshow(normalise(heat), cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
        label = f"relevance, min-max scaled ({cmap})"
    ax.set_axis_off()
    bar = fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label(label, fontsize=7)
    bar.ax.tick_params(labelsize=7)
    return bar


def save_overlay(path: str | Path, image: np.ndarray, saliency: torch.Tensor, *, title: str = "",
                 cmap: str = "jet", diverging_cmap: str = "bwr", alpha: float = 0.5):
    """Write one heatmap over its image, with a colour bar, as PNG; returns the figure (shown inline in notebooks).

    ``cmap`` draws non-negative maps (min-max scaled), ``diverging_cmap`` signed ones (see the module docstring).
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
              cmap: str = "jet", diverging_cmap: str = "bwr", alpha: float = 0.5, columns: int = 6):
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


def line_plot(curves: dict[str, list[float]], styles: dict[str, dict] | None = None, *, title: str = "", xlabel: str = "",
              ylabel: str = "", ticks: list[str] | None = None, reference: float | None = None,
              size: tuple[float, float] = (7.6, 3.9), image_format: str = "png", legend: bool = True,
              ids: dict[str, str] | None = None) -> bytes:
    """One line per curve as PNG or SVG bytes, drawn with the Agg canvas (the global backend is left alone).

    Args:
        curves: name -> values; x runs over [0, 1], or over the named ``ticks`` (one per point).
        styles: name -> keyword arguments of ``Axes.plot`` (``color``, ``linestyle``, ``linewidth``,
            ``zorder`` ...); matplotlib's cycle for curves without one.
        reference: a dotted horizontal line at this value.
        image_format: ``"png"`` or ``"svg"`` (text kept as text).
        legend: draw the legend beside the axes.
        ids: in an SVG, the ``id`` of each curve's line (so a page can show and hide it).
    """
    import io

    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, curve in curves.items():
        where = np.linspace(0, 1, len(curve)) if ticks is None else np.arange(len(curve))
        (line,) = axes.plot(where, curve, label=name, marker="." if len(curve) <= 12 else None,
                            **{"linewidth": 1.4, **(styles or {}).get(name, {})})
        if ids and name in ids:
            line.set_gid(ids[name])
    if reference is not None:
        axes.axhline(reference, color="#cf222e", linestyle=":", linewidth=1)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if ticks is not None:
        axes.set_xticks(range(len(ticks)), ticks, rotation=40, ha="right", fontsize=8)
    axes.grid(alpha=0.3)
    if legend:
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, ncol=1 if len(curves) <= 16 else 2)
    figure.tight_layout()
    buffer = io.BytesIO()
    metadata = {"Date": None, "Creator": None, "Format": None, "Type": None} if image_format == "svg" else None
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format=image_format, dpi=110, metadata=metadata)
    return buffer.getvalue()

