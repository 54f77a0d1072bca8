"""The catalogue says, for every method and protocol that LATEC or Quantus also implements, where vitexplain's departs
from theirs, and what each protocol costs: both from the registry (an entry's ``reference`` and ``departures``, declared
in its own module; a metric's ``cost``), written into docs/catalogue/*.md when the site is built (docs/hooks.py)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from vitexplain.metrics.base import METRICS, EvalBatch, Metric, register_metric
from vitexplain.registry import METHODS, REFERENCES, register_method

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"method": ROOT / "docs" / "catalogue" / "methods.md", "protocol": ROOT / "docs" / "catalogue" / "protocols.md"}
#: a departure is short: one to three sentences (a sentence ends at ". " or at the end, not inside "e.g." or "1e-6.")
SENTENCE_END = re.compile(r"(?<=[a-z)0-9`])\.(?:\s+(?=[A-Z(`])|$)")


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks_departures", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def builtin_methods() -> dict[str, object]:
    return {name: METHODS.get(name) for name in METHODS.names()
            if METHODS.get(name).fn.__module__.startswith("vitexplain.methods.") and not METHODS.get(name).control}


def builtin_metrics() -> dict[str, Metric]:
    return {name: METRICS.get(name) for name in METRICS.names()
            if METRICS.get(name).compute.__module__.startswith("vitexplain.metrics.")}


ENTRIES = [("method", name, spec) for name, spec in builtin_methods().items()] + \
          [("protocol", name, metric) for name, metric in builtin_metrics().items()]


@pytest.mark.parametrize("kind, name, entry", ENTRIES, ids=[f"{kind}:{name}" for kind, name, _ in ENTRIES])
def test_every_entry_latec_or_quantus_implements_says_where_it_departs(kind, name, entry):
    assert set(entry.reference) <= set(REFERENCES)
    if not entry.reference:
        assert entry.departures == "", f"{kind} {name!r} states departures but names no reference"
        return
    text = entry.departures
    assert text, f"{kind} {name!r} is in {entry.reference} but says nowhere where it departs from it"
    assert any(REFERENCES[ref] in text for ref in entry.reference), f"{name!r}: the text names none of its references"
    sentences = [part for part in SENTENCE_END.split(text) if part.strip()]
    assert 1 <= len(sentences) <= 3 and len(text) <= 600, f"{name!r}: {len(sentences)} sentences, {len(text)} chars"


@pytest.mark.parametrize("kind", ["method", "protocol"])
def test_the_generated_section_lists_each_entry_once_with_its_text_and_the_others_in_one_line(kind):
    # the page lists the built-in methods, and every registered protocol (a loaded plug-in's too, as the protocol table)
    entries = builtin_methods() if kind == "method" else {name: METRICS.get(name) for name in METRICS.names()}
    table = hooks.departures_table(kind)
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines()
            if line.startswith("| `")}
    referenced = {name for name, entry in entries.items() if entry.reference}
    assert set(rows) == referenced
    for name in referenced:
        entry = entries[name]
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", rows[name])[1:-1]]
        assert cells[1] == ", ".join(REFERENCES[ref] for ref in entry.reference)
        assert cells[2].replace("\\|", "|") == entry.departures
    neither = re.search(r"In neither LATEC nor Quantus: (.*)\.$", table.strip(), re.MULTILINE)
    assert neither and set(re.findall(r"`(\w+)`", neither[1])) == set(entries) - referenced


@pytest.mark.parametrize("kind", ["method", "protocol"])
def test_the_catalogue_page_gets_the_section_at_build_time(kind):
    markdown = PAGES[kind].read_text()
    marker = f"<!-- vitexplain: {kind}-departures -->"
    assert markdown.count(marker) == 1
    built = hooks.on_page_markdown(markdown, page=None, config=None, files=None)
    assert marker not in built and hooks.departures_table(kind).strip() in built


def cost_cell(name: str) -> str:
    row = next(line for line in hooks.protocol_table().splitlines() if line.startswith(f"| `{name}` |"))
    return re.split(r"(?<!\\)\|", row)[-2].strip()


def read_cost(cell: str) -> tuple[float, float]:
    """``"51 + 50·m"`` -> (51, 50); ``"m"`` -> (0, 1); ``"448"`` -> (448, 0)."""
    fixed = per_method = 0.0
    for term in cell.split(" + "):
        if term.endswith("m"):
            per_method = float(term[:-2]) if term != "m" else 1.0
        else:
            fixed = float(term)
    return fixed, per_method


@pytest.mark.parametrize("name", sorted(builtin_metrics()))
def test_the_cost_column_is_the_protocols_passes_and_shows_the_method_when_it_runs_it_again(name):
    metric = METRICS.get(name)
    fixed, per_method = read_cost(cost_cell(name))
    for method_passes in (0.0, 3.0, 150.0):
        assert fixed + per_method * method_passes == pytest.approx(metric.passes({}, method_passes))
    assert (per_method > 0) == ("explain" in metric.requires), cost_cell(name)


def test_a_cost_that_is_not_linear_in_the_methods_passes_is_shown_at_both_points():
    metric = Metric("quadratic_cost_probe", lambda batch: {}, lambda values: {}, cost=lambda options, m: 1 + m * m)
    assert hooks.protocol_cost(metric) == "1 at m = 0, 2 at m = 1"
    assert hooks.protocol_cost(Metric("free_probe", lambda batch: {}, lambda values: {})) == "0"


def _compute(batch: EvalBatch) -> dict[str, torch.Tensor]:
    return {}


@pytest.mark.parametrize("metadata, problem", [
    ({"reference": "quantus"}, "needs departures="),
    ({"reference": ("quantus",), "departures": "   "}, "needs departures="),
    ({"departures": "Quantus draws per image."}, "name it with reference="),
    ({"reference": "captum", "departures": "as Captum computes it"}, "unknown reference 'captum'"),
])
def test_registering_refuses_a_reference_without_departures_and_the_reverse(metadata, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        register_method("departures_probe", **metadata)(lambda adapter, images, target=None: images)
    with pytest.raises(ValueError, match=re.escape(problem)):
        register_metric("departures_probe", reduce=lambda values: {}, **metadata)(_compute)
    assert "departures_probe" not in METHODS and "departures_probe" not in METRICS


def test_a_registered_reference_and_its_text_are_kept_on_the_entry():
    register_metric("departures_probe", reduce=lambda values: {}, reference="quantus",
                    departures="None in substance:\n  as Quantus computes it.")(_compute)
    try:
        metric = METRICS.get("departures_probe")
        assert metric.reference == ("quantus",) and metric.departures == "None in substance: as Quantus computes it."
    finally:
        METRICS.remove("departures_probe")
