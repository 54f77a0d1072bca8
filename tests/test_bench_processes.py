"""The bench across processes: killed with SIGKILL and resumed (its lock taken over), and sharded over two processes
as under torchrun; the numbers and their intervals are those of one uninterrupted process."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from safetensors import safe_open

from vitexplain.bench import BenchConfig, run_benchmark

from conftest import make_vit
from test_bench_fakes import RandomImages

TESTS = Path(__file__).parent
METHODS = ["rollout", "bench_picky"]
IMAGES = 8
SCRIPT = f"""
import json
import sys
sys.path.insert(0, {str(TESTS)!r})
from pathlib import Path
from test_bench_processes import _run_here

print(json.dumps(_run_here(Path(sys.argv[1]))["scores"]))
"""


def _env(**extra: str) -> dict[str, str]:
    root = str(TESTS.parent)
    path = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def _indices(path: Path) -> list[int]:
    """Dataset indices of the rows of one stored batch file (rows are stored under ``img<index>#<digest>``)."""
    with safe_open(str(path), "pt") as handle:
        return [int(key.split("#")[0].removeprefix("img")) for key in json.loads(handle.metadata()["keys"])]


def _stored(out: Path, method: str, kind: str) -> list[list[int]]:
    """Indices of each stored batch file of a method's maps or bench_stats values (none yet: [])."""
    pattern = f"cache/*/*/target-predicted/{method}-*/" + ("maps" if kind == "maps" else "metrics/bench_stats-*")
    return [_indices(path) for folder in out.glob(pattern) for path in sorted(folder.glob("*.safetensors"))]


def _rows(out: Path, method: str, kind: str) -> list[int]:
    """Every stored row's index, repeats included."""
    return sorted(index for batch in _stored(out, method, kind) for index in batch)


def _log_total(path: Path) -> int:
    return sum(int(line) for line in path.read_text().split()) if path.exists() else 0


def _run_here(out: Path) -> dict:
    """The benchmark every test here runs (SCRIPT runs it in another process); returns its result as JSON data."""
    result = run_benchmark(BenchConfig(models={"tiny": make_vit(depth=2)}, methods=METHODS, metrics=["bench_stats"],
                                       dataset=RandomImages(IMAGES), batch_size=2, output_dir=out, progress=False,
                                       device="cpu"))
    return json.loads(json.dumps(result.to_dict()))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-process run."""
    return _run_here(tmp_path_factory.mktemp("reference"))


def _same_numbers(found: dict, expected: dict) -> None:
    assert found["images"] == expected["images"] == {"tiny": {m: {"bench_stats": IMAGES} for m in METHODS}}
    assert found["errors"] == []
    for method in METHODS:
        for key, value in expected["scores"]["tiny"][method]["bench_stats"].items():
            assert found["scores"]["tiny"][method]["bench_stats"][key] == pytest.approx(value, rel=1e-6)
        assert found["curves"]["tiny"]["bench_stats"]["curve"][method] == pytest.approx(
            expected["curves"]["tiny"]["bench_stats"]["curve"][method], rel=1e-6)
        for key, bounds in expected["intervals"]["tiny"][method]["bench_stats"].items():   # the bootstrap too
            assert found["intervals"]["tiny"][method]["bench_stats"][key] == pytest.approx(bounds, rel=1e-6)
    assert found["leaders"] == expected["leaders"]


def test_killed_run_resumes_without_losing_or_repeating_results(tmp_path, reference, monkeypatch):
    script, out = tmp_path / "bench.py", tmp_path / "out"
    script.write_text(SCRIPT)
    command = [sys.executable, str(script), str(out)]
    process = subprocess.Popen(command, env=_env(BENCH_METRIC_SLEEP="0.4"), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    # kill it once rollout is done and bench_picky is halfway: (8 images / 2 per batch) + 1 value files
    while time.monotonic() < deadline and sum(len(_stored(out, m, "values")) for m in METHODS) < 5:
        assert process.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert not (out / "results.json").exists()
    assert json.loads((out / "bench.lock").read_text())["pid"] == process.pid     # the killed run's lock, left behind
    maps_done = len(_rows(out, "bench_picky", "maps"))
    values_done = sum(len(_rows(out, m, "values")) for m in METHODS)
    assert 5 * 2 <= values_done < 2 * IMAGES

    # resume: the same run, in this process (saves starting another interpreter), counting the work it does
    method_log, metric_log = tmp_path / "method.log", tmp_path / "metric.log"
    monkeypatch.setenv("BENCH_METHOD_LOG", str(method_log))
    monkeypatch.setenv("BENCH_METRIC_LOG", str(metric_log))
    with pytest.warns(UserWarning,
                      match=rf"bench.lock was left by a bench that no longer runs \(pid {process.pid}\); taken over"):
        resumed = _run_here(out)
    assert not (out / "bench.lock").exists()
    _same_numbers(resumed, reference)
    assert json.loads((out / "results.json").read_text()) == resumed
    for method in METHODS:  # every image stored exactly once
        assert _rows(out, method, "maps") == _rows(out, method, "values") == list(range(IMAGES))
    assert _log_total(metric_log) == 2 * IMAGES - values_done   # only the missing values were computed
    assert _log_total(method_log) == IMAGES - maps_done         # and only the missing maps


def test_two_processes_shard_images_and_gather_the_single_process_results(tmp_path, reference):
    """Rank 1 is a subprocess that joins as under torchrun (env://); rank 0 is this process."""
    script, out = tmp_path / "bench.py", tmp_path / "out"
    script.write_text(SCRIPT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun_env = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    peer = subprocess.Popen([sys.executable, str(script), str(out)], env=_env(**torchrun_env), stdout=subprocess.PIPE,
                            text=True)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                                timeout=timedelta(seconds=120))
        found = _run_here(out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        peer_scores, _ = peer.communicate(timeout=120)
    assert peer.returncode == 0
    _same_numbers(found, reference)
    assert json.loads(peer_scores.splitlines()[-1]) == found["scores"]  # every rank returns rank 0's result
    for method in METHODS:
        batches = _stored(out, method, "maps")
        assert len(batches) == IMAGES // 2
        assert all(len({i % 2 for i in batch}) == 1 for batch in batches)  # rank r took r::2
        assert _rows(out, method, "maps") == list(range(IMAGES))
