"""Numerical stability (issue 35, item 4): r of each map under bfloat16 rounding and relative 2^-9 noise of the
weights and of the input, against a plain computation; the model restored; the bench's values from Python."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.datasets import collate, get_dataset
from vitexplain.metrics import get_metric
from vitexplain.metrics.numerical_stability import CHAOTIC_BELOW, KINDS, ROUNDING
from vitexplain.models import load_model

from conftest import make_vit
from test_evaluate import _stored
from test_metrics_mprt import assert_restored, snapshot


def plain(model, images, targets, method, seed):
    """The four perturbations written out on deep copies, numpy's Pearson r per image."""
    reference = vitexplain.explain(model, images, method, target=targets)
    rounded, noisy = copy.deepcopy(model), copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in rounded.parameters():
            parameter.copy_(parameter.bfloat16().float())
        for parameter in noisy.parameters():
            parameter.mul_(1 + ROUNDING * torch.randn(parameter.shape, generator=generator))
    z = torch.randn(images.shape[1:], generator=torch.Generator().manual_seed(seed))
    perturbed = {"bf16_weights": vitexplain.explain(rounded, images, method, target=targets),
                 "noise_weights": vitexplain.explain(noisy, images, method, target=targets),
                 "bf16_input": vitexplain.explain(model, images.bfloat16().float(), method, target=targets),
                 "noise_input": vitexplain.explain(model, images * (1 + ROUNDING * z), method, target=targets)}
    return {kind: np.array([np.corrcoef(reference[i].flatten().double(), maps[i].flatten().double())[0, 1]
                            for i in range(len(images))]) for kind, maps in perturbed.items()}


@pytest.mark.parametrize("method", ["gae", "lrp"])
def test_values_equal_a_plain_computation_and_the_model_is_restored(method):
    model = make_vit(depth=2)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([1, 4, 7])
    before = snapshot(model)
    maps = vitexplain.explain(model, images, method, target=targets)
    found = vitexplain.evaluate(model, images, maps, "numerical_stability", targets=targets, method=method, seed=7)
    assert_restored(model, before)
    expected = plain(model, images, targets, method, 7)
    for kind in KINDS:
        np.testing.assert_allclose(found.values[f"r_{kind}"].numpy(), expected[kind], atol=1e-9)
    worst = np.min([expected[kind] for kind in KINDS], 0)
    np.testing.assert_allclose(found.values["r_worst"].numpy(), worst, atol=1e-9)
    assert found.numbers["r_worst"] == pytest.approx(worst.mean(), abs=1e-9)
    assert set(found.numbers) == {f"r_{kind}" for kind in KINDS} | {"r_worst"}


def test_controls_and_the_threshold():
    model = make_vit(depth=2)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    maps = vitexplain.explain(model, images, "constant_baseline")          # a map that never changes: r = 1
    found = vitexplain.evaluate(model, images, maps, "numerical_stability", method="constant_baseline")
    assert all(value == pytest.approx(1.0) for value in found.numbers.values())
    # the random control is drawn afresh for every perturbation (metric-trust.md): unrelated maps, chaotic
    maps = vitexplain.explain(model, images, "random_baseline")
    found = vitexplain.evaluate(model, images, maps, "numerical_stability", method="random_baseline")
    assert found.numbers["r_worst"] < CHAOTIC_BELOW and all(value < 1 for value in found.numbers.values())
    assert CHAOTIC_BELOW == 0.9 and get_metric("numerical_stability").group == "robustness"
    assert get_metric("numerical_stability").passes({}, 2.0) == 8.0


def test_the_bench_stores_what_evaluate_computes_and_gae_is_stable(tmp_path):
    """The three protocols that change the model, through the bench and through ``vitexplain.evaluate``."""
    model, config = load_model("digits_vit", device="cpu")
    dataset = get_dataset("digits", n=2, preprocess=config)
    batch = collate([dataset[i] for i in range(2)])
    metrics = {"numerical_stability": {}, "smooth_mprt": {"n_samples": 2, "cascade": False}, "efficient_mprt": {}}
    bench = BenchConfig(models=["digits_vit"], methods=["gae"],
                        metrics=[{"name": name, "options": options} for name, options in metrics.items()],
                        dataset={"name": "digits", "options": {"n": 2}}, batch_size=2, output_dir=tmp_path,
                        progress=False, device="cpu", gallery=0, seed=3)
    result = run_benchmark(bench)
    assert not result.errors
    stored_maps = _stored(tmp_path, "gae-*/maps", dataset)
    before = snapshot(model)
    for name, options in metrics.items():
        scores = vitexplain.evaluate(model, batch["images"], stored_maps["maps"], name, targets=stored_maps["targets"],
                                     method="gae", seed=3, batch_size=2, **options)
        assert_restored(model, before)
        stored = _stored(tmp_path, f"gae-*/metrics/{name}-*", dataset)
        assert set(stored) == set(scores.values)
        for key, value in stored.items():
            torch.testing.assert_close(scores.values[key], value.cpu(), rtol=0, atol=0)
        assert scores.numbers == pytest.approx(result.scores["digits_vit"]["gae"][name])
    numbers = result.scores["digits_vit"]["gae"]
    assert numbers["numerical_stability"]["r_worst"] > 0.999       # GAE: r = 1.000 at rounding level (issue 35)
    assert numbers["smooth_mprt"]["similarity"] < 0.5 and numbers["efficient_mprt"]["complexity_rise"] > 0.5
