"""Smooth and efficient MPRT (Hedström et al. 2023) and the mechanism they re-explain a changed model through
(EvalBatch.modified): values against plain computations, the model restored bitwise, the controls, Quantus."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import scipy.stats
import torch
from torch import nn

import vitexplain
from vitexplain.bench.randomisation import cascading_randomisation
from vitexplain.evaluation import score
from vitexplain.instrumentation.modifying import modified, modifier
from vitexplain.instrumentation.randomisation import randomisation_levels, reinitialise
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.efficient_mprt import histogram_entropy
from vitexplain.metrics.smooth_mprt import reduce_smooth_mprt

from conftest import make_vit


@pytest.fixture(scope="module")
def tiny():
    model = make_vit(depth=2)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, images, vitexplain.adapter_for(model).target(images, None).classes


def snapshot(model: nn.Module):
    return ({k: v.clone() for k, v in model.state_dict().items()}, {n: (id(p), p.requires_grad, p.dtype)
            for n, p in model.named_parameters()}, [m.training for m in model.modules()],
            sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()))


def assert_restored(model: nn.Module, before) -> None:
    state, flags, training, hooks = snapshot(model)
    assert state.keys() == before[0].keys()
    assert all(torch.equal(state[k], before[0][k]) and state[k].dtype == before[0][k].dtype for k in state)
    assert flags == before[1] and training == before[2] and hooks == before[3]


# ------------------------------------------------------------------------------------------ the mechanism


def test_modified_changes_the_model_within_the_block_and_restores_it_bitwise_even_after_an_exception(tiny):
    model, images, _ = tiny
    model.blocks[0].attn.qkv.weight.requires_grad_(False)     # a frozen parameter stays frozen
    before = snapshot(model)
    logits = model(images)
    shared = model.blocks[1].mlp.fc1.weight

    def change(m: nn.Module) -> None:
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1.5)
        m.head.weight.data = m.head.weight.data.bfloat16().float()
        m.blocks[1].mlp.fc1.weight = nn.Parameter(torch.zeros_like(shared))   # a parameter object replaced
        m.blocks[0].attn.qkv.weight.requires_grad_(True)
        m.pos_embed.data = m.pos_embed.data.double()
        m.train()
        m.blocks[0].register_forward_hook(lambda *args: None)

    for failing in (False, True):
        try:
            with modifier(model)(change):
                assert model.training and model.blocks[1].mlp.fc1.weight is not shared
                assert not torch.equal(model.float().eval()(images), logits)
                if failing:
                    raise RuntimeError("inside the block")
        except RuntimeError:
            assert failing
        assert model.blocks[1].mlp.fc1.weight is shared
        assert_restored(model, before)
        assert torch.equal(model(images), logits)
    with pytest.raises(ValueError, match="in change"):
        with modified(model, lambda m: (m.head.weight.data.zero_(), (_ for _ in ()).throw(ValueError("in change")))):
            pass
    assert_restored(model, before)
    model.blocks[0].attn.qkv.weight.requires_grad_(True)


def test_a_batch_without_the_model_is_refused_in_one_line(tiny):
    model, images, targets = tiny
    maps = vitexplain.explain(model, images, "gae", target=targets)
    batch = EvalBatch(images=images, maps=maps, targets=targets, labels=targets, ids=["a", "b", "c"],
                      explain=lambda x, t, seed=None: vitexplain.explain(model, x, "gae", target=t),
                      logits=vitexplain.adapter_for(model).logits)
    for name in ("smooth_mprt", "efficient_mprt", "numerical_stability"):
        with pytest.raises(ValueError, match=f"metric '{name}' needs the model, to change its weights"):
            score(name, batch)


# ------------------------------------------------------------------------------------------ smooth MPRT


def plain_smooth_mprt(model, images, targets, method, n, noise, seed):
    """sMPRT written out: a deep copy randomised level after level from one generator, N - 1 noisy samples from
    torch.randn(seed) plus the clean one, scipy's Spearman of the absolute smoothed maps."""
    z = torch.randn((n - 1, *images.shape[1:]), generator=torch.Generator().manual_seed(seed))
    sigma = noise * (images.flatten(1).max(1).values - images.flatten(1).min(1).values)

    def smooth(m):
        maps = [vitexplain.explain(m, images + z[i] * sigma.view(-1, 1, 1, 1), method, target=targets)
                for i in range(n - 1)] + [vitexplain.explain(m, images, method, target=targets)]
        return torch.stack([mp.double() for mp in maps]).mean(0)

    trained = smooth(model)
    randomised, generator = copy.deepcopy(model), torch.Generator().manual_seed(seed)
    rows = []
    for level in randomisation_levels(randomised):
        reinitialise(level, generator)
        random = smooth(randomised)
        rows.append([scipy.stats.spearmanr(trained[i].abs().flatten(), random[i].abs().flatten())[0]
                     for i in range(len(images))])
    return torch.tensor(rows, dtype=torch.float64).T


def test_smooth_mprt_equals_a_plain_computation_and_leaves_the_model_as_it_was(tiny):
    model, images, targets = tiny
    before = snapshot(model)
    maps = vitexplain.explain(model, images, "gae", target=targets)
    found = vitexplain.evaluate(model, images, maps, "smooth_mprt", targets=targets, method="gae", n_samples=2,
                                seed=5)
    expected = plain_smooth_mprt(model, images, targets, "gae", 2, 0.1, 5)
    torch.testing.assert_close(found.values["similarity_levels"], expected, atol=1e-6, rtol=0)
    assert found.numbers["similarity"] == pytest.approx(expected[:, -1].mean().item(), abs=1e-6)
    assert_restored(model, before)
    last = vitexplain.evaluate(model, images, maps, "smooth_mprt", targets=targets, method="gae", n_samples=2,
                               seed=5, cascade=False)     # the fully random model alone: the cascade's last level
    torch.testing.assert_close(last.values["similarity"], found.values["similarity"])


def test_smooth_mprt_with_one_sample_is_the_bench_sanity_check_on_absolute_maps(tiny):
    model, images, targets = tiny
    maps = vitexplain.explain(model, images, "rollout", target=targets)
    found = vitexplain.evaluate(model, images, maps, "smooth_mprt", targets=targets, method="rollout", n_samples=1,
                                seed=2)
    cascade = cascading_randomisation(model, images, targets, {"rollout": maps}, seed=2, absolute=True,
                                      explain=lambda method, m, x, t: vitexplain.explain(m, x, method, target=t))
    torch.testing.assert_close(found.values["similarity_levels"], cascade.correlations["rollout"], atol=1e-12, rtol=0)


def test_the_average_over_levels_leaves_the_unrandomised_model_out():
    """Quantus's return_average_correlation averages in the trained model's similarity to itself (its loop skips a
    key "orig" that it named "original"): (sum + 1) / (L + 1). Ours is the mean over the randomised levels."""
    levels = torch.tensor([[0.2, 0.4, -0.1, 0.3]], dtype=torch.float64)
    reported = reduce_smooth_mprt({"similarity": levels[:, -1], "similarity_levels": levels})
    assert reported == {"similarity": pytest.approx(0.3), "similarity_average": pytest.approx(0.2)}
    assert reported["similarity_average"] != pytest.approx((levels.sum().item() + 1) / 5)


# ------------------------------------------------------------------------------------------ efficient MPRT


def test_histogram_entropy_is_numpys_histogram_and_scipys_entropy():
    g = torch.Generator().manual_seed(0)
    maps = torch.cat([torch.randn(4, 14, 14, generator=g), torch.rand(4, 14, 14, generator=g).round(decimals=1),
                      torch.zeros(1, 14, 14), torch.linspace(0, 1, 196).view(1, 14, 14)])
    for bins in (7, 100):
        expected = [scipy.stats.entropy(np.histogram(m.numpy(), bins=bins)[0]) for m in maps]
        torch.testing.assert_close(histogram_entropy(maps, bins), torch.tensor(expected, dtype=torch.float64))


def test_efficient_mprt_equals_a_plain_computation(tiny):
    model, images, targets = tiny
    maps = vitexplain.explain(model, images, "gae", target=targets)
    found = vitexplain.evaluate(model, images, maps, "efficient_mprt", targets=targets, method="gae", seed=4,
                                cascade=True)
    randomised, generator = copy.deepcopy(model), torch.Generator().manual_seed(4)
    columns = []
    for level in randomisation_levels(randomised):
        reinitialise(level, generator)
        random = torch.nn.functional.interpolate(vitexplain.explain(randomised, images, "gae", target=targets)[:, None],
                                                 size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
        columns.append([scipy.stats.entropy(np.histogram(m.numpy(), bins=100)[0]) for m in random])
    pixels = torch.nn.functional.interpolate(maps[:, None], size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
    trained = np.array([scipy.stats.entropy(np.histogram(m.numpy(), bins=100)[0]) for m in pixels])
    entropies = np.array(columns).T
    np.testing.assert_allclose(found.values["entropy_levels"].numpy(), entropies, atol=1e-12)
    np.testing.assert_allclose(found.values["complexity_rise"].numpy(), (entropies[:, -1] - trained) / trained,
                               atol=1e-12)


def test_controls_a_constant_map_keeps_its_similarity_and_its_complexity(tiny):
    model, images, targets = tiny
    before = snapshot(model)
    for method in ("constant_baseline", "random_baseline"):          # neither reads the model
        maps = vitexplain.explain(model, images, method, target=targets)
        smooth = vitexplain.evaluate(model, images, maps, "smooth_mprt", targets=targets, method=method,
                                     n_samples=2)
        assert smooth.numbers == {"similarity": 1.0, "similarity_average": 1.0}
        efficient = vitexplain.evaluate(model, images, maps, "efficient_mprt", targets=targets, method=method)
        assert efficient.numbers["complexity_rise"] == 0.0 and efficient.numbers["undefined"] == 0
    assert_restored(model, before)


def test_a_map_that_reads_the_model_falls_with_randomisation():
    from vitexplain.datasets import collate, get_dataset
    from vitexplain.models import load_model

    model, config = load_model("digits_vit", device="cpu")
    images = collate([get_dataset("digits", n=1, preprocess=config)[0]])["images"]
    maps = vitexplain.explain(model, images, "gae")
    smooth = vitexplain.evaluate(model, images, maps, "smooth_mprt", method="gae", n_samples=2, cascade=False)
    efficient = vitexplain.evaluate(model, images, maps, "efficient_mprt", method="gae")
    assert smooth.numbers["similarity"] < 0.3 and efficient.numbers["complexity_rise"] > 1


def test_cost_counts_the_levels_and_the_samples():
    smooth, efficient = get_metric("smooth_mprt"), get_metric("efficient_mprt")
    assert smooth.passes({}, 2.0) == (49 + 50 * 14) * 2.0 and smooth.passes({"n_samples": 3, "cascade": False}, 1) == 5
    assert efficient.passes({}, 3.0) == 3.0 and efficient.passes({"cascade": True}, 1) == 14


# ------------------------------------------------------------------------------------------ side by side with Quantus
