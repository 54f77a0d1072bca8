"""The explorer page: driven in headless Chromium, its controls change what is shown.

Expected colours are the published palettes' end and centre colours (ColorBrewer RdBu, viridis,
bwr), written out here; expected values are the numpy maps the test builds. Needs Debian's
``chromium`` and ``chromium-driver`` and the ``selenium`` wheel (the test fails, never skips, without them).
"""
from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from PIL import Image

from vitexplain.explorer import ExplorerItem, explorer_html, write_explorer

from chromium import start_chromium
from test_viz import plain_percentile

SIZE, PATCH = 64, 16
GRID = (SIZE // PATCH, SIZE // PATCH)
SINGLE_SCALE = 448 // SIZE            # the page shows one 64 px image at 7 CSS pixels per image pixel
VIRIDIS_LOW, VIRIDIS_HIGH = (68, 1, 84), (253, 231, 37)
RDBU_BLUE, RDBU_CENTRE, RDBU_RED = (5, 48, 97), (247, 247, 247), (103, 0, 31)      # ColorBrewer RdBu: ends, centre
BWR_CENTRE = (255, 255, 255)
TOP5 = [("seven", 0.61), ("one", 0.2), ("nine", 0.1), ("four", 0.05), ("two", 0.02)]


def _maps(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A non-negative token map, a signed token map with a 0, a pixel-level map and a coarser map."""
    tokens = rng.random(GRID) + 0.1
    tokens[0, 3], tokens[2, 2] = 0.05, 2.5                        # the minimum and the maximum
    signed = rng.uniform(-0.5, 1, GRID)
    signed[1, 2], signed[0, 0], signed[3, 3] = 0.0, 1.5, -0.6     # 0, the maximum, the minimum (|min| < max)
    return {"tokens": tokens.astype(np.float32), "signed": signed.astype(np.float32),
            "pixels": rng.random((SIZE, SIZE)).astype(np.float32), "coarse": rng.random((2, 2))}


@pytest.fixture(scope="module")
def items() -> list[ExplorerItem]:
    rng = np.random.default_rng(7)
    first = ExplorerItem(
        name="first.png", image=rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8), maps=_maps(rng),
        options={"tokens": {"rule": "epsilon", "epsilon": 1e-6, "layers": [1, 2]}, "signed": {"seed": 3}},
        top5=TOP5, target="one", grid=GRID)
    second_maps = _maps(rng)
    second = ExplorerItem(
        name="second.png", image=rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8),
        maps={"signed": second_maps["signed"], "tokens": second_maps["tokens"]},
        top5=[("two", 0.9), ("seven", 0.05)], target="two", grid=GRID)
    return [first, second]


@pytest.fixture(scope="module")
def page(items, tmp_path_factory):
    return write_explorer(tmp_path_factory.mktemp("explorer") / "sub" / "explorer.html", items, title="digits <test>")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("profile"), console=True)
    yield driver
    driver.quit()


@pytest.fixture
def driver(browser, page):
    """The page freshly loaded; afterwards, the browser console must hold no error (a CSP block would be one)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page.as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    assert browser.execute_script("return document.documentElement.dataset.ready") == "true"
    yield browser
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def _pixels(driver, method: str) -> np.ndarray:
    """The RGB pixels of the canvas that shows ``method``, [H, W, 3]."""
    flat, width, height = driver.execute_script(
        "const c = document.querySelector(`canvas.map[data-method='${arguments[0]}']`);"
        "return [Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data), c.width, c.height];",
        method)
    return np.array(flat, dtype=np.uint8).reshape(height, width, 4)[..., :3]


def _shown(driver) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('canvas.map')).map(c => c.dataset.method);")


def _select(driver, element_id: str, text: str):
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_visible_text(text)


def _opacity(driver, percent: int):
    from selenium.webdriver.common.keys import Keys

    driver.find_element("id", "opacity").send_keys(Keys.HOME + Keys.ARROW_RIGHT * percent)


def _hover(driver, method: str, x: float, y: float):
    """Move the mouse to CSS pixel (x, y) from the top-left corner of ``method``'s canvas."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("css selector", f"canvas.map[data-method='{method}']")
    rect = canvas.rect
    ActionChains(driver).move_to_element_with_offset(
        canvas, int(x - rect["width"] / 2), int(y - rect["height"] / 2)).perform()


def _readouts(driver) -> dict[str, str]:
    return driver.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('figure.panel')).map(f => "
        "[f.querySelector('canvas.map').dataset.method, f.querySelector('output.readout').textContent]));")


def _value(readout: str) -> float:
    return float(readout.rsplit(":", 1)[1])


def _token_block(pixels: np.ndarray, row: int, col: int) -> np.ndarray:
    return pixels[row * PATCH:(row + 1) * PATCH, col * PATCH:(col + 1) * PATCH].reshape(-1, 3)


# ---------- the page as a file ----------

class _Urls(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.urls += [value for name, value in attrs if name in ("src", "href", "srcset", "action", "data") and value]


def test_the_page_is_one_self_contained_file(page):
    text = page.read_text(encoding="utf-8")
    for reference in ("http://", "https://", "//cdn", "url("):
        assert reference not in text
    parser = _Urls()
    parser.feed(text)
    assert parser.urls == []                           # images are data: URIs inside the embedded data
    scripts = [attrs for tag, attrs in parser.tags if tag == "script"]
    assert scripts == [{"type": "application/json", "id": "explorer-data"}, {}]     # data and code, both inline
    assert not any(tag == "link" for tag, _ in parser.tags)
    assert "default-src 'none'" in text                # the Content-Security-Policy forbids every fetch
    assert "<title>digits &lt;test&gt;</title>" in text


def test_nothing_is_fetched(driver):
    fetched = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('data:'));")
    assert fetched == []


def test_torch_tensors_give_the_same_page(items):
    first = items[0]
    as_tensors = ExplorerItem(first.name, torch.from_numpy(first.image),
                              {label: torch.from_numpy(np.asarray(m)) for label, m in first.maps.items()},
                              first.options, first.top5, first.target, first.grid)
    assert explorer_html([as_tensors]) == explorer_html([first])
    half = torch.from_numpy(first.maps["tokens"]).bfloat16()                   # numpy has no bfloat16
    assert explorer_html([_item(maps={"m": half})]) == explorer_html([_item(maps={"m": half.float().numpy()})])


# ---------- controls ----------

def test_switching_method_changes_the_canvas(driver):
    assert _shown(driver) == ["tokens"]
    before = _pixels(driver, "tokens")
    _select(driver, "method", "signed")
    assert _shown(driver) == ["signed"]
    assert (_pixels(driver, "signed") != before).any()


def test_opacity_blends_image_and_map(driver, items):
    _opacity(driver, 0)
    assert np.array_equal(_pixels(driver, "tokens"), items[0].image)
    _opacity(driver, 100)
    full = _pixels(driver, "tokens").astype(int)
    assert (full != items[0].image).any()
    _opacity(driver, 50)
    half = _pixels(driver, "tokens").astype(int)
    assert driver.find_element("id", "opacity-value").text == "50 %"
    assert np.abs(half - (items[0].image * 0.5 + full * 0.5)).max() <= 1


def test_switching_image_changes_the_canvas(driver, items):
    _opacity(driver, 0)
    _select(driver, "image", "second.png")
    assert np.array_equal(_pixels(driver, "tokens"), items[1].image)
    driver.find_element("css selector", "#thumbnails button[data-index='0']").click()
    assert np.array_equal(_pixels(driver, "tokens"), items[0].image)
    driver.find_element("tag name", "body").send_keys("n")            # keyboard: next image
    assert np.array_equal(_pixels(driver, "tokens"), items[1].image)
    assert "second.png" in driver.find_element("id", "prediction").text


def test_compare_mode_shows_one_canvas_per_method(driver, items):
    from selenium.webdriver.common.keys import Keys

    driver.find_element("id", "compare").click()
    assert _shown(driver) == list(items[0].maps)
    assert not driver.find_element("id", "method").is_displayed()
    box = driver.find_element("css selector", "#compare-boxes input[value='pixels']")
    box.send_keys(Keys.SPACE)                                          # keyboard: the box keeps the focus
    assert _shown(driver) == ["tokens", "signed", "coarse"]
    assert driver.switch_to.active_element == box and not box.is_selected()
    _select(driver, "image", "second.png")
    assert _shown(driver) == ["signed", "tokens"]
    driver.find_element("id", "compare-all").click()
    assert _shown(driver) == ["signed", "tokens"]
    driver.find_element("tag name", "body").send_keys("c")            # keyboard: back to one method
    assert len(_shown(driver)) == 1


def test_hover_reads_the_token_and_its_raw_value(driver, items):
    tokens = items[0].maps["tokens"]
    for row, col in [(2, 1), (0, 3), (2, 2), (3, 0)]:
        _hover(driver, "tokens", (col + 0.5) * PATCH * SINGLE_SCALE, (row + 0.5) * PATCH * SINGLE_SCALE)
        readout = _readouts(driver)["tokens"]
        assert readout.startswith(f"token (row {row}, col {col}): ")
        assert _value(readout) == pytest.approx(tokens[row, col], rel=1e-5, abs=2e-5 * np.abs(tokens).max())
    _select(driver, "method", "signed")
    _hover(driver, "signed", 2.5 * PATCH * SINGLE_SCALE, 1.5 * PATCH * SINGLE_SCALE)
    assert _readouts(driver)["signed"] == "token (row 1, col 2): 0"         # 0 is stored exactly


def test_hover_reads_the_pixel_of_a_pixel_level_map(driver, items):
    _select(driver, "method", "pixels")
    for y, x in [(37, 21), (0, 63), (50, 5)]:
        _hover(driver, "pixels", x * SINGLE_SCALE + 3, y * SINGLE_SCALE + 3)
        readout = _readouts(driver)["pixels"]
        assert readout.startswith(f"pixel (y {y}, x {x}): ")
        assert _value(readout) == pytest.approx(items[0].maps["pixels"][y, x], rel=1e-5, abs=2e-5)


def test_hover_in_compare_mode_reads_every_map_at_the_same_place(driver, items):
    driver.find_element("id", "compare").click()
    scale = driver.execute_script("return document.querySelector('canvas.map').clientWidth") / SIZE
    _hover(driver, "signed", 40.5 * scale, 20.5 * scale)                    # pixel (y 20, x 40): token (1, 2)
    readouts = _readouts(driver)
    maps = items[0].maps
    assert readouts["tokens"].startswith("token (row 1, col 2): ")
    assert _value(readouts["tokens"]) == pytest.approx(maps["tokens"][1, 2], rel=1e-5, abs=5e-5)
    assert readouts["pixels"].startswith("pixel (y 20, x 40): ")
    assert _value(readouts["pixels"]) == pytest.approx(maps["pixels"][20, 40], rel=1e-5, abs=2e-5)
    assert readouts["coarse"].startswith("cell (row 0, col 1) of 2×2: ")
    assert _value(readouts["coarse"]) == pytest.approx(maps["coarse"][0, 1], rel=1e-5, abs=2e-5)


def test_arrow_keys_move_over_the_tokens(driver, items):
    from selenium.webdriver.common.keys import Keys

    driver.find_element("css selector", "canvas.map").send_keys(Keys.ARROW_DOWN + Keys.ARROW_RIGHT * 2)
    readout = _readouts(driver)["tokens"]
    assert readout.startswith("token (row 1, col 2): ")
    assert _value(readout) == pytest.approx(items[0].maps["tokens"][1, 2], rel=1e-5, abs=5e-5)


# ---------- colour scales and interpolation ----------

def test_signed_maps_are_diverging_centred_at_zero_with_robust_ends(driver, items):
    _select(driver, "method", "signed")
    _opacity(driver, 100)
    pixels = _pixels(driver, "signed")
    for (row, col), colour in [((1, 2), RDBU_CENTRE), ((0, 0), RDBU_RED)]:              # 0; the maximum saturates
        assert np.abs(_token_block(pixels, row, col).astype(int) - colour).max() <= 1, (row, col)
    minimum = _token_block(pixels, 3, 3)[0].astype(int)                  # -0.6 of ±(about 1.4): blue, not the end
    assert minimum[2] > minimum[0] + 50 and (minimum > RDBU_BLUE).all()
    end = plain_percentile(np.abs(items[0].maps["signed"]))              # 16 values: between the 2 largest |v|
    assert 1.0 < end < 1.5
    ticks = driver.find_element("css selector", "figure.panel .ticks").text.split()
    assert ticks[0] == "-" + ticks[-1] and ticks[1] == "0" and float(ticks[-1]) == pytest.approx(end, rel=1e-3)
    assert len(ticks) == 4 and ticks[2] == "≥"                            # the maximum, beyond the end, saturates
    scale = driver.find_element("css selector", "figure.panel .scale").text
    assert "99th percentile of |v|" in scale and "-0.6 … 1.5" in scale
    _select(driver, "diverging", "bwr")
    assert np.abs(_token_block(_pixels(driver, "signed"), 1, 2).astype(int) - BWR_CENTRE).max() <= 1


def test_non_negative_maps_are_sequential_from_the_minimum_to_the_99th_percentile(driver, items):
    _opacity(driver, 100)
    pixels = _pixels(driver, "tokens")
    assert np.abs(_token_block(pixels, 0, 3).astype(int) - VIRIDIS_LOW).max() <= 1       # the minimum
    assert np.abs(_token_block(pixels, 2, 2).astype(int) - VIRIDIS_HIGH).max() <= 1      # the maximum: saturated
    end = plain_percentile(items[0].maps["tokens"])
    ticks = driver.find_element("css selector", "figure.panel .ticks").text.replace("≥ ", "").split()
    assert [float(t) for t in ticks] == pytest.approx([0.05, (0.05 + end) / 2, end], rel=1e-3)
    assert "minimum to 99th percentile" in driver.find_element("css selector", "figure.panel .scale").text


def test_nearest_draws_token_blocks_and_bilinear_smooths_them(driver):
    _opacity(driver, 100)
    nearest = _pixels(driver, "tokens")
    blocks = nearest.reshape(GRID[0], PATCH, GRID[1], PATCH, 3)
    assert (blocks == blocks[:, :1, :, :1]).all()                          # one colour per token
    _select(driver, "interpolation", "bilinear (smooth)")
    bilinear = _pixels(driver, "tokens")
    assert (bilinear != nearest).any()
    # align_corners=False: up to half a token from the border the map is clamped to the corner token
    assert np.array_equal(bilinear[:PATCH // 2, :PATCH // 2], nearest[:PATCH // 2, :PATCH // 2])
    assert len(np.unique(_token_block(bilinear, 1, 1), axis=0)) > 10
    _select(driver, "method", "pixels")
    smooth_pixels = _pixels(driver, "pixels")
    _select(driver, "interpolation", "nearest (one block per token)")
    assert np.array_equal(_pixels(driver, "pixels"), smooth_pixels)      # at image size there is nothing to upsample


# ---------- prediction and options ----------

def test_prediction_and_options_are_shown(driver):
    prediction = driver.find_element("id", "prediction").text
    assert "explained class: one" in prediction and "predicted: seven" in prediction
    for name, probability in TOP5:
        assert re.search(rf"{name}\s+{probability:.4f}", prediction)
    widths = driver.execute_script(
        "return Array.from(document.querySelectorAll('.top5 .fill')).map(f => f.getBoundingClientRect().width / "
        "f.parentElement.getBoundingClientRect().width);")
    assert widths == pytest.approx([p for _, p in TOP5], abs=0.02)
    options = driver.find_element("css selector", "figure.panel table.options").text
    assert "rule epsilon" in options and "epsilon 0.000001" in options and "layers [1,2]" in options
    _select(driver, "method", "pixels")
    assert "no options recorded" in driver.find_element("css selector", "figure.panel").text


# ---------- validation ----------

def _item(**changes) -> ExplorerItem:
    fields = {"name": "x", "image": np.zeros((8, 8, 3), np.uint8), "maps": {"m": np.ones((2, 2))}, "grid": (2, 2)}
    return ExplorerItem(**{**fields, **changes})


@pytest.mark.parametrize("items, message", [
    ([], "at least one item"),
    ([_item(), _item()], "unique.*'x'"),
    ([_item(image=np.zeros((8, 8, 3), np.float32))], "item 'x': image must be uint8 \\[H, W, 3\\].*float32"),
    ([_item(image=np.zeros((8, 8), np.uint8))], "image must be uint8 \\[H, W, 3\\].*\\[8, 8\\]"),
    ([_item(maps={"m": np.ones((1, 2, 2))})], "item 'x', method 'm': a map must be 2-D"),
    ([_item(maps={"ok": np.ones((2, 2)), "bad": np.array([[0.0, np.nan], [1, 2]])})],
     "item 'x', method 'bad': .*non-finite"),
    ([_item(maps={"m": np.array([[np.inf, 0.0], [1, 2]])})], "method 'm': .*non-finite"),
    ([_item(maps={"m": np.ones((2, 2), bool)})], "method 'm': a map must hold real numbers; got dtype bool"),
    ([_item(maps={})], "item 'x': no maps"),
    ([_item(options={"other": {}})], "options given for methods without a map: 'other'"),
    ([_item(options={"m": "epsilon"})], "options must be a dict per method; not for 'm'"),
    ([_item(grid=(2, 0))], "grid must be two positive ints"),
    ([_item(top5=[("a", 1.5)])], "probability of 'a' must be in \\[0, 1\\]"),
])
def test_bad_input_raises_a_clear_error(items, message):
    with pytest.raises(ValueError, match=message):
        explorer_html(items)


# ---------- labels at 1,400 px ----------

#: per label: its text, whether it is cut (wider or taller than its box, or ellipsised), and the pairs of
#: characters it wraps between (a line break is where a character's box starts a new line)
LABELS_SCRIPT = """
const checked = 'figure.panel figcaption strong, figure.panel .kind, #thumbnails button span, .top5 .name, .ticks span';
return Array.from(document.querySelectorAll(checked)).map((node) => {
  const cut = node.scrollWidth > node.clientWidth || node.scrollHeight > node.clientHeight
    || getComputedStyle(node).textOverflow === 'ellipsis';
  const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
  const characters = [];
  while (walker.nextNode()) {
    const text = walker.currentNode;
    for (let i = 0; i < text.length; i++) {
      const range = document.createRange();
      range.setStart(text, i);
      range.setEnd(text, i + 1);
      const box = range.getClientRects()[0];
      characters.push([text.data[i], box ? box.top : null]);
    }
  }
  const breaks = [];
  let top = null, previous = '';
  for (const [character, at] of characters) {
    if (at === null) { previous += character; continue; }
    if (top !== null && Math.abs(at - top) > 2) breaks.push([previous.slice(-1), character, previous]);
    top = at;
    previous += character;
  }
  return [node.textContent, cut, breaks];
});
"""


def _bench_page(tmp_path) -> str:
    """The explorer as the default bench writes it: 8 images named model · image id, every method of the
    shipped config (its labels: "gradtoken(transpose=True)" ...), 112 px images with a 14 x 14 grid."""
    from vitexplain.bench import DEFAULT_CONFIG, BenchConfig

    labels = [entry.label for entry in BenchConfig.from_yaml(DEFAULT_CONFIG).methods]
    assert "gradtoken(transpose=True)" in labels and "transformer_attribution" in labels
    rng = np.random.default_rng(0)
    top5 = [("American Staffordshire terrier", 0.5), ("seven", 0.2), ("Granny Smith", 0.1), ("a", 0.05), ("b", 0.01)]
    items = [ExplorerItem(f"{model} · digits-test-s0-{index:06d}", rng.integers(0, 256, (112, 112, 3), dtype=np.uint8),
                          {label: rng.normal(size=(14, 14)) for label in labels}, top5=top5, target="seven",
                          grid=(14, 14))
             for model in ("digits_vit", "digits_deit") for index in (37, 44, 675, 775)]
    return write_explorer(tmp_path / "bench" / "explorer.html", items, title="vitexplain bench: digits").as_uri()


def test_no_label_is_cut_or_broken_inside_a_word_at_1400_px(browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    assert browser.execute_script("return window.innerWidth") == 1400
    browser.get(_bench_page(tmp_path))
    WebDriverWait(browser, 20).until(lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    _select(browser, "method", "gradtoken(transpose=True)")
    for mode in ("single", "compare"):
        if mode == "compare":
            browser.find_element("id", "compare").click()
        labels = browser.execute_script(LABELS_SCRIPT)
        texts = [text for text, _, _ in labels]
        assert "digits_deit · digits-test-s0-000775" in texts and "gradtoken(transpose=True)" in texts
        assert len(texts) > (26 if mode == "compare" else 10)
        assert [text for text, cut, _ in labels if cut] == [], mode
        for text, _, breaks in labels:
            for before, after, _ in breaks:                  # a label wraps after ( = , _ - or at a space
                assert before in "(=,_- " or after == " ", (mode, text, breaks)
    overflowing = browser.execute_script(
        "return Array.from(document.querySelectorAll('figure.panel, #controls, #prediction'))"
        ".filter(n => n.scrollWidth > n.clientWidth).map(n => n.className || n.id);")
    assert overflowing == []
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 1400


# ---------- one colour convention: explorer, PNG overlay, report gallery ----------

def test_the_explorer_the_png_overlay_and_the_gallery_colour_a_map_alike(browser, tmp_path):
    """Pixel-level maps (nothing to upsample) drawn by the three, against the rule computed here:
    signed -> RdBu_r at 0.5 + v / (2 e), e the 99th percentile of |v|; else viridis at (v - min) / (p99 - min)."""
    from matplotlib import colormaps
    from selenium.webdriver.support.ui import WebDriverWait

    from vitexplain.bench.html import gallery_section
    from vitexplain.bench.result import Gallery
    from vitexplain.viz import save_overlay

    rng = np.random.default_rng(5)
    image = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    signed = rng.standard_t(2, (SIZE, SIZE))                             # heavy tailed, as LRP / IG maps are
    signed[9, 9] = 20 * plain_percentile(np.abs(signed))                # an outlier, saturated
    sequential = rng.random((SIZE, SIZE)) ** 4
    sequential[3, 30] = 40.0
    maps = {"signed": signed, "sequential": sequential}
    blend = lambda colour: 0.5 * image + 0.5 * colour[..., :3] * 255  # noqa: E731 - at the convention's 50 %
    continuous = lambda name: colormaps[name].resampled(4096)  # noqa: E731 - finer than any palette
    end = plain_percentile(np.abs(signed))
    expected = {"signed": blend(continuous("RdBu_r")(np.clip(0.5 + signed / (2 * end), 0, 1))),
                "sequential": blend(continuous("viridis")(np.clip(
                    (sequential - sequential.min()) / (plain_percentile(sequential) - sequential.min()), 0, 1)))}

    page = write_explorer(tmp_path / "one" / "explorer.html", [ExplorerItem("x", image, maps)])
    browser.get(page.as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.execute_script("return document.documentElement.dataset.ready"))
    browser.find_element("id", "compare").click()
    explorer = {label: _pixels(browser, label) for label in maps}
    scales = browser.execute_script(
        "return Array.from(document.querySelectorAll('figure.panel .scale'), n => n.textContent);")

    overlays, bars = {}, []
    for label, values in maps.items():
        figure = save_overlay(tmp_path / f"{label}.png", image, torch.from_numpy(values))
        overlays[label] = np.round(figure.axes[0].get_images()[0].get_array() * 255)
        bars.append(figure.axes[1].get_ylabel())

    gallery = Gallery(model="m", ids=["x"], images=torch.from_numpy(image / 255.0), labels=[-1], predicted=[0],
                      probability=[1.0], class_names=["a"],
                      maps={k: torch.from_numpy(v)[None] for k, v in maps.items()},
                      top5=[], grid=GRID)
    gallery.images = gallery.images[None]
    section = gallery_section(gallery, set())
    shown = {}
    for label in maps:
        uri = re.search(rf'alt="{label} on x"[^>]*src="data:image/png;base64,([^"]+)"', section).group(1)
        shown[label] = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri))).convert("RGB"))

    for label in maps:      # 257 palette colours (steps of <= 4) against the continuous map: half a step, blended
        for drawn in (explorer[label], overlays[label], shown[label]):
            assert np.abs(drawn.astype(float) - expected[label]).max() <= 2, label
    assert "99th percentile of |v|" in scales[0] and "minimum to 99th percentile" in scales[1]
    assert "99th pct of |v|" in bars[0] and "99th pct" in bars[1]
    assert "RdBu_r, 0 at the centre, ends at ± the 99th percentile of |v|" in section
    assert "viridis, minimum to 99th percentile" in section
