"""The model-randomisation check as a registered protocol: per-image values against a plain cascade on a copy of the
model, its floors, its independence of the batching, and the bench running it for the ``sanity`` key."""
from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import spearmanr

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.data import select_indices
from vitexplain.bench.randomisation import verdict
from vitexplain.instrumentation.randomisation import randomisation_levels, reinitialise
from vitexplain.seeding import derived_seed

from conftest import make_vit
from test_bench_fakes import RandomImages


@pytest.fixture(scope="module")
def tiny():
    model = make_vit(depth=2)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    return model, images, torch.tensor([1, 4, 7, 2])


def _rho(first: torch.Tensor, second: torch.Tensor) -> float:
    return spearmanr(first.flatten().numpy(), second.flatten().numpy())[0]


def _plain(model, images, targets, method, level_seed, **options):
    """By hand: a copy of the model re-initialised level after level from one generator, scipy's Spearman per image
    and level; the floor of a deterministic method the previous image's map, of a randomised one its map with another
    seed."""
    trained = vitexplain.explain(model, images, method, target=targets, **options)
    randomised, generator = copy.deepcopy(model), torch.Generator().manual_seed(level_seed)
    rows = [[] for _ in range(len(images))]
    for level in randomisation_levels(randomised):
        reinitialise(level, generator)
        random = vitexplain.explain(randomised, images, method, target=targets, **options)
        for i in range(len(images)):
            rows[i].append(_rho(trained[i], random[i]))
    if vitexplain.get_method(method).randomised:
        another = {**options, "seed": derived_seed(level_seed, 0)}
        other = vitexplain.explain(model, images, method, target=targets, **another)
        floor = [_rho(trained[i], other[i]) for i in range(len(images))]
    else:
        floor = [_rho(trained[i], trained[i - 1]) for i in range(len(images))]
    return trained, torch.tensor(rows, dtype=torch.float64), torch.tensor(floor, dtype=torch.float64)


@pytest.mark.parametrize("method, options", [("gae", {}), ("rise", {"n_masks": 8, "seed": 9})])
def test_per_image_values_are_the_cascade_on_a_copy_and_the_floor_whatever_the_batching(tiny, method, options):
    model, images, targets = tiny
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    maps, correlations, floor = _plain(model, images, targets, method, 6, **options)
    whole = vitexplain.evaluate(model, images, maps, "model_randomisation", targets=targets, method=method,
                                method_options=options, seed=6)
    single = vitexplain.evaluate(model, images, maps, "model_randomisation", targets=targets, method=method,
                                 method_options=options, seed=6, batch_size=1)      # the image floor across batches
    torch.testing.assert_close(whole.values["correlation"].double(), correlations, atol=1e-6, rtol=0)
    last = correlations[:, -1]
    expected = {"excess": (last - floor).mean().item(), "correlation": last.mean().item(),
                "floor": floor.mean().item(), "unchanged": 0.0}
    for found in (whole, single):
        assert found.numbers == pytest.approx(expected, abs=1e-6)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())      # the model as it was


def test_a_map_that_ignores_the_model_stays_at_one_and_is_flagged(tiny):
    model, images, targets = tiny
    maps = vitexplain.explain(model, images, "constant_baseline", target=targets)
    found = vitexplain.evaluate(model, images, maps, "model_randomisation", targets=targets,
                                method="constant_baseline")
    assert found.numbers["unchanged"] == 1.0 and found.numbers["excess"] == 0.0
    assert verdict(found.values["correlation"].double(), torch.ones(4, dtype=torch.float64), 0)["flagged"]
    gae = vitexplain.explain(model, images, "gae", target=targets)
    moved = vitexplain.evaluate(model, images, gae, "model_randomisation", targets=targets, method="gae")
    assert moved.numbers["unchanged"] == 0.0 and moved.values["correlation"][:, -1].max() < 0.99


def test_one_image_of_a_deterministic_method_has_no_floor(tiny):
    model, images, targets = tiny
    maps = vitexplain.explain(model, images[:1], "gae", target=targets[:1])
    found = vitexplain.evaluate(model, images[:1], maps, "model_randomisation", targets=targets[:1], method="gae")
    assert torch.isnan(torch.tensor(found.numbers["floor"])) and torch.isnan(torch.tensor(found.numbers["excess"]))


def _bench(out, **changes):
    settings = dict(models={"tiny": make_vit(depth=2)}, methods=["gae", {"name": "rise", "options": {"n_masks": 8}}],
                    metrics=["sparseness"], dataset=RandomImages(5), batch_size=5, output_dir=out, progress=False,
                    device="cpu", gallery=0, sanity={"images": 4})
    return run_benchmark(BenchConfig(**{**settings, **changes}))


def test_the_bench_runs_the_sanity_key_as_the_protocol_and_its_verdict_does_not_depend_on_the_batching(tmp_path):
    model = make_vit(depth=2)
    result = _bench(tmp_path / "one", models={"tiny": model})
    check = result.sanity["tiny"]
    assert check["levels"] == ["head", "block 1", "block 0", "embedding"] and check["images"] == 4
    assert [check["methods"][m]["floor_kind"] for m in ("gae", "rise(n_masks=8)")] == ["image", "seed"]
    assert "sanity" not in result.scores["tiny"]["gae"]                 # the sanity section, not a column
    assert all("sanity" in result.timings["tiny"][m] for m in ("gae", "rise(n_masks=8)"))
    # by hand on the check's 4 images (the first 4 of the run's selection, the 5 in order)
    dataset = RandomImages(5)
    chosen = select_indices(5, None, 0)[:4]
    images = torch.stack([dataset[i]["image"] for i in chosen])
    targets = vitexplain.adapter_for(model).logits(images).argmax(1)
    _, correlations, floor = _plain(model, images, targets, "gae", 0)
    gae = check["methods"]["gae"]
    assert gae["correlation"] == pytest.approx(correlations.mean(0).tolist(), abs=1e-6)
    assert gae["floor"] == pytest.approx(floor.mean().item(), abs=1e-6)
    assert gae["excess"][0] == pytest.approx((correlations[:, -1] - floor).mean().item(), abs=1e-6)
    again = _bench(tmp_path / "two", models={"tiny": model}, batch_size=1)      # the image floor across batches
    assert again.sanity == result.sanity


def test_the_sanity_key_names_its_protocol_for_all_and_owns_its_label():
    base = dict(models=["digits_vit"], methods=["gae"], dataset="digits")
    with_check = BenchConfig(**base, metrics=["all"], exclude_metrics=["rationale_f1"], sanity={"images": 2})
    without = BenchConfig(**base, metrics=["all"], exclude_metrics=["rationale_f1"])
    assert "model_randomisation" not in [m.name for m in with_check.metrics]
    assert "model_randomisation" in [m.name for m in without.metrics]        # a column like any protocol
    with pytest.raises(ValueError, match="labelled 'sanity'"):
        BenchConfig(**base, metrics=[{"name": "sparseness", "label": "sanity"}], sanity={"images": 2})
    bound = with_check.bind_for((32, 32)).sanity
    assert (bound.name, bound.label, bound.options["seed"]) == ("model_randomisation", "sanity", 0)
