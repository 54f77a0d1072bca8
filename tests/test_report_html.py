"""report.html and the tables: rendered in headless Chromium, self-contained, papers' layout, controls never best,
ranks, the method column in view while a table scrolls, curves whose lines the reader shows and hides.

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
from chromium import start_chromium
from conftest import make_vit
from test_bench_fakes import RandomImages

from vitexplain.bench import BenchConfig, BenchResult, run_benchmark

METHODS = ["gae", "lrp", "random_baseline"]          # lrp: signed maps, drawn grey (not highlighted)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> tuple[BenchResult, Path]:
    """A three-method, two-metric bench on 5 tiny random images, with a gallery and the sanity check."""
    out = tmp_path_factory.mktemp("bench") / "out"
    config = BenchConfig(
        models={"tiny": make_vit(depth=2)}, methods=METHODS, dataset=RandomImages(5, masks=True),
        metrics=["segmentation", "perturbation"], batch_size=5, output_dir=out, progress=False, device="cpu", gallery=2,
        sanity={"images": 2}, highlight=["gae"])
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
    assert [url for url in re.findall(r"url\(([^)]*)\)", text) if not url.startswith("#")] == []  # nothing fetched by CSS
    # 2 inputs + 2 x 3 overlays + 2 colour scales (sequential, diverging); the plots are inline SVG
    assert len([url for url in parser.urls if url.startswith("data:image/png")]) == 2 + 6 + 2
    assert len(re.findall(r"<figure[^>]*><svg", text)) == 2 + 1                 # curves (positive, negative), randomisation
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
        tables = _each(driver, "table.scores", "t => Array.from(t.querySelectorAll('tbody td.method')).map(c => c.textContent)")
        gallery = _each(driver, "table.gallery img", "i => i.naturalWidth")
        headers = _each(driver, "table.gallery th", "c => c.textContent")
        captions = _each(driver, "table.gallery td.caption", "c => c.textContent")
        bold = _each(driver, "table.scores:not(.ranks) td.best",
                     "c => [c.parentElement.querySelector('td.method').textContent, getComputedStyle(c).fontWeight]")
        fetched = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('data:'));")
    assert len(images) == 10 and all(complete and width > 0 and height > 0 for _, complete, width, height in images)
    assert [label for label, _ in figures] == ["tiny: perturbation / negative", "tiny: perturbation / positive",
                                               "tiny: cascading randomisation (2 images)"]
    assert all(width > 400 for _, width in figures)
    ranking = result.ranking("tiny")
    assert tables[0] == ranking.methods and sorted(ranking.methods) == sorted(METHODS)   # the summary, by mean rank
    assert tables[1] == METHODS                              # the scores table: one row per method
    assert tables[2] == METHODS                              # the sanity table
    assert len(gallery) == 2 * (1 + len(METHODS)) and min(gallery) == 32
    assert headers == ["input", "gae", "lrp ±", "random_baseline"]          # LRP's signed maps: diverging scale
    assert len(captions) == 2 and all("predicted" in c and "p = " in c for c in captions)
    assert bold and all(method in ("gae", "lrp") and int(weight) >= 700 for method, weight in bold)
    assert fetched == []


def test_summary_ranks_and_sticky_method_column(tiny_report, tmp_path):
    """In a window too narrow for the table, the method column stays in view while the table scrolls."""
    result, page = tiny_report
    with _opened(page, tmp_path, 520) as driver:
        summary = _each(driver, "table.ranks tbody tr", "r => Array.from(r.querySelectorAll('td')).map(c => c.textContent)")
        protocols = _each(driver, "table.ranks thead th", "c => c.textContent")
        scrolled = driver.execute_script("""
            const box = document.querySelector('table.scores:not(.ranks)').parentElement;
            const cell = box.querySelector('tbody td.method'), number = cell.nextElementSibling;
            const before = [cell.getBoundingClientRect().left, number.getBoundingClientRect().left];
            box.scrollLeft = 250;
            const after = [cell.getBoundingClientRect().left, number.getBoundingClientRect().left];
            return [box.scrollWidth > box.clientWidth, box.scrollLeft, before, after, box.getBoundingClientRect().left];""")
    assert protocols == ["method", "mean rank", "segmentation", "perturbation"]
    ranking = result.ranking("tiny")
    for row, method, mean, ranks in zip(summary, ranking.methods, ranking.mean, ranking.ranks):
        assert row == [method, f"{mean:.1f}", *(f"{r:.1f}" for r in ranks)]
    overflows, offset, before, after, left = scrolled
    assert overflows and offset > 0
    assert after[0] == pytest.approx(before[0]) == pytest.approx(left, abs=1)   # the method column did not move
    assert after[1] == pytest.approx(before[1] - offset)                          # the numbers did


def test_curve_lines_are_shown_and_hidden_from_the_legend(tiny_report, tmp_path):
    _, page = tiny_report
    shown = ("return Array.from(document.querySelectorAll('.toggled')[0].querySelectorAll('figure g[id]'))"
             ".filter(g => /-l[0-9]+-[0-9]+$/.test(g.id)).map(g => [g.id, getComputedStyle(g).display !== 'none']);")
    legend = "return Array.from(document.querySelectorAll('.toggled')[0].querySelectorAll('.legend label'))"

    def click(text):
        driver.execute_script(legend + f".find(l => l.textContent === {text!r}).click();")

    with _opened(page, tmp_path, 1400) as driver:
        entries = driver.execute_script(legend + ".map(l => l.textContent);")
        start = dict(driver.execute_script(shown))
        click("gae")
        without_gae = dict(driver.execute_script(shown))
        faded = driver.execute_script(legend + ".map(l => getComputedStyle(l).opacity);")
        click("gae")
        click("all grey lines")
        without_grey = dict(driver.execute_script(shown))
    assert entries == [*METHODS, "all grey lines"]
    # one line per method in each of the two curve plots, ids "<figures>-l<method>-<plot>"
    lines = {method: [i for i in start if f"-l{k}-" in i] for k, method in enumerate(METHODS)}
    assert all(len(ids) == 2 for ids in lines.values()) and all(start.values())
    assert {i for i, on in without_gae.items() if not on} == set(lines["gae"])    # in both plots at once
    assert faded == ["0.4", "1", "1", "1"]
    assert {i for i, on in without_grey.items() if not on} == set(lines["lrp"])   # gae back; the grey lrp hidden


def _result(values: dict[str, float]) -> BenchResult:
    scores = {"m": {label: {"seg": {"miou": value, "gap": value}} for label, value in values.items()}}
    names = {"a": "gae", "b": "rollout", "c": "random_baseline", "d": "tokentm"}
    settings = {"methods": {label: {"name": names[label], "options": {}} for label in values}}
    return BenchResult("digits", scores, {}, {}, {"seg": {"miou": True}}, [], settings)


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


def test_controls_are_never_best_and_ties_are_all_marked():
    table = _result({"a": 0.5, "b": 0.7, "c": 0.9, "d": 0.7}).table("m")
    assert table.methods == ["a", "b", "c", "d"] and table.controls == {"c"}
    assert table.headers == ["miou", "gap"] and table.better == [True, None]
    assert [row[0] for row in table.best] == [False, True, False, True]   # the control's 0.9 is not the best
    assert not any(row[1] for row in table.best)                          # no direction, no best


def test_markdown_and_terminal_tables_show_the_same_numbers():
    result = _result({"a": 0.5, "b": 0.7, "c": 0.9, "d": 0.7})
    markdown = result.markdown().splitlines()
    assert "| method | miou ↑ | gap |" in markdown
    assert "| b | **0.7** | 0.7 |" in markdown and "| *c (control)* | 0.9 | 0.9 |" in markdown
    text = result.text().splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in text if line.split()[:1] in (["a"], ["b"], ["c"], ["d"])}
    assert rows == {"a": ["0.5", "0.5"], "b": ["0.7*", "0.7"], "c": ["(control)", "0.9", "0.9"], "d": ["0.7*", "0.7"]}


def test_wide_terminal_tables_wrap_within_the_width():
    numbers = {f"number_{k}": 0.123456 * k for k in range(12)}
    result = BenchResult("digits", {"m": {"tokentm": {"seg": numbers}}}, {}, {}, {"seg": {n: True for n in numbers}}, [],
                         {"methods": {"tokentm": {"name": "tokentm", "options": {}}}})
    lines = result.text(width=60).splitlines()
    assert max(len(line) for line in lines) <= 60
    headers = [line for line in lines if line.startswith("method")]
    assert len(headers) > 1                                   # wrapped into several blocks
    shown = [name for line in headers for name in re.findall(r"number_\d+", line)]
    assert shown == list(numbers)                             # every column once, in order


def test_ranks_per_protocol_and_mean_rank_by_hand():
    """Definition (docs/decisions/bench.md): places 1..n among the non-controls on each number with a direction,
    ties sharing their mean place, a control at the place it would take among them; protocol rank = mean place."""
    scores = {"a": {"seg": {"miou": 0.5, "acc": 0.9, "gap": 1.0}, "del": {"auc": 0.2}},
              "b": {"seg": {"miou": 0.7, "acc": 0.1, "gap": 9.0}, "del": {"auc": 0.4}},
              "c": {"seg": {"miou": 0.9, "acc": 0.5, "gap": 5.0}, "del": {"auc": 0.1}},
              "d": {"seg": {"miou": 0.7}, "del": {"auc": 0.3}}}
    names = {"a": "gae", "b": "rollout", "c": "random_baseline", "d": "tokentm"}
    result = BenchResult("digits", {"m": scores}, {}, {}, {"seg": {"miou": True, "acc": True}, "del": {"auc": False}}, [],
                         {"methods": {label: {"name": names[label], "options": {}} for label in scores}})
    ranking = result.ranking("m")
    assert ranking.protocols == ["seg", "del"] and ranking.controls == {"c"}
    by_method = {m: (mean, ranks) for m, mean, ranks in zip(ranking.methods, ranking.mean, ranking.ranks)}
    assert by_method == {"a": (1.5, [2.0, 1.0]),         # miou 3rd, acc 1st; auc 1st
                         "b": (2.375, [1.75, 3.0]),      # miou shared 1st-2nd, acc 2nd of the two with a value; auc 3rd
                         "c": (1.25, [1.5, 1.0]),        # the control: above everyone on miou, between a and b on acc
                         "d": (1.75, [1.5, 2.0])}        # no acc: its seg rank is its miou place
    assert ranking.methods == ["c", "a", "d", "b"]


def test_terminal_tables_name_each_protocol_above_its_columns_within_100_columns(tiny_report):
    result, _ = tiny_report
    lines = result.text().splitlines()
    assert max(len(line) for line in lines) <= 100
    titles = [line for line in lines if "(n=5)" in line]
    assert titles and all(re.match(r"^\s+\S", line) for line in titles)              # above the columns, not a row
    assert "segmentation (n=5)" in titles[0] and "perturbation (n=5)" in " ".join(titles)
    below = lines[lines.index(titles[0]) + 1:lines.index(titles[0]) + 5]
    assert below[0].strip().startswith("─") and any(line.startswith("method") and "miou ↑" in line for line in below)
    scores = result.table("tiny")
    gae = [line.split() for line in lines if line.startswith("gae ")]
    assert gae[1][:4] == ["gae", *(f"{v:.4g}" + ("*" if b else "") for v, b in zip(scores.values[0][:3], scores.best[0][:3]))]
