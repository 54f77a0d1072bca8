"""How far each metric can be trusted (docs/decisions/metric-trust.md): the best method against the random control,
each method against its degraded copies, the stability of the methods' order, on a result built by hand; the
summary marks a metric that cannot tell the random control from the methods, in every report."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.html import render_html
from vitexplain.bench.result import Share, build_result, degraded_copies
from vitexplain.bench.tables import UNTRUSTED
from vitexplain.metrics import Metric, register_metric
from vitexplain.metrics.base import METRICS
from vitexplain.uncertainty import MIN_IMAGES

from conftest import make_vit
from test_bench_fakes import RandomImages

IMAGES = 20
COPIES = [{"name": "degraded", "label": f"gae~{kind}", "options": {"of": "gae", "kind": kind}}
          for kind in ("noise", "blur", "shuffle")]
METHODS = ["gae", "rollout", "raw_attention", "random_baseline", *COPIES]
#: per method, its per-image value on ``trust_clear`` (higher is better) before noise: gae beats random, and
#: its noisy and shuffled copies, not its blurred one (the same values)
CLEAR = {"gae": 1.0, "rollout": 0.8, "raw_attention": 0.6, "random_baseline": 0.0, "gae~noise": 0.5, "gae~blur": 1.0,
         "gae~shuffle": 0.1}


def _mean(values):
    return {"score": values["score"].double().mean()}


@pytest.fixture(scope="module")
def fake_metrics():
    names = {"trust_clear": True, "trust_flat": True, "trust_lower": False}
    for name, higher in names.items():
        register_metric(Metric(name=name, compute=lambda batch: {}, reduce=_mean, higher_is_better={"score": higher},
                               group="faithfulness"))
    yield list(names)
    for name in names:
        METRICS.remove(name)


@pytest.fixture(scope="module")
def result(fake_metrics, tmp_path_factory):
    config = BenchConfig(models=["m"], methods=METHODS, metrics=fake_metrics, dataset=RandomImages(IMAGES),
                         output_dir=tmp_path_factory.mktemp("trust"), progress=False)
    generator = torch.Generator().manual_seed(0)
    noises = {entry.label: 0.05 * torch.randn(IMAGES, generator=generator) for entry in config.methods}
    noises["gae~blur"] = noises["gae"]                                        # the same per-image values as gae
    shares = []
    for entry in config.methods:
        noise = noises[entry.label]
        values = {"trust_clear": CLEAR[entry.label] + noise, "trust_flat": torch.full((IMAGES,), 0.5),
                  "trust_lower": (1.0 - CLEAR[entry.label]) + noise}
        for metric, found in values.items():
            shares.append(Share("m", entry.label, metric, list(range(IMAGES)), {"score": found}))
    return build_result(config, shares, [])


def test_a_metric_that_separates_the_random_control_and_reacts_to_degraded_copies(result):
    for label in ("trust_clear", "trust_lower"):                              # either direction: positive = better
        trust = result.trust["m"][label]["score"]
        assert trust["best"] == "gae"
        assert trust["random"]["control"] == "random_baseline" and trust["random"]["separates"]
        value, low, high = trust["random"]["advantage"]
        assert value == pytest.approx(1.0, abs=0.05) and 0.9 < low <= value <= high
        copies = {found["copy"]: found for found in trust["degraded"]}
        assert {name: found["beats"] for name, found in copies.items()} == {
            "gae~noise": True, "gae~blur": False, "gae~shuffle": True}
        assert {found["method"] for found in copies.values()} == {"gae"}
        assert {name: found["kind"] for name, found in copies.items()} == {
            "gae~noise": "noise", "gae~blur": "blur", "gae~shuffle": "shuffle"}
        assert copies["gae~blur"]["advantage"] == [0.0, 0.0, 0.0]
        assert copies["gae~noise"]["advantage"][0] == pytest.approx(0.5, abs=0.05)
        median, low, high = trust["rank_stability"]                           # 3 methods far apart: always ordered
        assert median == 1.0 and low == 1.0 and high == 1.0
    lead = next(lead for lead in result.summary("m") if lead.metric == "trust_clear")
    assert lead.counted and lead.trust_text() == ("separates random: yes; beats its degraded copies: 2/3; "
                                                  "ranking ρ 1.00 [1.00, 1.00]")


def test_a_metric_giving_every_map_the_same_value_is_marked_and_not_counted(result):
    trust = result.trust["m"]["trust_flat"]["score"]
    assert trust["random"]["separates"] is False and trust["random"]["advantage"] == [0.0, 0.0, 0.0]
    assert not any(found["beats"] for found in trust["degraded"]) and trust["rank_stability"] is None
    assert [lead.metric for lead in result.untrusted("m")] == ["trust_flat"]
    flat = next(lead for lead in result.summary("m") if lead.metric == "trust_flat")
    assert flat.leaders() == UNTRUSTED and flat.trust_text() == "separates random: no; beats its degraded copies: 0/3"
    verdict = "Not counted, as they cannot tell the random control from the methods on this model: trust_flat score."
    assert result.verdict_lines("m") == [verdict]
    markdown = result.markdown()
    row = next(line for line in markdown.splitlines() if line.startswith("| trust_flat | score"))
    assert UNTRUSTED in row and "separates random: no" in row and "gae" not in row
    clear = next(line for line in markdown.splitlines() if line.startswith("| trust_clear | score"))
    assert "best: gae" in clear and "separates random: yes; beats its degraded copies: 2/3" in clear
    assert verdict in markdown and "how far each number can be trusted" in markdown
    assert "gae − gae~noise: " in markdown and "gae − random_baseline: " in markdown
    text = result.text()
    assert f"m: {verdict}" in " ".join(text.split()) and "trust: separates random: yes" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    page = render_html(result, [])
    assert UNTRUSTED in page and verdict in page and "separates random: yes; beats its degraded copies: 2/3" in page
    assert "How far each number can be trusted" in page
    saved = json.loads(json.dumps(result.to_dict(), default=repr))
    assert saved["trust"]["m"]["trust_flat"]["score"]["random"]["separates"] is False


def test_degraded_copies_are_matched_by_method_and_effective_options():
    methods = {"gae": {"name": "gae", "options": {}}, "r1": {"name": "rollout", "options": {"start_layer": 1}},
               "r0": {"name": "rollout", "options": {"start_layer": 0}},
               "d": {"name": "degraded", "options": {}},                                      # of: gae by default
               "d1": {"name": "degraded", "options": {"of": "rollout", "options": {"start_layer": 1}, "kind": "blur"}},
               "d0": {"name": "degraded", "options": {"of": "rollout"}},                      # rollout's defaults
               "lost": {"name": "degraded", "options": {"of": "tokentm"}}}                    # not in the run
    assert degraded_copies(methods) == {"gae": [("d", "noise")], "r1": [("d1", "blur")], "r0": [("d0", "noise")]}


def test_methods_chaotic_at_rounding_level_are_named(result, monkeypatch):
    from vitexplain.metrics.numerical_stability import CHAOTIC_BELOW

    monkeypatch.setitem(result.settings["metrics"], "stability", {"name": "numerical_stability"})
    for method, r in {"gae": 1.0, "rollout": CHAOTIC_BELOW - 0.2, "random_baseline": 0.0}.items():
        monkeypatch.setitem(result.scores["m"][method], "stability", {"r_worst": r})
    assert result.chaotic("m") == ["rollout"]                                     # controls are not named
    assert result.verdict_lines("m")[-1] == "Maps chaotic at rounding level: rollout."
    assert "Maps chaotic at rounding level: rollout." in result.markdown()


def test_a_small_bench_reports_trust_for_its_degraded_copies(tmp_path):
    config = BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["gae", "random_baseline", *COPIES],
                         metrics=["bench_stats"], dataset=RandomImages(MIN_IMAGES), batch_size=MIN_IMAGES,
                         output_dir=tmp_path / "out",
                         progress=False, device="cpu", gallery=0)
    result = run_benchmark(config)
    assert not result.errors
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    for number in ("probability", "auc"):
        trust = saved["trust"]["tiny"]["bench_stats"][number]
        assert trust["best"] == "gae" and trust["random"]["control"] == "random_baseline"
        assert [found["copy"] for found in trust["degraded"]] == ["gae~noise", "gae~blur", "gae~shuffle"]
        assert all(np.isfinite(found["advantage"]).all() for found in trust["degraded"])
    # the probability does not depend on the map: no map beats another, and the summary says so
    assert saved["trust"]["tiny"]["bench_stats"]["probability"]["random"]["separates"] is False
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "cannot tell the random control from the methods on this model: bench_stats probability" in markdown
    assert "trust" in (tmp_path / "out" / "report.html").read_text()
