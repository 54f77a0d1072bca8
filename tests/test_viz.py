"""Overlays and grids (vitexplain.viz): colour maps by sign, labels that name them, no global matplotlib state."""
import numpy as np
import torch
from PIL import Image

from vitexplain.viz import save_grid, save_overlay

IMAGE = np.full((16, 16, 3), 128, dtype=np.uint8)


def _heat(ax):
    """The overlay layer of an axes (the second image drawn on it)."""
    return ax.get_images()[1]


def test_signed_maps_are_centred_at_zero_and_others_min_max_scaled(tmp_path):
    signed = torch.tensor([[-2.0, 1.0], [0.5, 0.0]])
    fig = save_overlay(tmp_path / "signed.png", IMAGE, signed, title="lrp")
    heat = _heat(fig.axes[0])
    assert heat.get_cmap().name == "bwr" and heat.get_clim() == (-1.0, 1.0)
    values = heat.get_array()
    assert values.min() < 0 < values.max() and np.abs(values).max() <= 1.0 + 1e-6
    # the upsampled map divided by its largest magnitude: zero stays zero, signs stay
    np.testing.assert_allclose(values[0, 0], -1.0, atol=0.02)
    assert "bwr" in fig.axes[1].get_ylabel() and "centred at 0" in fig.axes[1].get_ylabel()

    positive = torch.tensor([[2.0, 3.0], [4.0, 6.0]])
    fig = save_overlay(tmp_path / "positive.png", IMAGE, positive, cmap="viridis")
    heat = _heat(fig.axes[0])
    assert heat.get_cmap().name == "viridis" and heat.get_clim() == (0.0, 1.0)
    assert heat.get_array().min() == 0.0 and heat.get_array().max() == 1.0
    assert "viridis" in fig.axes[1].get_ylabel() and "min-max" in fig.axes[1].get_ylabel()
    with Image.open(tmp_path / "positive.png") as png:
        assert png.size[0] > 200


def _blank_runs(png_path) -> list[tuple[int, int]]:
    """(first row, height) of each band of blank (near-white) rows of a PNG, top to bottom."""
    with Image.open(png_path) as png:
        inked = (np.asarray(png.convert("L")) < 250).any(axis=1)
    runs, start = [], None
    for y, ink in enumerate(inked):
        if not ink and start is None:
            start = y
        elif ink and start is not None:
            runs.append((start, y - start))
            start = None
    return runs


def test_a_grid_draws_each_map_by_its_own_sign_and_titles_without_a_gap(tmp_path):
    maps = {"lrp": torch.tensor([[-1.0, 1.0], [0.0, 0.0]]), "gae": torch.tensor([[0.0, 1.0], [2.0, 3.0]])}
    maps.update({f"method{i}": torch.rand(2, 2, generator=torch.Generator().manual_seed(i)) for i in range(11)})
    fig = save_grid(tmp_path / "grid.png", IMAGE, maps, title="7 (p=0.002)")
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(titled) == ["input", *maps]
    assert _heat(titled["lrp"]).get_cmap().name == "bwr" and _heat(titled["gae"]).get_cmap().name == "jet"
    # the band between the figure title and the first row's titles (a dozen pixels; 62 before constrained layout)
    top, title_band = _blank_runs(tmp_path / "grid.png")[:2]
    assert top[0] == 0 and title_band[1] < 25, title_band
