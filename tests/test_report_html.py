"""report.html and the tables: rendered in headless Chromium, self-contained, papers' layout, controls never best,
the summary per kind of protocol, the method column in view while a table scrolls, one number format per column,
curves at the true fractions whose lines the reader shows, hides and highlights.

Needs Debian's ``chromium`` and ``chromium-driver`` packages and the ``selenium`` wheel; without them
the browser test fails (never skips) and says how to install them.
"""
from __future__ import annotations

import contextlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from vitexplain.bench import BenchConfig, BenchResult, run_benchmark
from vitexplain.bench.tables import UNTRUSTED, arrow, groups_of
from vitexplain.metrics.base import GROUPS
from vitexplain.uncertainty import MIN_IMAGES

from chromium import start_chromium
from conftest import make_vit
from test_bench_fakes import RandomImages

IMAGES = MIN_IMAGES                                  # the fewest with intervals, leaders and trust records
METHODS = ["gae", "lrp", "random_baseline"]          # lrp: signed maps, drawn grey (not highlighted)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> tuple[BenchResult, Path]:
    """A three-method, two-metric bench on 10 tiny random images (the fewest with intervals, so with leaders and trust
    records), with a gallery and the sanity check."""
    out = tmp_path_factory.mktemp("bench") / "out"
    config = BenchConfig(
        models={"tiny": make_vit(depth=2)}, methods=METHODS, dataset=RandomImages(IMAGES, masks=True),
        metrics=["segmentation", "perturbation"], batch_size=IMAGES, output_dir=out, progress=False, device="cpu",
        gallery=2, sanity={"images": 2}, highlight=["gae"])
    result = run_benchmark(config)
    assert not result.errors
    return result, out / "report.html"


class _Sources(HTMLParser):
    """Every URL-valued attribute (src, href, srcset ...) and every url(...) in inline styles."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "poster", "action") and value is not None:
                self.urls.append(value)
            if name == "style" and value:
                self.urls += re.findall(r"url\(([^)]*)\)", value)


def test_the_page_is_self_contained(tiny_report):
    _, page = tiny_report
    text = page.read_text()
    parser = _Sources()
    parser.feed(text)
    outside = [url for url in parser.urls if not (url.startswith("data:image/png;base64,") or url.startswith("#"))]
    assert outside == []
    assert "link" not in parser.tags and "script" not in parser.tags
    fetched = [url for url in re.findall(r"url\(([^)]*)\)", text) if not url.startswith("#")]
    assert fetched == []                                                          # nothing fetched by CSS
    # 2 inputs + 2 x 3 overlays + 2 colour scales (sequential, diverging); the plots are inline SVG
    assert len([url for url in parser.urls if url.startswith("data:image/png")]) == 2 + 6 + 2
    # curves (positive, negative), randomisation
    assert len(re.findall(r"<figure[^>]*><svg", text)) == 2 + 1
    assert "http" not in text.split("<h2>Settings</h2>")[0]                       # no URL, not even a namespace


@contextlib.contextmanager
def _opened(page: Path, tmp_path, width: int):
    """A headless Chromium window ``width`` pixels wide showing ``page``."""
    driver = start_chromium(tmp_path / "profile", width=width)
    try:
        driver.get(page.as_uri())
        yield driver
    finally:
        driver.quit()


def _each(driver, selector: str, mapping: str) -> list:
    """``mapping`` (a JavaScript function) of every element ``selector`` finds, in document order."""
    return driver.execute_script(f"return Array.from(document.querySelectorAll({selector!r})).map({mapping});")


def test_report_renders_in_headless_chromium(tiny_report, tmp_path):
    result, page = tiny_report
    with _opened(page, tmp_path, 1400) as driver:
        images = _each(driver, "img", "i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight]")
        figures = _each(driver, "figure",
                        "f => [f.getAttribute('aria-label'), f.querySelector('svg').getBoundingClientRect().width]")
        tables = _each(driver, "table.scores",
                       "t => Array.from(t.querySelectorAll('tbody td.method')).map(c => c.textContent)")
        gallery = _each(driver, "table.gallery img", "i => i.naturalWidth")
        headers = _each(driver, "table.gallery th", "c => c.textContent")
        captions = _each(driver, "table.gallery td.caption", "c => c.textContent")
        bold = _each(driver, "table.scores:not(.summary) td.best, table.scores:not(.summary) td.tied",
                     "c => [c.parentElement.querySelector('td.method').textContent, getComputedStyle(c).fontWeight]")
        fetched = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('data:'));")
    assert len(images) == 10 and all(complete and width > 0 and height > 0 for _, complete, width, height in images)
    assert [label for label, _ in figures] == [f"tiny: perturbation / negative (mean of {IMAGES} images)",
                                               f"tiny: perturbation / positive (mean of {IMAGES} images)",
                                               "tiny: cascading randomisation (2 images)"]
    assert all(width > 400 for _, width in figures)
    # the summary: a row per number, faithfulness first
    assert tables[0] == ["perturbation"] * 2 + ["segmentation"] * 3
    assert tables[1] == METHODS                              # the scores table: one row per method
    assert tables[2] == METHODS                              # the sanity table
    assert len(gallery) == 2 * (1 + len(METHODS)) and min(gallery) == 32
    assert headers == ["input", "gae", "lrp ±", "random_baseline"]          # LRP's signed maps: diverging scale
    assert len(captions) == 2 and all("predicted" in c and "p = " in c for c in captions)
    assert bold and all(method in ("gae", "lrp") for method, _ in bold)   # the control never leads
    assert fetched == []


def test_summary_per_kind_and_sticky_method_column(tiny_report, tmp_path):
    """The summary names each kind, what it rewards and who leads each number; in a window too narrow for the
    table, the method column stays in view while the table scrolls."""
    result, page = tiny_report
    with _opened(page, tmp_path, 520) as driver:
        summary = _each(driver, "table.summary tbody tr",
                        "r => Array.from(r.querySelectorAll('td, th')).map(c => c.textContent)")
        scrolled = driver.execute_script("""
            const box = document.querySelector('table.scores:not(.summary)').parentElement;
            const cell = box.querySelector('tbody td.method'), number = cell.nextElementSibling;
            const before = [cell.getBoundingClientRect().left, number.getBoundingClientRect().left];
            box.scrollLeft = 250;
            const after = [cell.getBoundingClientRect().left, number.getBoundingClientRect().left];
            const left = box.getBoundingClientRect().left;
            return [box.scrollWidth > box.clientWidth, box.scrollLeft, before, after, left];""")
    kinds = [row[0] for row in summary if len(row) == 1]
    assert kinds == [f"faithfulnessrewards {GROUPS['faithfulness']}", f"localisationrewards {GROUPS['localisation']}"]
    rows = [row for row in summary if len(row) > 1]
    leads = [lead for members in groups_of(result.summary("tiny")).values() for lead in members]
    assert len(rows) == len(leads) == 5
    for row, lead in zip(rows, leads):
        assert row[:3] == [lead.metric, lead.number + arrow(lead.better), str(IMAGES)]
        assert row[3] == ("–" if not lead.methods else UNTRUSTED if not lead.counted  # metric-trust.md
                          else f"best: {lead.methods[0]}" if len(lead.methods) == 1
                          else f"tied ({len(lead.methods)}): {', '.join(lead.methods)}")
        assert row[5] == lead.trust_text() and row[5].startswith("separates random: ")
    assert "mean rank" not in page.read_text()
    overflows, offset, before, after, left = scrolled
    assert overflows and offset > 0
    assert after[0] == pytest.approx(before[0]) == pytest.approx(left, abs=1)   # the method column did not move
    assert after[1] == pytest.approx(before[1] - offset)                          # the numbers did


def test_curve_lines_are_shown_hidden_and_highlighted_from_the_legend(tiny_report, tmp_path):
    _, page = tiny_report
    lines_of = ("return Array.from(document.querySelectorAll('.toggled')[0].querySelectorAll('figure g[id]'))"
                ".filter(g => /-l[0-9]+-[0-9]+$/.test(g.id))")
    shown = lines_of + ".map(g => [g.id, getComputedStyle(g).display !== 'none']);"
    looks = lines_of + (".map(g => [g.id, getComputedStyle(g).opacity, "
                        "parseFloat(getComputedStyle(g.querySelector('path')).strokeWidth)]);")
    legend = ("return Array.from(document.querySelectorAll('.toggled')[0]"
              ".querySelectorAll('.legend:not(.highlight) label'))")
    picks = "return Array.from(document.querySelectorAll('.toggled')[0].querySelectorAll('.legend.highlight label'))"

    def click(labels, text):
        driver.execute_script(labels + f".find(l => l.textContent === {text!r}).click();")

    with _opened(page, tmp_path, 1400) as driver:
        entries = driver.execute_script(legend + ".map(l => l.textContent);")
        choices = driver.execute_script(picks + ".map(l => l.textContent);")
        start = dict(driver.execute_script(shown))
        plain = {i: (float(o), w) for i, o, w in driver.execute_script(looks)}
        click(legend, "gae")
        without_gae = dict(driver.execute_script(shown))
        faded = driver.execute_script(legend + ".map(l => getComputedStyle(l).opacity);")
        click(legend, "gae")
        click(legend, "all not highlighted")
        without_others = dict(driver.execute_script(shown))
        click(legend, "all not highlighted")
        click(picks, "lrp")
        lrp_highlighted = {i: (float(o), w) for i, o, w in driver.execute_script(looks)}
    assert entries == [*METHODS, "all not highlighted"] and choices == ["none", *METHODS]
    # one line per method in each of the two curve plots, ids "<figures>-l<method>-<plot>"
    lines = {method: [i for i in start if f"-l{k}-" in i] for k, method in enumerate(METHODS)}
    assert all(len(ids) == 2 for ids in lines.values()) and all(start.values())
    assert {i for i, on in without_gae.items() if not on} == set(lines["gae"])    # in both plots at once
    assert faded == ["0.4", "1", "1", "1"]
    # lrp is not highlighted by the config
    assert {i for i, on in without_others.items() if not on} == set(lines["lrp"])
    for method, ids in lines.items():
        for i in ids:
            opacity, width = lrp_highlighted[i]
            if method == "lrp":
                assert opacity == 1 and width == 3.5 > plain[i][1]                # drawn wide over the others
            else:
                assert opacity == 0.25 and width == plain[i][1]                   # faded


def test_curves_are_drawn_at_the_fractions_removed_with_axes_that_say_what_is_plotted(tiny_report):
    """Chefer et al.'s perturbation test: 10 steps at 0 %, 10 %, ..., 90 % (0 = the image itself); every method
    has its own colour and dash pattern."""
    from matplotlib.colors import to_hex

    from vitexplain.bench.plots import curve_plots, curve_styles

    result, _ = tiny_report
    plots = {plot.value: plot for plot in curve_plots(result)}
    assert set(plots) == {"positive", "negative"}
    for plot in plots.values():
        assert plot.x == pytest.approx([k / 10 for k in range(10)])
        assert plot.xlabel.startswith("share of the pixels") and "accuracy" in plot.ylabel
        assert plot.title.endswith(f"(mean of {IMAGES} images)")
    assert "most relevant" in plots["positive"].ylabel and "least relevant" in plots["negative"].ylabel
    names = [f"m{k}" for k in range(36)]
    styles = curve_styles(names, highlight=["m3"], controls=set())
    looks = {(to_hex(style["color"]), style["linestyle"]) for style in styles.values()}
    assert len(looks) == 36                                                 # no two alike
    assert styles["m3"]["linewidth"] > styles["m4"]["linewidth"] and styles["m3"]["zorder"] > styles["m4"]["zorder"]


def _result(values: dict[str, float], leading: list[str] | None = None) -> BenchResult:
    """A table of one number with a direction and one without, each with an interval of ± 0.05 over 20 images."""
    scores = {"m": {label: {"seg": {"miou": value, "gap": value}} for label, value in values.items()}}
    names = {"a": "gae", "b": "rollout", "c": "random_baseline", "d": "tokentm"}
    settings = {"methods": {label: {"name": names[label], "options": {}} for label in values}}
    result = BenchResult("digits", scores, {"m": {label: {"seg": 20} for label in values}}, {}, {"seg": {"miou": True}},
                         [], settings)
    result.intervals = {"m": {label: {"seg": {"miou": [value - 0.05, value + 0.05],
                                              "gap": [value - 0.05, value + 0.05]}}
                              for label, value in values.items()}}
    if leading is not None:
        result.leaders = {"m": {"seg": {"miou": {"methods": leading, "controls": []}}}}
    return result


def test_the_gallery_is_also_written_as_the_interactive_explorer(tiny_report):
    result, report = tiny_report
    page = (report.parent / "explorer.html").read_text()
    assert result.files["explorer"] == str(report.parent / "explorer.html")
    for gallery in result.galleries:
        for image_id in gallery.ids:
            assert json.dumps(f"tiny · {image_id}") in page  # the page holds its data as JSON
    for method in METHODS:
        assert f'"{method}"' in page
    assert "http://" not in page and "https://" not in page


def test_the_table_marks_what_the_leaders_say_and_never_a_control():
    table = _result({"a": 0.5, "b": 0.7, "c": 0.9, "d": 0.7}, leading=["b", "d"]).table("m")
    assert table.methods == ["a", "b", "c", "d"] and table.controls == {"c"}
    assert table.headers == ["miou", "gap"] and table.better == [True, None]
    assert [row[0] for row in table.marks] == ["", "tied", "", "tied"]    # the control's 0.9 leads nothing
    assert not any(row[1] for row in table.marks)                          # no direction, no mark
    alone = _result({"a": 0.5, "b": 0.7, "c": 0.9}, leading=["b"]).table("m")
    assert [row[0] for row in alone.marks] == ["", "best", ""]


def test_markdown_and_terminal_tables_show_the_same_numbers():
    result = _result({"a": 0.5, "b": 0.7, "c": 0.9, "d": 0.75}, leading=["d"])
    markdown = result.markdown().splitlines()
    assert "| method | miou ↑ | gap |" in markdown
    assert "| d | **0.75 [0.70, 0.80] (20)** | 0.75 [0.70, 0.80] (20) |" in markdown
    assert "| *c (control)* | 0.90 [0.85, 0.95] (20) | 0.90 [0.85, 0.95] (20) |" in markdown   # one format: 0.90
    text = result.text().splitlines()
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in text
            if line.split()[:1] in (["a"], ["b"], ["c"], ["d"])}
    assert rows == {"a": "0.50 [0.45, 0.55] (20) 0.50 [0.45, 0.55] (20)",
                    "b": "0.70 [0.65, 0.75] (20) 0.70 [0.65, 0.75] (20)",
                    "c": "(control) 0.90 [0.85, 0.95] (20) 0.90 [0.85, 0.95] (20)",
                    "d": "0.75 [0.70, 0.80] (20)* 0.75 [0.70, 0.80] (20)"}


def test_wide_terminal_tables_wrap_within_the_width():
    numbers = {f"number_{k}": 0.123456 * k for k in range(12)}
    result = BenchResult("digits", {"m": {"tokentm": {"seg": numbers}}}, {}, {}, {"seg": {n: True for n in numbers}},
                         [], {"methods": {"tokentm": {"name": "tokentm", "options": {}}}})
    lines = result.text(width=60).splitlines()
    assert max(len(line) for line in lines) <= 60
    headers = [line for line in lines if line.startswith("method")]
    assert len(headers) > 1                                   # wrapped into several blocks
    shown = [name for line in headers for name in re.findall(r"number_\d+", line)]
    assert shown == list(numbers)                             # every column once, in order


def test_terminal_tables_name_each_protocol_above_its_columns_within_100_columns(tiny_report):
    result, _ = tiny_report
    lines = result.text().splitlines()
    assert max(len(line) for line in lines) <= 100
    titles = [line for line in lines if f"(n={IMAGES})" in line and f"(n={IMAGES}):" not in line]   # not the summary's
    assert titles and all(re.match(r"^\s+\S", line) for line in titles)              # above the columns, not a row
    assert f"segmentation (n={IMAGES})" in titles[0] and f"perturbation (n={IMAGES})" in " ".join(titles)
    below = lines[lines.index(titles[0]) + 1:lines.index(titles[0]) + 5]
    assert below[0].strip().startswith("─") and any(line.startswith("method") and "miou ↑" in line for line in below)
    scores = result.table("tiny")
    gae = [line for line in lines if line.startswith("gae ")]
    cells = [scores.cells(j)[0] + {"best": "*", "tied": "≈", "": ""}[scores.marks[0][j]] for j in range(3)]
    assert re.split(r"\s{2,}", gae[0].strip()) == ["gae", *cells]

