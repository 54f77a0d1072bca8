"""The benchmark harness in one process: numbers, caches, errors, targets, reports, config and CLI."""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest
import torch

import vitexplain
from vitexplain.bench import BenchConfig, BenchResult, MethodEntry, run_benchmark
from vitexplain.cli import bench as bench_cli

from conftest import make_vit
from test_bench_fakes import STEPS, RandomImages

METHODS = ["rollout", {"name": "rollout", "options": {"start_layer": 1}, "label": "rollout-1"}]


def _config(tmp_path: Path, dataset, **overrides) -> BenchConfig:
    fields = dict(models={"tiny": make_vit(depth=2)}, methods=METHODS, metrics=["bench_stats"], dataset=dataset,
                  batch_size=3, output_dir=tmp_path / "out", progress=False, device="cpu")
    return BenchConfig(**{**fields, **overrides})


def _lines(path: Path) -> int:
    """Images counted in a work log (one line per batch holding its size)."""
    return sum(int(line) for line in path.read_text().split()) if path.exists() else 0


def _expected(model, dataset, start_layer: int, use_label: bool = False) -> dict[str, list]:
    """Per-image values computed one image at a time, with plain loops for the curve."""
    found = {"probability": [], "curve": [], "on_mask": []}
    for index in range(len(dataset)):
        sample = dataset[index]
        image = sample["image"][None]
        with torch.no_grad():
            probabilities = model(image).softmax(-1)[0]
        target = sample["label"] if use_label else int(probabilities.argmax())
        if target < 0:
            continue
        saliency = vitexplain.explain(model, image, "rollout", target=target, start_layer=start_layer)[0]
        positive = sorted((max(v, 0.0) for v in saliency.flatten().tolist()), reverse=True)
        counts = [round(len(positive) * k / STEPS) for k in range(1, STEPS + 1)]
        found["curve"].append([sum(positive[:n]) / sum(positive) for n in counts])
        found["probability"].append(float(probabilities[target]))
        if "mask" in sample:
            found["on_mask"].append(float(sample["mask"].float().mean()))
    return found


def test_reported_numbers_equal_a_one_image_at_a_time_computation(tmp_path):
    dataset = RandomImages(7, masks=True)
    config = _config(tmp_path, dataset, metrics=["bench_stats", "bench_replay", "bench_needs_masks"])
    result = run_benchmark(config)
    model = config.models[0].source
    assert not result.errors
    for label, start in (("rollout", 0), ("rollout-1", 1)):
        expected = _expected(model, dataset, start)
        scores = result.scores["tiny"][label]
        curve = torch.tensor(expected["curve"])
        assert scores["bench_stats"]["probability"] == pytest.approx(sum(expected["probability"]) / 7, abs=1e-6)
        assert scores["bench_stats"]["auc"] == pytest.approx(curve.mean().item(), abs=1e-6)
        assert scores["bench_replay"]["gap"] == 0.0  # EvalBatch.explain re-runs the same method and options
        assert scores["bench_needs_masks"]["on_mask"] == pytest.approx(sum(expected["on_mask"]) / 7, abs=1e-6)
        assert result.curves["tiny"]["bench_stats"]["curve"][label] == pytest.approx(curve.mean(0).tolist(), abs=1e-6)
        assert result.images["tiny"][label] == {"bench_stats": 7, "bench_replay": 7, "bench_needs_masks": 7}

    out = config.output_dir
    assert json.loads((out / "results.json").read_text())["scores"] == result.scores
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * 4  # (probability, auc, gap, on_mask) per method
    by_key = {(r["method"], r["metric"], r["number"]): r for r in rows}
    reported = result.scores["tiny"]["rollout-1"]["bench_stats"]["auc"]
    assert float(by_key["rollout-1", "bench_stats", "auc"]["value"]) == reported
    assert by_key["rollout", "bench_stats", "auc"]["higher_is_better"] == "False"
    markdown = (out / "results.md").read_text()
    assert "| method | probability ↑ | auc ↓ | gap | on_mask ↑ |" in markdown
    plot = out / "plots" / "tiny" / "bench_stats-curve.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.files["plots"] == [str(plot)]


def test_each_metric_entry_is_reduced_with_its_own_options(tmp_path):
    """Segmentation at the best threshold: one per method (default) or one per number, as the entry asks."""
    from vitexplain.metrics.segmentation import reduce_segmentation, segmentation

    dataset = RandomImages(6, masks=True)
    metrics = [{"name": "segmentation", "options": {"threshold": choice}, "label": choice}
               for choice in ("best", "best_per_metric")]
    config = _config(tmp_path, dataset, methods=["rollout"], metrics=metrics)
    result = run_benchmark(config)
    images = torch.stack([dataset[i]["image"] for i in range(6)])
    masks = torch.stack([dataset[i]["mask"] for i in range(6)])
    maps = vitexplain.explain(config.models[0].source, images, "rollout")
    for choice in ("best", "best_per_metric"):
        expected = reduce_segmentation(segmentation(maps, masks, threshold=choice), threshold=choice)
        assert result.scores["tiny"]["rollout"][choice] == pytest.approx(expected)
    found = result.scores["tiny"]["rollout"]
    assert found["best"]["pixel_accuracy_threshold"] != found["best_per_metric"]["pixel_accuracy_threshold"]


def test_max_sensitivity_reseeds_randomised_methods_only(tmp_path):
    """With reseed, each perturbed call of a randomised method gets its own seed through the bench; a
    deterministic method is unaffected."""
    from vitexplain.metrics.sensitivity import sample_seeds
    from vitexplain.seeding import derived_seed

    dataset = RandomImages(3)
    metrics = [{"name": "max_sensitivity", "options": {"n_samples": 3, "reseed": reseed}, "label": f"reseed={reseed}"}
               for reseed in (False, True)]
    config = _config(tmp_path, dataset, methods=["random_baseline", "rollout"], metrics=metrics, seed=5)
    scores = run_benchmark(config).scores["tiny"]
    base = vitexplain.explain(config.models[0].source, dataset[0]["image"][None], "random_baseline", seed=5)

    def change(seed: int) -> float:
        found = vitexplain.explain(config.models[0].source, dataset[0]["image"][None], "random_baseline", seed=seed)
        return ((base - found).norm() / base.norm()).item()

    # the control is drawn afresh for perturbed call s (copy s), from its own seed, or the reseeded one, and s
    # (docs/decisions/metric-trust.md, "The control of a stability protocol")
    fresh = [change(derived_seed(5, copy)) for copy in (1, 2, 3)]
    assert scores["random_baseline"]["reseed=False"]["max_sensitivity"] == pytest.approx(max(fresh)) and min(fresh) > 0
    reseeded = [change(derived_seed(seed, copy)) for copy, seed in enumerate(sample_seeds(5, 3), start=1)]
    assert scores["random_baseline"]["reseed=True"]["max_sensitivity"] == pytest.approx(max(reseeded))
    assert scores["rollout"]["reseed=True"] == scores["rollout"]["reseed=False"]


def test_cached_maps_and_values_are_reused_and_a_new_metric_adds_only_itself(tmp_path, monkeypatch):
    method_log, metric_log = tmp_path / "method.log", tmp_path / "metric.log"
    monkeypatch.setenv("BENCH_METHOD_LOG", str(method_log))
    monkeypatch.setenv("BENCH_METRIC_LOG", str(metric_log))
    dataset = RandomImages(7, masks=True)
    first = run_benchmark(_config(tmp_path, dataset, methods=["bench_picky"]))
    assert (_lines(method_log), _lines(metric_log)) == (7, 7)

    # another batch size, and a second metric: no map and no bench_stats value is computed again
    second = run_benchmark(_config(tmp_path, dataset, methods=["bench_picky"],
                                   metrics=["bench_stats", "bench_needs_masks"],
                                   batch_size=2))
    assert (_lines(method_log), _lines(metric_log)) == (7, 7)
    assert second.scores["tiny"]["bench_picky"]["bench_stats"] == first.scores["tiny"]["bench_picky"]["bench_stats"]
    assert second.images["tiny"]["bench_picky"]["bench_needs_masks"] == 7

    # lose the per-image values of one batch: exactly those images are evaluated again, from cached maps
    stats_dir = next((tmp_path / "out" / "cache").glob("*/*/target-predicted/bench_picky-*/metrics/bench_stats-*"))
    lost = sorted(stats_dir.glob("*.safetensors"))[1]
    lost.unlink()
    third = run_benchmark(_config(tmp_path, dataset, methods=["bench_picky"]))
    assert (_lines(method_log), _lines(metric_log)) == (7, 10)
    assert third.scores["tiny"]["bench_picky"]["bench_stats"] == pytest.approx(
        first.scores["tiny"]["bench_picky"]["bench_stats"], abs=1e-6)

    # other method options: a separate cache, computed afresh
    run_benchmark(_config(tmp_path, dataset, methods=[{"name": "bench_picky", "options": {"start_layer": 1}}]))
    assert _lines(method_log) == 14


def test_a_failing_item_loses_nothing_else(tmp_path):
    dataset = RandomImages(7, broken=[2], poisoned=[5])  # no masks: bench_needs_masks is refused before any work
    config = _config(tmp_path, dataset, methods=["rollout", "bench_picky"],
                     metrics=["bench_stats", "bench_needs_masks"])
    result = run_benchmark(config)
    # todo [0..6] in batches of 3: [0, 1, (2 unreadable)], [3, 4, 5 (poisoned)], [6]
    assert result.images["tiny"]["rollout"] == {"bench_stats": 6, "bench_needs_masks": 0}
    assert result.images["tiny"]["bench_picky"] == {"bench_stats": 3, "bench_needs_masks": 0}
    errors = {(e["method"], e["metric"], tuple(e["images"])): e["error"] for e in result.errors}
    assert errors[("rollout", None, ("#2",))] == "OSError: cannot identify image file 'img002.jpg'"
    assert errors[("bench_picky", None, ("img003", "img004", "img005"))] == "RuntimeError: poisoned image"
    assert errors[("", "bench_needs_masks", tuple(f"#{i}" for i in range(7)))] == (
        "metric 'bench_needs_masks' needs masks, which dataset RandomImages does not provide")
    assert len(result.errors) == 2 + 1 + 1  # two load errors, the poisoned batch, the protocol refused once
    assert "bench_needs_masks" not in result.scores["tiny"]["rollout"]
    healthy = _expected(config.models[0].source, RandomImages(7, poisoned=[5]), 0)["probability"]
    stats = result.scores["tiny"]["rollout"]["bench_stats"]
    assert stats["probability"] == pytest.approx((sum(healthy) - healthy[2]) / 6, abs=1e-6)
    assert "| rollout | " in (config.output_dir / "results.md").read_text()
    assert "RuntimeError: poisoned image" in (config.output_dir / "results.md").read_text()


def test_label_targets_explain_the_ground_truth_class(tmp_path):
    dataset = RandomImages(5, unlabelled=[1])
    config = _config(tmp_path, dataset, methods=["rollout"], target="label")
    result = run_benchmark(config)
    expected = _expected(config.models[0].source, dataset, 0, use_label=True)
    assert result.images["tiny"]["rollout"]["bench_stats"] == 4
    stats = result.scores["tiny"]["rollout"]["bench_stats"]
    assert stats["probability"] == pytest.approx(sum(expected["probability"]) / 4, abs=1e-6)
    assert stats["auc"] == pytest.approx(torch.tensor(expected["curve"]).mean().item(), abs=1e-6)
    assert [(e["images"], e["error"]) for e in result.errors] == [
        (["img001"], "target='label' but the image has no ground-truth label")]


def test_limit_draws_a_seeded_subset(tmp_path):
    dataset = RandomImages(9)
    one = run_benchmark(_config(tmp_path / "a", dataset, methods=["rollout"], limit=4, seed=3))
    again = run_benchmark(_config(tmp_path / "b", dataset, methods=["rollout"], limit=4, seed=3))
    other = run_benchmark(_config(tmp_path / "c", dataset, methods=["rollout"], limit=4, seed=4))
    assert one.images["tiny"]["rollout"]["bench_stats"] == 4
    assert one.scores == again.scores
    assert one.scores != other.scores


def test_markdown_marks_the_leaders_of_each_column_and_its_direction():
    scores = {"a": {"del": {"auc": 0.2}},
              "b": {"ins": {"auc": 0.7, "n": 3.0}, "del": {"auc": 0.1}},
              "c": {"ins": {"auc": 0.5}, "del": {"auc": 0.1}}}
    result = BenchResult(dataset="toy", scores={"m": scores}, images={"m": {m: {"ins": 4, "del": 4} for m in scores}},
                         curves={}, higher_is_better={"ins": {"auc": True}, "del": {"auc": False}}, errors=[])
    result.intervals = {"m": {m: {label: {n: ([v, v] if n == "n" else [v - 0.05, v + 0.05]) for n, v in numbers.items()}
                                  for label, numbers in per.items()} for m, per in scores.items()}}
    result.leaders = {"m": {"ins": {"auc": {"methods": ["b"], "controls": []}},
                            "del": {"auc": {"methods": ["b", "c"], "controls": []}}}}
    lines = result.markdown().splitlines()
    header = lines.index("## m") + 2
    assert lines[header:header + 5] == [
        # metrics in config order, a shared name qualified, no arrow when unknown
        "| method | ins/auc ↑ | n | del/auc ↓ |",
        "| --- | ---: | ---: | ---: |",
        "| a | – | – | 0.20 [0.15, 0.25] (4) |",
        "| b | **0.70 [0.65, 0.75] (4)** | 3.00 [3.00, 3.00] (4) | 0.10 [0.05, 0.15] (4) ≈ |",   # best alone: bold
        "| c | 0.50 [0.45, 0.55] (4) | – | 0.10 [0.05, 0.15] (4) ≈ |",                        # tied: ≈
    ]


def test_config_from_yaml_and_its_checks(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text(
        "models: [deit_tiny_patch16_224, {name: mine, source: ckpt.pth, arch: vit_tiny_patch16_224}]\n"
        "methods: [rollout, {name: tis, options: {n_masks: 64}, label: TIS}, "
        "{name: rollout, options: {start_layer: 1}}]\n"
        "metrics: [insertion_deletion]\n"
        "dataset: {name: imagenet, root: /data, options: {split: val}}\n"
        "batch_size: 8\nlimit: 100\ntarget: label\n")
    config = BenchConfig.from_yaml(path)
    assert [(m.name, m.source, m.arch) for m in config.models] == [
        ("deit_tiny_patch16_224", None, None), ("mine", "ckpt.pth", "vit_tiny_patch16_224")]
    assert [m.label for m in config.methods] == ["rollout", "TIS", "rollout(start_layer=1)"]
    assert (config.dataset.name, config.dataset.root, config.dataset.options) == ("imagenet", "/data", {"split": "val"})
    assert (config.batch_size, config.limit, config.target) == (8, 100, "label")
    base = dict(models=["m"], methods=["rollout"], metrics=["sparseness"], dataset="d")
    with pytest.raises(ValueError, match="unknown metric 'sparsenes'.*sparseness"):     # resolved at the door
        BenchConfig(**{**base, "metrics": ["sparsenes"]})
    with pytest.raises(ValueError, match="unknown bench config key.*batchsize"):
        BenchConfig.from_dict({**base, "batchsize": 3})
    with pytest.raises(ValueError, match="target must be one of"):
        BenchConfig(**base, target="truth")
    with pytest.raises(ValueError, match="two methods are named 'rollout'"):
        BenchConfig(**{**base, "methods": ["rollout", MethodEntry("gae", label="rollout")]})
    with pytest.raises(TypeError, match="model object needs a name"):
        BenchConfig(**{**base, "models": [make_vit()]})
    # option names and values are checked when the config is made, before any work
    with pytest.raises(TypeError, match="method 'rollout' has no option 'depth'"):
        _config(tmp_path, RandomImages(2), methods=[{"name": "rollout", "options": {"depth": 2}}])
    with pytest.raises(TypeError, match="metric 'bench_stats' has no option 'n_steps'; its options are: none"):
        _config(tmp_path, RandomImages(2), metrics=[{"name": "bench_stats", "options": {"n_steps": 2}}])
    with pytest.raises(ValueError,
                       match="option n_steps of metric 'insertion_deletion' must be an integer >= 2, got 1"):
        _config(tmp_path, RandomImages(2), metrics=[{"name": "insertion_deletion", "options": {"n_steps": 1}}])
    with pytest.raises(ValueError, match="highlight names method.*'tis'"):
        _config(tmp_path, RandomImages(2), highlight=["rollout", "tis"])
    path.write_text("models: [m]\nmethods: [{name: tis, options: {n_masks: 0}}]\n"
                    "metrics: [sparseness]\ndataset: digits\n")
    with pytest.raises(ValueError, match=f"^{path}: option n_masks of method 'tis' must be an integer >= 1, got 0$"):
        BenchConfig.from_yaml(path)


@pytest.mark.parametrize("line, message", [
    ("output_dir: 5", "output_dir must be a folder path, got 5"),
    ("limit: x", "limit must be an integer, got 'x'"),
    ("methods: 3", "methods must be a name, a mapping or a list of them, got 3"),
    ("progress: maybe", "progress must be true or false, got 'maybe'"),
    ("device: 0", "device must be a device (cpu, cuda, cuda:1 ...) or null, got 0"),
    ("notes: {a: 1}", "notes must be a text or a list of texts, got {'a': 1}"),
    ("highlight: 7", "highlight must be a text or a list of texts, got 7"),
    ("exclude_metrics: 2", "exclude_metrics must be a text or a list of texts, got 2"),
    ("sanity: {methods: 5}", "sanity: methods must be a text or a list of texts, got 5"),
    ("dataset: {name: digits, root: 3}", "dataset 'digits': root must be a folder path, got 3"),
    ("dataset: {name: digits, options: 3}", "dataset 'digits': options must be a mapping of option names to values, "
                                            "got 3"),
    ("models: [{name: m, arch: 3}]", "model 'm': arch must be a name (text), got 3"),
    ("methods: [{name: rollout, label: 5}]", "method 'rollout': label must be a text, got 5"),
    ("metrics: [{name: sparseness, dataset: 4}]", "metric 'sparseness': dataset must be a dataset name, a mapping or "
                                                   "a torch Dataset, got 4"),
    ("metrics: [{name: sparseness, limit: x}]", "metric 'sparseness': limit must be a positive integer, got 'x'"),
])
def test_a_wrong_typed_config_key_is_named_in_one_line(tmp_path, line, message):
    path = tmp_path / "bench.yaml"
    base = {"models": "models: [m]", "methods": "methods: [rollout]", "metrics": "metrics: [sparseness]",
            "dataset": "dataset: digits"}
    base[line.partition(":")[0]] = line
    path.write_text("\n".join(base.values()) + "\n")
    with pytest.raises((TypeError, ValueError)) as caught:
        BenchConfig.from_yaml(path)
    assert str(caught.value) == f"{path}: {message}"


def test_a_single_label_for_the_sanity_check_is_a_list_of_one():
    config = BenchConfig(models=["m"], methods=["rollout", "gae"], metrics=["sparseness"], dataset="digits",
                         sanity={"methods": "rollout"})
    assert config.sanity.methods == ["rollout"]        # not 'r', 'o', 'l', ... one letter a label


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_cli_flags_override_the_yaml_config(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("models: [a]\nmethods: [{name: rollout, label: rollout}, gae]\nmetrics: [bench_stats]\n"
                    "highlight: [rollout, gae]\ndataset: {name: digits, options: {n: 10}}\nbatch_size: 8\n")
    args = _parse(["--config", str(path), "--model", "ckpt.pth", "--arch", "vit_small_patch16_224",
                   "--method-option", "rollout.start_layer=1", "--dataset-option", "seed=3", "--batch-size", "2",
                   "--limit", "5", "--no-progress", "-o", str(tmp_path / "o")])
    config = bench_cli.config_from_args(args)
    assert [(m.name, m.arch) for m in config.models] == [("ckpt.pth", "vit_small_patch16_224")]
    assert [(m.name, m.options) for m in config.methods] == [("rollout", {"start_layer": 1}), ("gae", {})]
    assert config.dataset.options == {"n": 10, "seed": 3}
    assert (config.batch_size, config.limit, config.progress, config.output_dir) == (2, 5, False, tmp_path / "o")
    with pytest.raises(ValueError, match="names no method"):
        bench_cli.config_from_args(_parse(["--config", str(path), "--method-option", "tis.n_masks=4"]))
    arguments = ["--config", str(path), "--method", "gae", "--method", "attn_gradcam"]
    replaced = bench_cli.config_from_args(_parse(arguments))
    assert replaced.highlight == ["gae"]                      # the config's highlight, less what is no longer run
    chosen = bench_cli.config_from_args(_parse(["--config", str(path), "--highlight", "rollout"]))
    assert chosen.highlight == ["rollout"]


def test_cli_runs_the_benchmark_through_load_model_and_get_dataset(tmp_path, monkeypatch, capsys):
    import vitexplain.datasets
    import vitexplain.models

    model = make_vit(depth=2)
    calls = []

    def load_model(name, arch=None, device=None):
        calls.append(("model", name, arch, str(device)))
        return model, {"input_size": (3, 32, 32)}

    def get_dataset(name, root, **options):
        calls.append(("dataset", name, root, options))
        return RandomImages(4, broken=[3])

    monkeypatch.setattr(vitexplain.models, "load_model", load_model)
    monkeypatch.setattr(vitexplain.datasets, "get_dataset", get_dataset)
    args = _parse(["--model", "tiny.safetensors", "--arch", "vit_x", "--method", "rollout", "--metric", "bench_stats",
                   "--dataset", "fake", "--data-root", "/data", "--dataset-option", "split=val", "--device", "cpu",
                   "--no-progress", "-o", str(tmp_path)])
    assert bench_cli.run(args) == 1  # the unreadable image is reported in the exit status
    assert calls == [("model", "tiny.safetensors", "vit_x", "cpu"),
                     ("dataset", "fake", "/data", {"preprocess": {"input_size": (3, 32, 32)}, "split": "val"})]
    captured = capsys.readouterr()
    table_rows = [line.split()[0] for line in captured.out.splitlines() if line.strip()]
    assert "rollout" in table_rows and "1 error(s) on 1 image(s)" in captured.err
    images = json.loads((tmp_path / "results.json").read_text())["images"]
    assert images["tiny.safetensors"]["rollout"]["bench_stats"] == 3


def test_a_precision_runs_the_scoring_forwards_in_it_records_it_and_keeps_its_cache_apart(tmp_path):
    metrics = [{"name": "insertion_deletion", "options": {"n_steps": 2}}]
    results = {precision: run_benchmark(_config(tmp_path, RandomImages(3), precision=precision, metrics=metrics,
                                                methods=[{"name": "rise", "options": {"n_masks": 8}}]))
               for precision in ("float32", "bfloat16")}
    cache = next((tmp_path / "out" / "cache").iterdir())
    found = sorted(path.parent.relative_to(cache).parts[2:] for path in cache.rglob("rise-*/spec.json"))
    assert [parts[:-1] for parts in found] == [("precision-bfloat16",), ()]  # float32: the folders it always had
    for precision, result in results.items():
        assert not result.errors and result.settings["precision"] == precision
        assert result.markdown().startswith(f"# Benchmark on RandomImages, {precision}")
        assert result.text().startswith(f"Benchmark on RandomImages, {precision}")
    assert "Benchmark on RandomImages, bfloat16" in (tmp_path / "out" / "report.html").read_text()
    float32, bfloat16 = (results[p].scores["tiny"]["rise(n_masks=8)"]["insertion_deletion"]
                         for p in ("float32", "bfloat16"))
    assert float32 != bfloat16                                  # RISE's and the metric's forwards ran in bfloat16
    assert float32.keys() == bfloat16.keys()
    for key in float32:
        assert abs(float32[key] - bfloat16[key]) < 0.05
    with pytest.raises(ValueError, match="precision must be one of float32, tf32, bfloat16, float16, got 'fp8'"):
        _config(tmp_path, RandomImages(2), precision="fp8")
    assert bench_cli.config_from_args(_parse(["--model", "a", "--method", "gae", "--metric", "sparseness",
                                              "--dataset", "digits", "--precision", "tf32"])).precision == "tf32"
