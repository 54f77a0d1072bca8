"""Notebook helpers: vitexplain.plot (a grid of maps over images, one colour convention with the PNGs) and
the explorer page shown inline (ExplorerPage) with its items made from a batch (explorer_items).

Expected colours are the published palettes' ends and centre (ColorBrewer RdBu, viridis), written out here.
"""
from __future__ import annotations

import html
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from PIL import Image

import vitexplain
from vitexplain import viz
from vitexplain.explorer import ExplorerItem, ExplorerPage, explorer_html, explorer_items, write_explorer

RDBU_BLUE, RDBU_CENTRE, RDBU_RED = (5, 48, 97), (247, 247, 247), (103, 0, 31)
VIRIDIS_LOW, VIRIDIS_HIGH = (68, 1, 84), (253, 231, 37)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)          # timm's ImageNet normalisation
SIZE = 32


def _pictures(count: int = 3, seed: int = 0) -> torch.Tensor:
    """Images in [0, 1], [B, 3, SIZE, SIZE]."""
    return torch.rand(count, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def _normalised(pictures: torch.Tensor) -> torch.Tensor:
    return (pictures - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


def _maps(count: int = 3) -> dict[str, torch.Tensor]:
    """A non-negative token map [B, 4, 4], and a signed one whose second image (if any) has no negative value."""
    generator = torch.Generator().manual_seed(1)
    positive = torch.rand(count, 4, 4, generator=generator)
    signed = torch.randn(count, 4, 4, generator=generator)
    signed[0, 0, 0] = -1.0
    if count > 1:
        signed[1] = signed[1].abs() + 0.1
    return {"gae": positive, "lrp": signed}


def _panels(fig) -> dict[tuple[int, int], object]:
    """The figure's panels (not its colour bars) by (row, column) of the grid."""
    found = {}
    for ax in fig.axes:
        if hasattr(ax, "_colorbar") or not ax.get_subplotspec():
            continue
        spec = ax.get_subplotspec()
        found[spec.rowspan.start, spec.colspan.start] = ax
    return found


def _colour_bars(fig) -> dict[tuple[int, int], object]:
    """The colour bars by the (row, column) of their map, for grids whose first column is the input: they
    are drawn (and their axes added to the figure) panel by panel, row by row."""
    bars = [ax._colorbar for ax in fig.axes if hasattr(ax, "_colorbar")]
    overlays = sorted(key for key in _panels(fig) if key[1] > 0)
    assert len(bars) == len(overlays)
    return dict(zip(overlays, bars))


def _drawn(ax) -> np.ndarray:
    images = ax.get_images()
    assert len(images) == 1
    return np.asarray(images[0].get_array())


# ---------- the grid: rows, columns, titles ----------

def test_one_row_per_image_then_the_input_and_one_column_per_method():
    pictures, maps = _pictures(), _maps()
    fig = vitexplain.plot(pictures, maps, titles=["cat", "dog", "owl"])
    panels = _panels(fig)
    assert sorted(panels) == [(r, c) for r in range(3) for c in range(3)]
    assert [panels[0, c].get_title() for c in range(3)] == ["input", "gae", "lrp"]
    assert all(panels[r, c].get_title() == "" for r in (1, 2) for c in range(3))        # headers on the first row
    assert [panels[r, 0].get_ylabel() for r in range(3)] == ["cat", "dog", "owl"]
    assert len(fig.axes) == 9 + 6                                                        # a colour bar per map
    np.testing.assert_allclose(_drawn(panels[1, 0]), pictures[1].permute(1, 2, 0).numpy(), atol=1e-6)


def test_methods_as_rows_transposes_the_grid_and_a_single_tensor_is_one_method():
    pictures, maps = _pictures(2), _maps(2)
    fig = vitexplain.plot(pictures, maps, titles=["cat", "dog"], rows="methods", colorbar=False)
    panels = _panels(fig)
    assert sorted(panels) == [(r, c) for r in range(3) for c in range(2)] and len(fig.axes) == 6
    assert [panels[0, c].get_title() for c in range(2)] == ["cat", "dog"]
    assert [panels[r, 0].get_ylabel() for r in range(3)] == ["input", "gae", "lrp"]
    np.testing.assert_allclose(_drawn(panels[2, 1]), viz.overlay(pictures[1].permute(1, 2, 0).numpy(), maps["lrp"][1],
                                                                 signed=True))

    fig = vitexplain.plot(pictures, maps["gae"], show_input=False)                      # [B, h, w]: one method
    panels = _panels(fig)
    assert sorted(panels) == [(0, 0), (1, 0)] and panels[0, 0].get_title() == "map"


def test_pictures_as_pil_images_and_arrays_of_any_size():
    rng = np.random.default_rng(0)
    first = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    second = rng.random((12, 12, 3))
    maps = {"gae": [torch.rand(4, 4), torch.rand(3, 3)]}
    fig = vitexplain.plot([Image.fromarray(first), second], maps)
    panels = _panels(fig)
    np.testing.assert_array_equal(_drawn(panels[0, 0]), first)
    assert _drawn(panels[0, 1]).shape == (20, 30, 3) and _drawn(panels[1, 1]).shape == (12, 12, 3)   # upsampled
    np.testing.assert_allclose(_drawn(panels[1, 1]), viz.overlay(second, maps["gae"][1]))
    one = vitexplain.plot(first, torch.rand(4, 4))                       # one image, one [h, w] map
    assert sorted(_panels(one)) == [(0, 0), (0, 1)]


# ---------- the colour convention ----------

def test_each_cell_is_the_overlay_of_its_map_with_the_methods_sign():
    pictures, maps = _pictures(), _maps()
    fig = vitexplain.plot(_normalised(pictures), maps, mean=MEAN, std=STD)
    panels = _panels(fig)
    for i in range(3):
        picture = pictures[i].permute(1, 2, 0).numpy()
        np.testing.assert_allclose(_drawn(panels[i, 0]), picture, atol=1e-6)             # un-normalised
        for c, method in ((1, "gae"), (2, "lrp")):
            expected = viz.overlay(np.clip(picture.astype(np.float64), 0, 1), maps[method][i],
                                   signed=method == "lrp")
            np.testing.assert_allclose(_drawn(panels[i, c]), expected, atol=1e-5)
    # the signed method's map without a negative value is drawn signed too (a method's maps alike), on its own scale
    bars = _colour_bars(fig)
    assert {bars[r, 1].cmap.name for r in range(3)} == {"viridis"}
    assert {bars[r, 2].cmap.name for r in range(3)} == {"RdBu_r"}
    end = float(np.percentile(maps["lrp"][1].abs().numpy(), 99))
    assert (bars[1, 2].norm.vmin, bars[1, 2].norm.vmax) == pytest.approx((-end, end))
    assert "99th pct of |v|" in bars[1, 2].ax.get_ylabel()
    # signed=False forces the sequential palette on every map
    forced = vitexplain.plot(pictures, maps, signed=False)
    assert {bar.cmap.name for bar in _colour_bars(forced).values()} == {"viridis"}


def test_rendered_pixels_are_the_published_palettes_blended_over_the_image():
    """Independent of viz.overlay: render with Agg and read the middle of each quadrant of a pixel-level map."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    grey = np.full((SIZE, SIZE, 3), 128, dtype=np.uint8)
    signed = torch.zeros(SIZE, SIZE)
    signed[:, :SIZE // 2], signed[:, SIZE // 2:], signed[SIZE // 2:, SIZE // 2:] = -1.0, 1.0, 0.0
    sequential = torch.zeros(SIZE, SIZE)
    sequential[:, SIZE // 2:] = 1.0
    fig = vitexplain.plot([grey], {"lrp": signed[None], "gae": sequential[None]}, colorbar=False, figsize=(6, 2))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    rendered = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    panels = _panels(fig)

    def at(ax, fx: float, fy: float) -> np.ndarray:
        """The rendered colour at a fraction of the panel's width, and of its height from the top."""
        box = ax.get_window_extent()
        return rendered[int(rendered.shape[0] - (box.y1 - fy * box.height)), int(box.x0 + fx * box.width)]

    def blend(colour) -> np.ndarray:
        return np.round(0.5 * 128 + 0.5 * np.asarray(colour))

    for (fx, fy), colour in [((0.25, 0.5), RDBU_BLUE), ((0.75, 0.25), RDBU_RED), ((0.75, 0.75), RDBU_CENTRE)]:
        assert np.abs(at(panels[0, 1], fx, fy) - blend(colour)).max() <= 2, (fx, fy)
    assert np.abs(at(panels[0, 2], 0.25, 0.5) - blend(VIRIDIS_LOW)).max() <= 2
    assert np.abs(at(panels[0, 2], 0.75, 0.5) - blend(VIRIDIS_HIGH)).max() <= 2
    assert np.abs(at(panels[0, 0], 0.5, 0.5) - 128).max() <= 1


def test_save_grid_draws_what_plot_draws_for_one_image(tmp_path):
    picture = (_pictures(1)[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    maps = {name: values[0] for name, values in _maps(1).items()}
    saved = viz.save_grid(tmp_path / "grid.png", picture, maps, title="seven")
    plotted = vitexplain.plot([picture], {name: values[None] for name, values in maps.items()})
    for c in range(3):
        np.testing.assert_array_equal(_drawn(_panels(saved)[0, c]), _drawn(_panels(plotted)[0, c]))
    assert [_panels(saved)[0, c].get_title() for c in range(3)] == ["input", "gae", "lrp"]


def test_figures_stay_out_of_pyplot_and_show_themselves_in_notebooks():
    from matplotlib import _pylab_helpers
    from matplotlib.figure import Figure

    before = _pylab_helpers.Gcf.get_num_fig_managers()
    fig = vitexplain.plot(_pictures(1), _maps(1))
    assert isinstance(fig, Figure) and _pylab_helpers.Gcf.get_num_fig_managers() == before
    assert fig._repr_png_().startswith(b"\x89PNG\r\n\x1a\n")


# ---------- inputs that do not fit ----------

@pytest.mark.parametrize(("images", "maps", "options", "message"), [
    (_pictures(2), _maps(3), {}, "maps of 'gae': 3 maps for 2 images"),
    (_pictures(2), torch.rand(2, 1, 4, 4), {}, r"maps must be \[B, h, w\] .*got shape \[2, 1, 4, 4\]"),
    (_pictures(2), {"gae": [torch.rand(4, 4), torch.rand(1, 4, 4)]}, {}, "the map of image 1 must be 2-D"),
    (_pictures(2), {}, {}, "maps is empty"),
    (_pictures(2), {"gae": torch.full((2, 4, 4), float("nan"))}, {}, "non-finite"),
    (torch.rand(2, 4, SIZE, SIZE), _maps(2), {}, r"image 0 must be \[H, W, 3\] or \[3, H, W\]; got shape \[4, 32,"),
    (torch.rand(2, SIZE, SIZE), _maps(2), {}, r"images must be a batch \[B, 3, H, W\]"),
    (_normalised(_pictures(2)), _maps(2), {}, r"image 0 holds values .* outside \[0, 1\]: it looks preprocessed"),
    (np.random.default_rng(0).random((SIZE, SIZE, 3)) * 255, torch.rand(4, 4), {}, "float pictures must be in"),
    (_pictures(2), _maps(2), {"titles": ["a"]}, "titles: 1 titles for 2 images"),
    (_pictures(2), _maps(2), {"rows": "columns"}, "rows must be 'images' or 'methods'"),
    (_pictures(2), _maps(2), {"mean": MEAN}, "mean and std go together"),
    (_pictures(2), _maps(2), {"config": {"mean": MEAN, "std": STD}, "std": STD}, "mean and std, or config"),
    (_pictures(2), _maps(2), {"config": {"input_size": (3, 8, 8)}}, "config has no mean or std"),
])
def test_inputs_that_do_not_fit_are_refused_in_one_line(images, maps, options, message):
    with pytest.raises(ValueError, match=message) as caught:
        vitexplain.plot(images, maps, **options)
    assert "\n" not in str(caught.value)


def test_a_data_config_un_normalises_like_mean_and_std():
    pictures = _pictures(1)
    fig = vitexplain.plot(_normalised(pictures), _maps(1), config={"mean": MEAN, "std": STD, "input_size": (3, 32, 32)})
    np.testing.assert_allclose(_drawn(_panels(fig)[0, 0]), pictures[0].permute(1, 2, 0).numpy(), atol=1e-6)


# ---------- the explorer in a notebook ----------

class _Iframes(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "iframe":
            self.found.append(dict(attrs))


def _items() -> list[ExplorerItem]:
    rng = np.random.default_rng(5)
    maps = {"gae": rng.random((4, 4)), "lrp": rng.uniform(-1, 1, (4, 4))}
    return [ExplorerItem(name="a <b> & 'c'", image=rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), maps=maps,
                         top5=[("seven", 0.9), ("one", 0.1)], target="seven", grid=(4, 4))]


def test_the_page_shows_inline_in_an_iframe_whose_srcdoc_is_the_page(tmp_path):
    items = _items()
    page = vitexplain.ExplorerPage(items, title="digits <test>", height=600)
    shown = page._repr_html_()
    parser = _Iframes()
    parser.feed(shown)
    assert len(parser.found) == 1 and shown.startswith("<iframe") and shown.endswith("</iframe>")
    iframe = parser.found[0]
    assert iframe["srcdoc"] == explorer_html(items, title="digits <test>") == page.html   # the parser unescapes
    assert html.unescape(shown.split('srcdoc="', 1)[1].split('"', 1)[0]) == page.html    # no raw quote cuts it short
    assert "height: 600px" in iframe["style"] and iframe["sandbox"] == "allow-scripts"
    saved = page.save(tmp_path / "sub" / "page.html")
    assert saved.read_text(encoding="utf-8") == page.html
    written = write_explorer(tmp_path / "written.html", items, title="digits <test>")
    assert written.read_text(encoding="utf-8") == page.html
    assert repr(page) == "ExplorerPage('digits <test>': 1 image)"
    with pytest.raises(ValueError, match="height must be a positive number"):
        ExplorerPage(items, height=0)
    with pytest.raises(ValueError, match="at least one item"):
        ExplorerPage([])


def test_explorer_items_from_a_preprocessed_batch_and_its_maps():
    pictures, maps = _pictures(2), _maps(2)
    maps["rise"] = torch.rand(2, SIZE, SIZE)                                     # pixel-level
    probabilities = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    items = explorer_items(_normalised(pictures), maps, config={"mean": MEAN, "std": STD}, probabilities=probabilities,
                           class_names=["zero", "one", "two"], options={"gae": {"start_layer": 1}})
    assert [item.name for item in items] == ["image 0", "image 1"]
    expected = (pictures[0].permute(1, 2, 0).numpy() * 255).round()
    assert items[0].image.dtype == np.uint8 and np.abs(items[0].image - expected).max() <= 1
    assert items[0].top5 == [("one", pytest.approx(0.6)), ("two", pytest.approx(0.3)), ("zero", pytest.approx(0.1))]
    assert [item.target for item in items] == ["one", "zero"]                   # the prediction, explain's default
    assert items[1].grid == (4, 4) and list(items[1].maps) == ["gae", "lrp", "rise"]
    np.testing.assert_array_equal(items[1].maps["lrp"], maps["lrp"][1].double().numpy())
    assert items[0].options == {"gae": {"start_layer": 1}}
    assert '"label":"rise","kind":"pixel"' in explorer_html(items)           # the page takes them as they are

    named = explorer_items([Image.fromarray(items[0].image)], maps["gae"][:1], names=["seven.png"], targets=2,
                           class_names=["zero", "one", "two"])
    assert (named[0].name, named[0].target, named[0].top5, list(named[0].maps)) == ("seven.png", "two", [], ["map"])
    with pytest.raises(ValueError, match="class_names: 2 names for 3 classes"):
        explorer_items(pictures, maps, probabilities=probabilities, class_names=["zero", "one"])
    with pytest.raises(ValueError, match=r"probabilities must be in \[0, 1\]"):
        explorer_items(pictures, maps, probabilities=probabilities * 10)
    with pytest.raises(ValueError, match="targets: 3 targets for 2 images"):
        explorer_items(pictures, maps, targets=[0, 1, 2])


def test_the_inline_page_runs_in_its_sandboxed_iframe(tmp_path):
    """What a notebook shows: the page loads, draws its maps (canvas reads of data: images work in the
    sandbox's opaque origin) and logs no error, inside the iframe of _repr_html_."""
    from selenium.webdriver.support.ui import WebDriverWait

    from chromium import start_chromium

    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><body><h1>cell output</h1>"
                        f"{ExplorerPage(_items())._repr_html_()}</body></html>", encoding="utf-8")
    driver = start_chromium(tmp_path / "profile", console=True)
    try:
        driver.get(notebook.as_uri())
        driver.switch_to.frame(driver.find_element("tag name", "iframe"))
        WebDriverWait(driver, 20).until(lambda d: d.execute_script("return document.documentElement.dataset.ready"))
        assert driver.execute_script("return document.documentElement.dataset.ready") == "true"
        inked = driver.execute_script("""
            const canvas = document.querySelector('canvas.map');
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let inked = 0;
            for (let i = 0; i < data.length; i += 4) {
              inked += data[i + 3] > 0 && data[i] + data[i + 1] + data[i + 2] > 0;
            }
            return inked / (data.length / 4);""")
        assert inked > 0.99
        assert [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"] == []
    finally:
        driver.quit()
