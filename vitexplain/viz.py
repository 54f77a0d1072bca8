"""Heatmap overlays with colour bars, and side-by-side grids of several methods."""
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


def _draw(ax, image: np.ndarray, saliency: torch.Tensor, cmap: str, alpha: float):
    import matplotlib.pyplot as plt

    heat = normalise(upsample(torch.as_tensor(saliency).cpu(), image.shape[:2]))
    ax.imshow(image)
    shown = ax.imshow(heat, cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
    ax.set_axis_off()
    return plt.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)


def save_overlay(path: str | Path, image: np.ndarray, saliency: torch.Tensor, *, title: str = "",
                 cmap: str = "jet", alpha: float = 0.5) -> None:
    """Write one heatmap over its image, with a colour bar (relevance scaled to [0, 1]), as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.4, 4))
    _draw(ax, image, saliency, cmap, alpha).set_label("relevance (min-max scaled)")
    if title:
        ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def save_grid(path: str | Path, image: np.ndarray, maps: dict[str, torch.Tensor], *, title: str = "",
              cmap: str = "jet", alpha: float = 0.5, columns: int = 6) -> None:
    """Write the image and one overlay per method side by side, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 + len(maps)
    cols = min(columns, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows + 0.5), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("input", fontsize=9)
    for ax, (name, saliency) in zip(axes.flat[1:], maps.items()):
        _draw(ax, image, saliency, cmap, alpha)
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


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
