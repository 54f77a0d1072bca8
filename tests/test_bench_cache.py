"""A cache that heals: corrupt files are named, removed and recomputed; bad configs stop before any work, in one
line."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.store import CacheWarning, ShardStore, read_record, write_record

from cli import run_cli
from conftest import make_vit
from test_bench_fakes import RandomImages

IMAGES = 6
LEVELS = 4                                  # head, block 1, block 0, embedding of a two-block ViT


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "emptied":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(torch.randint(0, 256, (len(data),), generator=torch.Generator().manual_seed(0),
                                       dtype=torch.uint8).numpy().tobytes())
    else:                                   # one flipped bit: the last byte (tensor data), or a digit of a JSON number
        numbers = data.find(b"correlations")
        at = len(data) - 1 if path.suffix != ".json" else data.index(b".", numbers) + 1
        path.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])


def _config(out: Path) -> BenchConfig:
    return BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["bench_picky"], metrics=["bench_stats"],
                       dataset=RandomImages(IMAGES), batch_size=3, output_dir=out, progress=False, device="cpu",
                       gallery=0, sanity={"images": 2})


def _findings(result) -> dict:
    return {key: result.to_dict()[key] for key in ("scores", "images", "curves", "sanity", "errors")}


def _count(path: Path) -> int:
    return sum(int(line) for line in path.read_text().split()) if path.exists() else 0


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _findings(run_benchmark(_config(tmp_path_factory.mktemp("clean"))))


@pytest.mark.parametrize("how", ["truncated", "emptied", "garbage", "bit-flipped"])
def test_a_corrupt_cache_file_is_named_removed_and_recomputed(tmp_path, monkeypatch, clean, how):
    out = tmp_path / "out"
    run_benchmark(_config(out))
    folder = next(out.glob("cache/*/*/target-predicted/bench_picky-*"))
    broken = [sorted((folder / "maps").glob("*.safetensors"))[0],                    # images 0-2
              sorted(next((folder / "metrics").glob("bench_stats-*")).glob("*.safetensors"))[1],   # images 3-5
              next(next((folder / "metrics").glob("model_randomisation-*")).glob("*.safetensors"))]
    for path in broken:
        _corrupt(path, how)
    method_log, metric_log = tmp_path / "method.log", tmp_path / "metric.log"
    monkeypatch.setenv("BENCH_METHOD_LOG", str(method_log))
    monkeypatch.setenv("BENCH_METRIC_LOG", str(metric_log))
    with pytest.warns(CacheWarning) as found:
        healed = run_benchmark(_config(out))
    messages = [str(w.message) for w in found if issubclass(w.category, CacheWarning)]
    assert len(messages) == 3 and all(any(str(path) in m for m in messages) for path in broken)
    assert _findings(healed) == clean
    assert _count(method_log) == 3 + LEVELS * 2      # the 3 lost maps, and the check's 2 images at every level
    assert _count(metric_log) == 3                   # the 3 lost values; nothing else recomputed
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        again = run_benchmark(_config(out))          # healed for good: no warning, no work
    assert _findings(again) == clean and (_count(method_log), _count(metric_log)) == (3 + LEVELS * 2, 3)


def test_shards_are_found_by_identity_carry_a_checksum_and_older_positional_shards_are_not_used(tmp_path):
    store = ShardStore(tmp_path / "maps")
    store.write(["a#1", "b#2"], {"maps": torch.arange(8.0).view(2, 2, 2), "targets": torch.tensor([1, 2])})
    assert ShardStore(store.directory).scan() == {"a#1", "b#2"}
    assert torch.equal(store.read(["b#2", "a#1"])["targets"], torch.tensor([2, 1]))
    path = next(store.directory.glob("*.safetensors"))
    legacy = tmp_path / "legacy"
    legacy.mkdir()                                  # a shard of the days rows were found by dataset position
    (legacy / path.name).write_bytes(save(load_file(str(path)), metadata={"indices": "[4, 7]", "ids": '["a", "b"]'}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert ShardStore(legacy).scan() == set()   # never answers: its images are computed again
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x10                               # one bit of the maps' data
    path.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match=f"{path}.*does not match its checksum"):
        assert store.scan() == set()
    assert not path.exists()


def test_records_carry_a_checksum(tmp_path):
    path = tmp_path / "record.json"
    write_record(path, {"levels": ["head"], "correlations": [[0.25]]})
    assert read_record(path) == {"levels": ["head"], "correlations": [[0.25]]}
    path.write_text(path.read_text().replace("0.25", "0.35"))
    with pytest.warns(CacheWarning, match=f"{path}.*does not match its checksum"):
        assert read_record(path) is None
    assert not path.exists() and read_record(path) is None


def test_cli_config_errors_are_one_line_before_any_work(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [digits_vit]\nmethods: [gae\nmetrics: [sparseness]\n")
    done = run_cli("bench", "--config", str(bad), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: {bad}:3:8: invalid YAML: expected ',' or ']', but got ':' "
                                        "while parsing a flow sequence"]
    bad.write_text("models: [digits_vit]\nmethods: [{name: tis, options: {n_masks: 0}}]\nmetrics: [sparseness]\n"
                   "dataset: digits\n")
    done = run_cli("bench", "--config", str(bad), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: option n_masks of method 'tis' must be an integer >= 1, got 0"]
    assert not (tmp_path / "out").exists()                    # refused at load: nothing was run or written


def test_cli_names_a_repaired_cache_file_in_one_line(tmp_path):
    args = ["--model", "digits_vit", "--method", "random_baseline", "--metric", "sparseness", "--dataset", "digits",
            "--dataset-option", "n=4", "--device", "cpu", "--no-progress", "-o", str(tmp_path / "out")]
    first = run_cli("bench", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    scores = json.loads((tmp_path / "out" / "results.json").read_text())["scores"]
    shard = next((tmp_path / "out").glob("cache/*/*/target-predicted/random_baseline-*/maps/*.safetensors"))
    _corrupt(shard, "truncated")
    second = run_cli("bench", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    warned = [line for line in second.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and str(shard) in warned[0] and "computed again" in warned[0]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["scores"] == scores
