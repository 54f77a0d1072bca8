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
from vitexplain.datasets.base import identity_of
from vitexplain.metrics.pointing_game import pointing_game
from vitexplain.models import load_model
from vitexplain.uncertainty import TOO_FEW, bootstrap, interval

METRICS = ["segmentation", "pointing_game", {"name": "insertion_deletion", "options": {"n_steps": 7}},
           {"name": "max_sensitivity", "options": {"n_samples": 2}}]


@pytest.fixture(scope="module")
def digits():
    model, config = load_model("digits_vit", device="cpu")
    dataset = get_dataset("digits", n=6, preprocess=config)
    return model, config, collate([dataset[i] for i in range(6)]), dataset


def _stored(folder, pattern: str, dataset) -> dict[str, torch.Tensor]:
    """What the bench stored for every image of ``dataset``, in its order (rows found by the images' identities)."""
    (found,) = folder.rglob(pattern)
    store = ShardStore(found)
    store.scan()
    return store.read([identity_of(dataset, i, dataset[i]) for i in range(len(dataset))])


def test_the_front_door_gives_the_values_the_bench_stored(digits, tmp_path):
    model, config, batch, dataset = digits
    bench = BenchConfig(models=["digits_vit"], methods=["gae"], metrics=METRICS,
                        dataset={"name": "digits", "options": {"n": 6}}, batch_size=4, output_dir=tmp_path,
                        progress=False, device="cpu", gallery=0, seed=3)
    result = run_benchmark(bench)
    assert not result.errors
    stored_maps = _stored(tmp_path, "gae-*/maps", dataset)
    scores = vitexplain.evaluate(model, batch["images"], stored_maps["maps"], ["segmentation", "pointing_game",
                                 "insertion_deletion", "max_sensitivity"], targets=stored_maps["targets"],
                                 truth={"masks": batch["masks"], "boxes": batch["boxes"]}, method="gae",
                                 mean=config["mean"], std=config["std"], n_steps=7, n_samples=2, seed=3,
                                 batch_size=5)     # another batching than the bench's: values do not depend on it
    for name, scored in scores.items():
        stored = _stored(tmp_path, f"gae-*/metrics/{name}-*", dataset)
        assert set(scored.values) == set(stored)
        for key, value in stored.items():
            # equal up to float32 rounding: the perturbed copies are forwarded in other batches than the bench's
            torch.testing.assert_close(scored.values[key], value.cpu(), rtol=1e-6, atol=1e-6)
        assert scored.numbers == pytest.approx(result.scores["digits_vit"]["gae"][name], nan_ok=True)
        bench_intervals = result.intervals["digits_vit"]["gae"][name]
        for key, (low, high) in scored.intervals.items():    # 6 images: too few for an interval, in both alike
            assert bench_intervals[key] == TOO_FEW and math.isnan(low) and math.isnan(high)
        assert scored.images == 6 and str(scored).startswith(f"{name} (6 images, 95% bootstrap intervals)")


def test_maps_from_elsewhere_are_scored_with_a_plain_computation_and_its_bootstrap(digits):
    model, _, batch, _ = digits
    images = torch.cat([batch["images"]] * 2)                                   # 12: enough for an interval
    maps = np.random.default_rng(0).random((12, 14, 14)).astype(np.float32)    # e.g. another library's maps
    boxes = [torch.tensor([[0.0, 0.0, 40.0, 112.0]])] * 12                      # a band at the left of each image
    scores = vitexplain.evaluate(model, images, maps, "pointing_game", truth={"boxes": boxes}, seed=11)
    expected = pointing_game(torch.from_numpy(maps), boxes, (112, 112))
    for key, value in expected.items():
        torch.testing.assert_close(scores.values[key], value.cpu())
    assert scores.numbers == {"accuracy": pytest.approx(expected["hit"].double().mean().item()), "included": 12,
                              "excluded": 0}
    report = vitexplain.metrics.get_metric("pointing_game").reporter({})
    replicates = bootstrap({key: value.cpu() for key, value in expected.items()}, report, 11)
    assert scores.intervals["accuracy"] == pytest.approx(interval(replicates["accuracy"]))


def test_what_a_metric_needs_and_the_inputs_lack_is_one_line_naming_it(digits):
    model, _, batch, _ = digits
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


def test_only_the_pixel_unit_protocols_need_the_normalisation(digits):
    """What docs/decisions/your-own.md and docs/guides/evaluate.md say: the protocols that set pixels to black or
    add pixel noise refuse without mean / std; insertion / deletion works in the preprocessed space, the same
    with or without them."""
    model, config, batch, _ = digits
    images, maps = batch["images"][:2], torch.rand(2, 14, 14, generator=torch.Generator().manual_seed(0))
    labels = batch["labels"][:2]
    for metric, options in [("perturbation", {}), ("aopc", {}), ("region_perturbation", {}), ("road", {}),
                            ("selectivity", {}), ("srg", {"fill": "black"})]:
        with pytest.raises(ValueError, match="needs the mean and std the images were normalised with"):
            vitexplain.evaluate(model, images, maps, metric, labels=labels, **options)
    for baseline in ("black", "blur"):
        without = vitexplain.evaluate(model, images, maps, "insertion_deletion", n_steps=4, baseline=baseline)
        given = vitexplain.evaluate(model, images, maps, "insertion_deletion", n_steps=4, baseline=baseline,
                                    mean=config["mean"], std=config["std"])
        for key, value in without.values.items():
            assert torch.equal(value, given.values[key]), key


def test_a_single_image_has_no_interval_and_labels_reach_the_metric(digits):
    model, _, batch, _ = digits
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
    assert [(e["model"], e["method"], e["metric"], e["images"], e["error"]) for e in result.errors] == [
        ("", "", "class_sensitivity", ["#0", "#1", "#2"],       # one entry for the protocol, not one per method
         "metric 'class_sensitivity' needs second, which dataset 'digits' does not provide")]
    assert result.images["digits_vit"]["gae"] == {"class_sensitivity": 0, "sparseness": 3}


def test_a_batch_is_checked_once_and_its_perturbed_copies_score_as_checked_forwards_do(digits, monkeypatch):
    """Within scoring, the protocols' copies of the images are trusted (no finite check at every forward, a wait for
    the device each time), and the values are those of forwards that check every input."""
    from vitexplain.instrumentation import ModelAdapter
    from vitexplain.metrics.perturbation import perturbation_test

    model, config, batch, _ = digits
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
