"""The ``degraded`` control: a real method's maps with noise added, blurred or shuffled, against plain computations
(docs/decisions/metric-trust.md)."""
from __future__ import annotations

import pytest
import torch
from scipy.ndimage import gaussian_filter

from vitexplain import explain, get_method
from vitexplain.bench import DEFAULT_CONFIG, BenchConfig
from vitexplain.methods.degraded import degrade

from conftest import make_vit


@pytest.fixture(scope="module")
def model_and_images():
    torch.manual_seed(3)
    return make_vit(depth=2), torch.randn(3, 3, 32, 32)


def _maps(count: int = 2, size: int = 64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.rand(count, size, size, generator=generator) * torch.tensor([1.0, 5.0])[:count, None, None]


def _standard_normal(seed: int, height: int, width: int) -> torch.Tensor:
    return torch.randn(height, width, generator=torch.Generator().manual_seed(seed))


def test_noise_adds_strength_times_the_maps_std_of_one_seeded_standard_normal_field():
    maps = _maps()
    noisy = degrade(maps, "noise", 0.5, seed=4)
    field = (noisy - maps) / (0.5 * maps.flatten(1).std(1)[:, None, None])
    torch.testing.assert_close(field[0], _standard_normal(4, 64, 64))                # the plain draw, one per seed
    torch.testing.assert_close(field[1], field[0])                                   # shared by every map
    assert abs(float(field[0].mean())) < 0.05 and abs(float(field[0].std()) - 1) < 0.05
    spread = (noisy - maps).flatten(1).std(1) / maps.flatten(1).std(1)               # noise std = 0.5 × map std
    torch.testing.assert_close(spread, torch.full((2,), 0.5), atol=0.03, rtol=0)
    assert not torch.allclose(degrade(maps, "noise", 0.5, seed=5), noisy)           # another seed, another field
    torch.testing.assert_close(degrade(maps, "noise", 0.0, seed=4), maps)            # strength 0: the map itself
    flat = torch.ones(1, 8, 8)
    torch.testing.assert_close(degrade(flat, "noise", 1.0, seed=0), flat)            # no spread, no noise


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.5])
def test_blur_is_scipys_gaussian_filter_with_nearest_edges(sigma):
    maps = _maps(2, 14).double()
    blurred = degrade(maps, "blur", sigma, seed=0)
    for i in range(2):
        expected = gaussian_filter(maps[i].numpy(), sigma=sigma, mode="nearest", truncate=4.0)
        torch.testing.assert_close(blurred[i], torch.from_numpy(expected), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(degrade(maps, "blur", 0.0, seed=0), maps)


def test_shuffle_is_one_seeded_permutation_of_each_maps_own_values():
    maps = _maps(2, 10)
    shuffled = degrade(maps, "shuffle", 1.0, seed=2)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(2))
    for i in range(2):
        assert torch.equal(shuffled[i].flatten().sort().values, maps[i].flatten().sort().values)
        assert torch.equal(shuffled[i].flatten(), maps[i].flatten()[order])
    assert not torch.equal(shuffled, maps)
    assert not torch.equal(degrade(maps, "shuffle", 1.0, seed=3), shuffled)


def test_the_method_degrades_the_wrapped_methods_maps_with_its_options(model_and_images):
    model, x = model_and_images
    gae = explain(model, x, "gae", 1)
    state = torch.get_rng_state()
    for kind in ("noise", "blur", "shuffle"):
        found = explain(model, x, "degraded", 1, kind=kind, strength=0.7, seed=5)
        torch.testing.assert_close(found, degrade(gae, kind, 0.7, seed=5))
        alone = torch.cat([explain(model, x[i:i + 1], "degraded", 1, kind=kind, strength=0.7, seed=5)
                           for i in range(3)])
        torch.testing.assert_close(alone, found)                                     # batch-independent
    assert torch.equal(torch.get_rng_state(), state)                                 # caller's RNG untouched
    rollout = explain(model, x, "rollout", 1, start_layer=1)
    torch.testing.assert_close(explain(model, x, "degraded", 1, of="rollout", options={"start_layer": 1},
                                       kind="blur", strength=0.0), rollout)
    spec = get_method("degraded")
    assert spec.control and spec.randomised
    assert spec.passes() == get_method("gae").passes()
    assert spec.passes({"of": "tis", "options": {"n_masks": 8}}) == get_method("tis").passes({"n_masks": 8})


@pytest.mark.parametrize("options, message", [
    ({"of": "no_such_method"}, "is not a registered method"),
    ({"of": "random_baseline"}, "is a control"),
    ({"of": "degraded"}, "is a control"),
    ({"of": "rise"}, "is pixel-level"),
    ({"options": {"no_such_option": 1}}, "no option"),
])
def test_a_wrong_wrapped_method_is_refused_in_one_line(model_and_images, options, message):
    model, x = model_and_images
    with pytest.raises((ValueError, TypeError), match=message) as error:
        explain(model, x, "degraded", 1, **options)
    assert "\n" not in str(error.value)


def test_the_default_bench_has_three_labelled_degraded_copies_of_gae_and_all_adds_no_other():
    config = BenchConfig.from_yaml(DEFAULT_CONFIG)
    copies = {entry.label: entry.options for entry in config.methods if entry.name == "degraded"}
    assert copies == {f"gae~{kind}": {"of": "gae", "kind": kind} for kind in ("noise", "blur", "shuffle")}
    assert [entry.label for entry in config.methods].count("gae") == 1
