"""One bench per output folder: another config is refused with one line, the same config waits, a refused run
leaves no folder it created; run as a user runs it (``vitexplain bench`` in a new process)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from vitexplain.bench import BenchConfig
from vitexplain.bench.lock import LOCK_NAME, config_key, folder_lock

from cli import python_env, run_cli

ARGS = ["--model", "digits_vit", "--method", "random_baseline", "--metric", "sparseness", "--dataset", "digits",
        "--dataset-option", "n=2", "--device", "cpu", "--no-progress"]


def test_a_bench_of_another_config_is_refused_with_one_line_and_leaves_the_folder_alone(tmp_path):
    out = tmp_path / "out"
    with folder_lock(out, "another-config"):
        holder = json.loads((out / LOCK_NAME).read_text())
        done = run_cli("bench", *ARGS, "-o", str(out), cwd=tmp_path, timeout=300)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]            # nothing written beside the lock
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: {out} is in use by another bench (pid {holder['pid']} on {holder['host']}, config another-config, "
        f"this one {done.stderr.split('this one ')[1].split(')')[0]}); wait for it to end or write elsewhere (-o)"]
    assert not out.exists()                                # the holder created the folder and removed it, empty


def test_a_bench_of_the_same_config_waits_for_the_one_running():
    config = BenchConfig(models=["digits_vit"], methods=["random_baseline"], metrics=["sparseness"], dataset="digits")
    other = BenchConfig(models=["digits_vit"], methods=["random_baseline"], metrics=["sparseness"], dataset="digits",
                        batch_size=3, progress=False)
    assert config_key(config) == config_key(other)        # batch size and progress change no result
    assert config_key(config) != config_key(BenchConfig(models=["digits_vit"], methods=["random_baseline"],
                                                        metrics=["sparseness"], dataset="digits", seed=1))


def test_the_second_run_waits_until_the_first_lets_go(tmp_path, capfd):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom pathlib import Path\nfrom vitexplain.bench.lock import folder_lock\n"
         f"with folder_lock(Path({str(out)!r}), 'same'):\n    print('held', flush=True)\n    time.sleep(1.5)\n"],
        stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.perf_counter()
        with folder_lock(out, "same"):
            waited = time.perf_counter() - started
            assert json.loads((out / LOCK_NAME).read_text())["config"] == "same"
    finally:
        holder.wait(timeout=30)
    assert waited > 1.0                                       # the holder kept it 1.5 s after saying so
    assert f"waiting for the bench of the same config in {out} (pid {holder.pid}) to end" in capfd.readouterr().err
    assert not (out / LOCK_NAME).exists()


def test_a_run_refused_after_taking_the_lock_leaves_no_folder(tmp_path):
    out = tmp_path / "new" / "out"
    missing = ["--model", str(tmp_path / "missing.safetensors"), *ARGS[2:]]           # a model file that is not there
    done = run_cli("bench", *missing, "-o", str(out), cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "new").exists()


@pytest.fixture(autouse=True)
def _no_leftover_lock_files(tmp_path):
    yield
    assert not list(tmp_path.rglob(f"*/{LOCK_NAME}"))
