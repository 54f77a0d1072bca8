"""``vitexplain.evaluate``: maps from any source scored from Python, the same computation the bench stores, with
intervals; ground truth by name, and one-line refusals for what a metric needs and the inputs lack."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.store import ShardStore
from vitexplain.datasets import collate, get_dataset
from vitexplain.metrics.pointing_game import pointing_game
from vitexplain.models import load_model
from vitexplain.uncertainty import bootstrap, interval

METRICS = ["segmentation", "pointing_game", {"name": "insertion_deletion", "options": {"n_steps": 7}},
           {"name": "max_sensitivity", "options": {"n_samples": 2}}]


@pytest.fixture(scope="module")
def digits():
    model, config = load_model("digits_vit", device="cpu")
    batch = collate([get_dataset("digits", n=6, preprocess=config)[i] for i in range(6)])
    return model, config, batch


def _stored(folder, pattern: str, indices: list[int]) -> dict[str, torch.Tensor]:
    (found,) = folder.rglob(pattern)
    store = ShardStore(found)
    store.scan()
    return store.read(indices)


def test_the_front_door_gives_the_values_the_bench_stored(digits, tmp_path):
    model, config, batch = digits
    bench = BenchConfig(models=["digits_vit"], methods=["gae"], metrics=METRICS,
                        dataset={"name": "digits", "options": {"n": 6}}, batch_size=4, output_dir=tmp_path,
                        progress=False, device="cpu", gallery=0, seed=3)
    result = run_benchmark(bench)
    assert not result.errors
    stored_maps = _stored(tmp_path, "gae-*/maps", list(range(6)))
    scores = vitexplain.evaluate(model, batch["images"], stored_maps["maps"], ["segmentation", "pointing_game",
                                 "insertion_deletion", "max_sensitivity"], targets=stored_maps["targets"],
                                 truth={"masks": batch["masks"], "boxes": batch["boxes"]}, method="gae",
                                 mean=config["mean"], std=config["std"], n_steps=7, n_samples=2, seed=3,
                                 batch_size=5)     # another batching than the bench's: values do not depend on it
    for name, scored in scores.items():
        stored = _stored(tmp_path, f"gae-*/metrics/{name}-*", list(range(6)))
        assert set(scored.values) == set(stored)
        for key, value in stored.items():
            torch.testing.assert_close(scored.values[key], value.cpu(), rtol=0, atol=0)
        assert scored.numbers == pytest.approx(result.scores["digits_vit"]["gae"][name], nan_ok=True)
        bench_intervals = result.intervals["digits_vit"]["gae"][name]
        for key, (low, high) in scored.intervals.items():
            assert [low, high] == pytest.approx(bench_intervals[key], nan_ok=True)
        assert scored.images == 6 and str(scored).startswith(f"{name} (6 images, 95% bootstrap intervals)")


def test_maps_from_elsewhere_are_scored_with_a_plain_computation_and_its_bootstrap(digits):
    model, _, batch = digits
    maps = np.random.default_rng(0).random((6, 14, 14)).astype(np.float32)     # e.g. another library's maps
    boxes = [torch.tensor([[0.0, 0.0, 40.0, 112.0]])] * 6                       # a band at the left of each image
    scores = vitexplain.evaluate(model, batch["images"], maps, "pointing_game", truth={"boxes": boxes}, seed=11)
    expected = pointing_game(torch.from_numpy(maps), boxes, (112, 112))
    for key, value in expected.items():
        torch.testing.assert_close(scores.values[key], value.cpu())
    assert scores.numbers == {"accuracy": pytest.approx(expected["hit"].double().mean().item()), "included": 6,
                              "excluded": 0}
    report = vitexplain.metrics.get_metric("pointing_game").reporter({})
    replicates = bootstrap({key: value.cpu() for key, value in expected.items()}, report, 11)
    assert scores.intervals["accuracy"] == pytest.approx(interval(replicates["accuracy"]))


def test_what_a_metric_needs_and_the_inputs_lack_is_one_line_naming_it(digits):
    model, _, batch = digits
    images, maps = batch["images"], torch.rand(6, 14, 14)
    problems = {
        "segmentation": (dict(), "metric 'segmentation' needs masks, which these images do not have"),
        "max_sensitivity": (dict(), "needs the method, to explain the images again (method=)"),
        "perturbation": (dict(), "needs a ground-truth class on every image (labels=)"),
        "insertion_deletion": (dict(no_such=1), "no chosen metric has an option 'no_such'"),
        "pointing_game": (dict(truth={"boxes": [torch.zeros(1, 4)] * 5}), "truth['boxes'] must have one entry per "
                                                                          "image (6), got list"),
        "sparseness": (dict(targets=[1, 2]), "targets must be 6 integers, one per image"),
    }
    for metric, (kwargs, message) in problems.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            vitexplain.evaluate(model, images, maps, metric, **kwargs)
    with pytest.raises(ValueError, match=r"maps must be \[N, h, w\] with one map per image \(6\)"):
        vitexplain.evaluate(model, images, maps[:3], "sparseness")


def test_a_single_image_has_no_interval_and_labels_reach_the_metric(digits):
    model, _, batch = digits
    maps = vitexplain.explain(model, batch["images"][:1], "gae")
    one = vitexplain.evaluate(model, batch["images"][:1], maps, "perturbation", labels=batch["labels"][:1], n_steps=3,
                              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert one.images == 1 and all(math.isnan(low) and math.isnan(high) for low, high in one.intervals.values())
    assert set(one.numbers) and all(math.isfinite(value) for value in one.numbers.values())


def test_the_bench_refuses_a_protocol_the_dataset_does_not_provide_for_once_before_any_work(tmp_path):
    bench = BenchConfig(models=["digits_vit"], methods=["gae", "raw_attention"],
                        metrics=["class_sensitivity", "sparseness"], dataset={"name": "digits", "options": {"n": 3}},
                        batch_size=2, output_dir=tmp_path, progress=False, device="cpu", gallery=0)
    result = run_benchmark(bench)
    assert [(e["method"], e["metric"], e["images"], e["error"]) for e in result.errors] == [
        (method, "class_sensitivity", ["all images"],
         "metric 'class_sensitivity' needs second, which dataset 'digits' does not provide")
        for method in ("gae", "raw_attention")]
    assert result.images["digits_vit"]["gae"] == {"class_sensitivity": 0, "sparseness": 3}


def test_a_batch_is_checked_once_and_its_perturbed_copies_score_as_checked_forwards_do(digits, monkeypatch):
    """Within scoring, the protocols' copies of the images are trusted (no finite check at every forward, a wait for
    the device each time), and the values are those of forwards that check every input."""
    from vitexplain.instrumentation import ModelAdapter
    from vitexplain.metrics.perturbation import perturbation_test

    model, config, batch = digits
    images, maps = batch["images"], torch.rand(6, 14, 14, generator=torch.Generator().manual_seed(0))
    adapter = vitexplain.adapter_for(model)
    plain = perturbation_test(adapter.logits, images, maps, batch["labels"], pixel_mean=config["mean"],
                              pixel_std=config["std"], batch_size=7)        # outside scoring: every chunk checked
    checks = []
    real = ModelAdapter.check_inputs
    monkeypatch.setattr(ModelAdapter, "check_inputs", lambda self, inputs: checks.append(len(inputs)) or
                        real(self, inputs))
    scores = vitexplain.evaluate(model, images, maps, "perturbation", labels=batch["labels"], mean=config["mean"],
                                 std=config["std"], batch_size=4, direction="both")
    assert checks == [6, 4, 2]          # the targets' forward, then each batch once, not every one of its 20 steps
    for key, value in plain.items():
        torch.testing.assert_close(scores.values[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="NaN or infinite"):   # outside scoring a forward still checks
        adapter.logits(torch.full_like(images[:1], float("nan")))
