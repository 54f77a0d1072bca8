"""Overlays and grids (vitexplain.viz): colour maps by sign, labels that name them, no global matplotlib state."""
import numpy as np
import pytest
import torch
from PIL import Image

from vitexplain.viz import colours, map_scale, save_grid, save_overlay

IMAGE = np.full((16, 16, 3), 128, dtype=np.uint8)
#: ColorBrewer RdBu (blue, centre, red) and viridis' ends, as published (matplotlib's tables hold the same)
RDBU_BLUE, RDBU_CENTRE, RDBU_RED = (5, 48, 97), (247, 247, 247), (103, 0, 31)
VIRIDIS_LOW, VIRIDIS_HIGH = (68, 1, 84), (253, 231, 37)


def plain_percentile(values, q: float = 99) -> float:
    """numpy's default percentile written out: linear between the order statistics around rank q/100 * (n - 1)."""
    ordered = sorted(float(v) for v in np.ravel(values))
    rank = q / 100 * (len(ordered) - 1)
    below = int(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (rank - below) * (ordered[above] - ordered[below])


def test_the_robust_scale_is_the_99th_percentile_it_states():
    rng = np.random.default_rng(3)
    signed = rng.normal(0, 1, (14, 14))
    signed[0, 0] = 400.0                                               # one outlier: under ±max every other value is ~0
    scale = map_scale(signed)
    end = plain_percentile(np.abs(signed), 99)
    assert scale.signed and scale.percentile == 99
    assert scale.high == pytest.approx(end) and scale.low == pytest.approx(-end) and end < 5
    assert "99th percentile of |v|" in scale.rule and "0 at the centre" in scale.rule
    assert scale.saturated == (False, True)

    sequential = rng.random((14, 14)) + 2.0
    sequential[5, 5] = 1e3
    scale = map_scale(torch.tensor(sequential))                        # tensors as arrays
    assert not scale.signed and scale.low == sequential.min()
    assert scale.high == pytest.approx(plain_percentile(sequential, 99)) and scale.high < 4
    assert "99th percentile" in scale.rule and "minimum" in scale.rule

    # more than 99 % of the values are 0 (signed) or the minimum: the extreme is the end, and the rule says so
    sparse = np.zeros((20, 20))
    sparse[3, 4], sparse[7, 7] = -2.0, 0.5
    assert (map_scale(sparse).high, map_scale(sparse).percentile) == (2.0, 100.0)
    assert "max |v|" in map_scale(sparse).rule
    flat = np.ones((20, 20))
    flat[0, 0] = 3.0
    assert (map_scale(flat).low, map_scale(flat).high, map_scale(flat).rule) == (1.0, 3.0, "minimum to maximum")
    # a method's maps drawn alike: signed forced on a map without a negative value
    assert map_scale(flat, signed=True).high == pytest.approx(plain_percentile(flat, 99))


def test_colours_are_the_published_palettes_at_the_scale_positions():
    scale = map_scale(np.array([[-4.0, 0.0], [2.0, 4.0]]))
    drawn = colours(np.array([-9.0, -scale.high, 0.0, scale.high / 2, 9.0]), scale)
    assert np.abs(drawn[[0, 1]].astype(int) - RDBU_BLUE).max() <= 1           # the end, and beyond it: saturated
    assert np.abs(drawn[2].astype(int) - RDBU_CENTRE).max() <= 1              # 0 is the centre colour
    assert np.abs(drawn[4].astype(int) - RDBU_RED).max() <= 1
    assert drawn[3][0] > drawn[3][2] and not np.array_equal(drawn[3], drawn[4])   # half way: red, not saturated
    scale = map_scale(np.array([[1.0, 2.0], [3.0, 5.0]]))
    drawn = colours(np.array([1.0, 5.0, 0.0]), scale)
    assert np.abs(drawn[[0, 2]].astype(int) - VIRIDIS_LOW).max() <= 1
    assert np.abs(drawn[1].astype(int) - VIRIDIS_HIGH).max() <= 1


def _colour_bars(fig) -> list:
    """The colour bars of a figure, in the order their axes were drawn."""
    return [ax._colorbar for ax in fig.axes if hasattr(ax, "_colorbar")]


def test_an_overlay_keeps_typical_values_visible_beside_an_outlier(tmp_path):
    saliency = torch.zeros(16, 16)                                      # at image size: no upsampling
    saliency[:8, :8], saliency[:8, 8:], saliency[15, 15] = -1.0, 1.0, 100.0   # ±max would draw ±1 near the centre
    fig = save_overlay(tmp_path / "signed.png", IMAGE, saliency, title="lrp")
    drawn = fig.axes[0].get_images()[0].get_array()                   # the image with the map blended over it
    assert len(fig.axes[0].get_images()) == 1 and drawn.shape == (16, 16, 3)
    end = plain_percentile(np.abs(saliency.numpy()), 99)
    assert end == 1.0
    bar = _colour_bars(fig)[0]
    assert bar.norm.vmin == -end and bar.norm.vmax == end and bar.extend == "max"
    assert bar.cmap.name == "RdBu_r" and "99th pct of |v|" in bar.ax.get_ylabel()

    def half_blend(colour):
        """The overlay's pixel where the heatmap has ``colour``: half image, half colour, in [0, 1]."""
        return (0.5 * IMAGE[0, 0] + 0.5 * np.asarray(colour)) / 255

    for (y, x), colour in [((0, 0), RDBU_BLUE), ((0, 15), RDBU_RED), ((15, 15), RDBU_RED), ((12, 3), RDBU_CENTRE)]:
        assert np.abs(drawn[y, x] - half_blend(colour)).max() < 0.005, (y, x)
    with Image.open(tmp_path / "signed.png") as png:
        assert png.size[0] > 200

    fig = save_overlay(tmp_path / "positive.png", IMAGE, torch.tensor([[2.0, 3.0], [4.0, 6.0]]), cmap="inferno")
    bar = _colour_bars(fig)[0]
    assert bar.cmap.name == "inferno" and bar.norm.vmin == 2.0
    assert bar.norm.vmax == pytest.approx(plain_percentile([2, 3, 4, 6], 99))
    assert bar.ax.get_ylabel() == "inferno: min to 99th pct"


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
    assert [bar.cmap.name for bar in _colour_bars(fig)][:2] == ["RdBu_r", "viridis"]     # each map by its own sign
    # the band between the figure title and the first row's titles (a dozen pixels; 62 before constrained layout)
    top, title_band = _blank_runs(tmp_path / "grid.png")[:2]
    assert top[0] == 0 and title_band[1] < 25, title_band


def test_min_max_and_resize_against_plain_arithmetic():
    """vitexplain.maps: per map (m - min) / (max - min), a constant map the caller's value; bilinear resize."""
    import torch
    import torch.nn.functional as F

    from vitexplain.maps import min_max, resize

    maps = torch.tensor([[[1.0, 3.0], [2.0, 5.0]], [[4.0, 4.0], [4.0, 4.0]]])
    expected = torch.tensor([[0.0, 0.5], [0.25, 1.0]])
    torch.testing.assert_close(min_max(maps, constant=0.0)[0], expected)
    assert (min_max(maps, constant=0.0)[1] == 0).all() and min_max(maps, constant=float("nan"))[1].isnan().all()
    stacked = maps[None].repeat(3, 1, 1, 1)                                   # any leading dimensions
    torch.testing.assert_close(min_max(stacked, constant=0.0)[2, 0], expected)
    plain = F.interpolate(maps[:, None], size=(6, 4), mode="bilinear", align_corners=False)[:, 0]
    torch.testing.assert_close(resize(stacked, (6, 4))[1], plain)
    assert resize(maps, (2, 2)) is maps
