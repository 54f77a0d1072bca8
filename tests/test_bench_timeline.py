"""The bench's timeline (``BenchResult.timeline``) and how ``benchmarks/gpu_check.py`` prints it with the GPU's
busy share: a real tiny run on the CPU for the timeline's properties, synthetic timelines and a stubbed CUDA
trace for the arithmetic of the tables."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vitexplain.bench import BenchConfig, run_benchmark

from conftest import make_vit
from test_bench_fakes import RandomImages

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import gpu_check  # noqa: E402


def _ordered_apart(timeline: list[dict]) -> None:
    for interval in timeline:
        assert 0 <= interval["start"] <= interval["end"]
    for earlier, later in zip(timeline, timeline[1:]):
        assert earlier["end"] <= later["start"], (earlier, later)   # one process: one phase at a time


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """A tiny bench with every kind of phase: maps, two metrics, the sanity check, a gallery; and its wall time."""
    config = BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["rollout", "raw_attention"],
                         metrics=["bench_stats", "sparseness"], dataset=RandomImages(5), batch_size=2,
                         output_dir=tmp_path_factory.mktemp("out"), progress=False, device="cpu",
                         sanity={"images": 2}, gallery=2)
    started = time.perf_counter()
    result = run_benchmark(config)
    return result, time.perf_counter() - started


def test_the_timeline_covers_every_phase_in_order(bench_run):
    result, wall = bench_run
    timeline = result.timeline
    _ordered_apart(timeline)
    assert sum(i["end"] - i["start"] for i in timeline) <= wall
    assert timeline[-1]["end"] <= wall
    phases = {(i["model"], i["method"], i["phase"]) for i in timeline}
    for method in ("rollout", "raw_attention"):
        for phase in ("maps", "bench_stats", "sparseness", "sanity"):
            assert ("tiny", method, phase) in phases
    assert [i["phase"] for i in timeline[-2:]] == ["reduce", "reports"]
    assert ("tiny", "", "gallery") in phases
    # per (model, method, phase) the timeline adds up to the timings, which are summed on their own
    summed: dict[tuple[str, str, str], float] = {}
    for i in timeline:
        if i["method"]:
            key = (i["model"], i["method"], i["phase"])
            summed[key] = summed.get(key, 0.0) + i["end"] - i["start"]
    expected = {(model, method, phase): seconds for model, per_method in result.timings.items()
                for method, spent in per_method.items() for phase, seconds in spent.items()}
    assert summed.keys() == expected.keys()
    for key, seconds in expected.items():
        assert summed[key] == pytest.approx(seconds, rel=1e-9, abs=1e-9)
    assert "timeline" not in result.to_dict()


def _synthetic() -> list[dict]:
    """Two models, two methods with a metric each, their sanity check (alternating methods), gallery, reduce,
    reports; gaps between the intervals as untimed host work."""
    timeline, now = [], 0.0

    def add(model: str, method: str, phase: str, seconds: float) -> None:
        nonlocal now
        now += 0.25                                               # untimed work before each phase
        timeline.append({"model": model, "method": method, "phase": phase, "start": now, "end": now + seconds})
        now += seconds

    for model in ("a", "b"):
        for method in ("m1", "m2"):
            for _ in range(2):                                    # two batches
                add(model, method, "maps", 1.0)
                add(model, method, "deletion", 0.5)
        for level in range(3):
            for method in ("m1", "m2"):
                add(model, method, "sanity", 0.1 * (level + 1))
        add(model, "", "gallery", 0.3)
    add("", "", "reduce", 2.0)
    add("", "", "reports", 1.0)
    return timeline


def test_rows_merge_consecutive_intervals():
    timeline = _synthetic()
    rows = gpu_check.timeline_rows(timeline)
    assert [(r["model"], r["name"]) for r in rows] == [
        ("a", "m1"), ("a", "m2"), ("a", "sanity"), ("a", "gallery"),
        ("b", "m1"), ("b", "m2"), ("b", "sanity"), ("b", "gallery"), ("", "reduce"), ("", "reports")]
    for row in rows:
        parts = [i for i in timeline if i["model"] == row["model"] and gpu_check.row_name(i) == row["name"]]
        assert row["seconds"] == pytest.approx(sum(i["end"] - i["start"] for i in parts))
        assert (row["start"], row["end"]) == (parts[0]["start"], parts[-1]["end"])
        assert row["seconds"] <= row["end"] - row["start"] + 1e-12
    for earlier, later in zip(rows, rows[1:]):
        assert earlier["end"] <= later["start"]
    wall = timeline[-1]["end"]
    short = gpu_check.folded(rows, wall, 1.5 / wall)      # the sanity check and gallery of each model, and reports
    assert [(r["model"], r["name"]) for r in short] == [
        ("a", "m1"), ("a", "m2"), ("a", "2 rows"), ("b", "m1"), ("b", "m2"), ("b", "2 rows"), ("", "reduce"),
        ("", "reports")]
    assert sum(r["seconds"] for r in short) == pytest.approx(sum(r["seconds"] for r in rows))
    assert short[2]["seconds"] == pytest.approx(1.2 + 0.3)
    assert short[2]["parts"] == [i for i in timeline if i["model"] == "a" and i["phase"] in ("sanity", "gallery")]


def test_phase_totals_are_the_sums_of_their_parts():
    timeline = _synthetic()
    totals = gpu_check.phase_totals(timeline)
    assert set(totals) == {"maps", "deletion", "sanity", "gallery", "reduce", "reports"}
    assert totals["maps"]["seconds"] == pytest.approx(2 * 2 * 2 * 1.0)
    assert totals["deletion"]["seconds"] == pytest.approx(2 * 2 * 2 * 0.5)
    assert totals["sanity"]["seconds"] == pytest.approx(2 * 2 * (0.1 + 0.2 + 0.3))
    assert sum(t["seconds"] for t in totals.values()) == pytest.approx(sum(i["end"] - i["start"] for i in timeline))
    wall = timeline[-1]["end"] + 0.5
    assert sum(t["seconds"] for t in totals.values()) <= wall
    table = gpu_check.timeline_table(timeline, wall)
    assert "| a | m1 | 0.25 | 4.00 | 3.00 |" in table
    assert "GPU busy" not in table
    timed = sum(i["end"] - i["start"] for i in timeline)
    assert f"timed phases {timed:.1f} s of {wall:.1f} s wall" in table


def test_busy_spans_are_counted_once():
    merged = gpu_check.merged_spans([(3.0, 4.0), (0.0, 1.0), (0.5, 1.5), (1.5, 2.0), (5.0, 6.0)])
    assert merged == [(0.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
    assert gpu_check.busy_within(merged, 0.0, 10.0) == pytest.approx(4.0)
    assert gpu_check.busy_within(merged, 1.0, 3.5) == pytest.approx(1.5)
    assert gpu_check.busy_within(merged, 2.0, 3.0) == 0.0
    assert gpu_check.busy_within(merged, 3.25, 3.5) == pytest.approx(0.25)


class _Event:
    def __init__(self, device: str, start_ns: int, end_ns: int):
        self.device, self.start, self.end = device, start_ns, end_ns

    def device_type(self):
        return getattr(torch.autograd.DeviceType, self.device)

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.end


def test_gpu_busy_share_from_a_stubbed_trace(monkeypatch):
    """Only the CUDA calls are stubbed: the synchronisation and the profiler's trace, whose GPU events lie at
    known offsets after the run's start; the CPU event and the empty one are not the GPU's."""
    offsets = [(0.010, 0.030), (0.020, 0.040), (0.060, 0.070), (0.080, 0.080)]

    class Trace:
        def __init__(self, activities):
            assert activities == [torch.profiler.ProfilerActivity.CUDA]

        def __enter__(self):
            self.origin = time.time_ns()
            return self

        def __exit__(self, *exc):
            events = [_Event("CUDA", self.origin + int(a * 1e9), self.origin + int(b * 1e9)) for a, b in offsets]
            events.append(_Event("CPU", self.origin, self.origin + 10 ** 8))
            self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events))
            return False

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(gpu_check, "profile", Trace)
    result, wall, spans = gpu_check.gpu_busy(lambda: time.sleep(0.1) or "done", torch.device("cuda"))
    assert result == "done" and wall >= 0.1
    assert len(spans) == 3
    merged = gpu_check.merged_spans(spans)
    busy = gpu_check.busy_within(merged, 0.0, wall)
    assert busy == pytest.approx(0.040, abs=1e-3)        # 10-40 ms and 60-70 ms; the clocks read µs apart
    timeline = [{"model": "m", "method": "x", "phase": "maps", "start": 0.0, "end": 0.05},
                {"model": "m", "method": "x", "phase": "deletion", "start": 0.05, "end": 0.1}]
    table = gpu_check.timeline_table(timeline, wall, spans)
    assert f"GPU busy {busy:.1f} s of {wall:.1f} s wall ({busy / wall:.0%})" in table
    assert "| m | x | 0.00 | 0.10 | 0.10 | " in table and table.count("| 40% |") == 1   # one row: 40 ms of 100
    assert "| maps | 0.00 | 0.05 | 0.05 | " in table and table.count("| 60% |") == 1   # 30 ms of 50 ms
    assert "| deletion | 0.05 | 0.10 | 0.05 | " in table and table.count("| 20% |") == 1   # 10 ms of 50 ms


def test_gpu_busy_without_gpu_activity(monkeypatch):
    class Empty:
        def __init__(self, activities):
            self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: []))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(gpu_check, "profile", Empty)
    assert gpu_check.gpu_busy(lambda: 1, torch.device("cuda"))[2] is None
