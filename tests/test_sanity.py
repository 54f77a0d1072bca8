"""Honest sanity: the controls, Spearman, the cascading model randomisation, and localisation on digits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import vitexplain
from vitexplain.bench.randomisation import cascading_randomisation, image_to_image, verdict
from vitexplain.instrumentation.randomisation import randomisation_levels, reinitialise
from vitexplain.metrics.correlation import spearman

from conftest import make_vit

# ---------------------------------------------------------------------------------------------- controls


def test_random_baseline_is_one_seeded_noise_map_shared_by_every_image(tiny_vit, images):
    first = vitexplain.explain(tiny_vit, images, "random_baseline", seed=3)
    other_images = vitexplain.explain(tiny_vit, torch.randn(2, 3, 32, 32), "random_baseline", seed=3, target=[1, 2])
    assert first.shape == (4, 4, 4)
    assert torch.equal(first, first[:1].expand_as(first)) and torch.equal(other_images[0], first[0])
    assert (first >= 0).all() and (first < 1).all() and first[0].unique().numel() == 16
    assert not torch.equal(vitexplain.explain(tiny_vit, images, "random_baseline", seed=4), first)


def test_constant_baseline_is_all_ones(tiny_vit, images):
    assert torch.equal(vitexplain.explain(tiny_vit, images, "constant_baseline"), torch.ones(4, 4, 4))


# ---------------------------------------------------------------------------------------------- Spearman


def test_spearman_equals_scipy_image_by_image_with_ties():
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(0, 5, (6, 7, 7), generator=generator).float()          # many ties
    second = first + torch.randn(6, 7, 7, generator=generator) * torch.arange(6).view(6, 1, 1)
    second[0] = torch.randint(0, 3, (7, 7), generator=generator).float()
    found = spearman(first, second)
    for image in range(6):
        expected = spearmanr(first[image].flatten().numpy(), second[image].flatten().numpy()).statistic
        assert found[image].item() == pytest.approx(expected, abs=1e-10)
    assert spearman(first, -first).tolist() == pytest.approx([-1.0] * 6)
    assert spearman(first - 3, second.abs(), absolute=True).tolist() == pytest.approx(
        [spearmanr((first[i] - 3).abs().flatten(), second[i].abs().flatten()).statistic for i in range(6)])


def test_spearman_of_constant_maps():
    constant, varying = torch.ones(1, 3, 3), torch.arange(9.0).view(1, 3, 3)
    assert spearman(constant, 2 * constant).tolist() == [1.0]
    assert spearman(constant, varying).tolist() == [0.0] and spearman(varying, constant).tolist() == [0.0]


# ---------------------------------------------------------------------------------------------- the cascade


def test_levels_go_from_the_head_down_to_the_embedding_and_cover_every_parameter():
    model = make_vit(distilled=True)
    levels = [(level.name, level.names) for level in randomisation_levels(model)]
    assert [name for name, _ in levels] == ["head", "block 2", "block 1", "block 0", "embedding"]
    assigned = [name for _, names in levels for name in names]
    assert sorted(assigned) == sorted(name for name, _ in model.named_parameters())
    top, bottom = set(levels[0][1]), set(levels[-1][1])
    assert {"head.weight", "head_dist.weight", "norm.weight"} <= top
    assert {"cls_token", "dist_token", "pos_embed", "patch_embed.proj.weight"} <= bottom
    assert all(name.startswith("blocks.1.") for name in levels[2][1])


def test_reinitialise_draws_as_timm_initialises_a_vit():
    model = make_vit(init_values=0.5)
    level = randomisation_levels(model)[-2]                                       # block 0
    assert level.name == "block 0" and all(name.startswith("blocks.0.") for name in level.names)
    reinitialise(level, torch.Generator().manual_seed(0))
    block = dict(model.named_parameters())
    assert block["blocks.0.attn.qkv.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert block["blocks.0.attn.qkv.bias"].abs().max() == 0 and block["blocks.0.norm1.bias"].abs().max() == 0
    assert (block["blocks.0.norm1.weight"] == 1).all() and (block["blocks.0.ls1.gamma"] == 1).all()


def test_cascade_randomises_one_more_level_at_a_time_on_a_copy():
    model = make_vit()
    with torch.no_grad():                     # "trained": no parameter keeps its initial value (norms at 1, biases 0)
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape,
                                              generator=torch.Generator().manual_seed(parameter.numel())))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([1, 2])
    seen = []

    def explain(method, randomised, images, targets):
        changed = {name for name, p in randomised.named_parameters() if not torch.equal(p, before[name])}
        seen.append(changed)
        return vitexplain.explain(randomised, images, method, target=targets)

    original = {"gae": vitexplain.explain(model, images, "gae", target=targets)}
    result = cascading_randomisation(model, images, targets, original, explain, seed=0)
    levels = [(level.name, level.names) for level in randomisation_levels(model)]
    expected, cumulative = [], set()
    for _, names in levels:
        cumulative |= set(names)
        expected.append(set(cumulative))
    assert seen == expected
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())       # original untouched
    assert result.levels == [name for name, _ in levels] and result.correlations["gae"].shape == (2, 5)
    again = cascading_randomisation(model, images, targets, original,
                                    lambda m, r, i, t: vitexplain.explain(r, i, m, target=t))
    assert torch.equal(again.correlations["gae"], result.correlations["gae"])              # seeded
    for level in range(5):                                    # one image's value does not depend on its batch
        alone = cascading_randomisation(model, images[1:], targets[1:], {"gae": original["gae"][1:]},
                                        lambda m, r, i, t: vitexplain.explain(r, i, m, target=t))
        assert alone.correlations["gae"][0, level].item() == pytest.approx(result.correlations["gae"][1, level].item(),
                                                                           abs=1e-9)


def test_controls_keep_their_maps_under_randomisation_and_a_model_explanation_does_not():
    model = make_vit()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 4, 7])
    methods = ["gae", "random_baseline", "constant_baseline"]
    original = {m: vitexplain.explain(model, images, m, target=targets) for m in methods}
    result = cascading_randomisation(model, images, targets, original,
                                     lambda m, r, i, t: vitexplain.explain(r, i, m, target=t), seed=5)
    means = {m: c.mean(0).tolist() for m, c in result.correlations.items()}
    assert means["random_baseline"] == [1.0] * 5 and means["constant_baseline"] == [1.0] * 5
    assert means["gae"][-1] < 0.5
    floor = spearman(original["random_baseline"], vitexplain.explain(model, images, "random_baseline", seed=1))
    assert verdict(result.correlations["random_baseline"], floor, 0)["flagged"]        # seeded noise: not the model's


def test_the_verdict_flags_a_correlation_clearly_above_its_floor_or_maps_that_never_change():
    """By hand with numpy: the mean over images of (last level - floor), its 95 % percentile bootstrap drawn by
    default_rng(seed) one resample after the other; flagged when the interval's bottom is above 0."""
    generator = np.random.default_rng(3)
    correlations = torch.from_numpy(generator.uniform(-0.2, 0.9, (8, 4)))
    floor = torch.from_numpy(generator.uniform(0.2, 0.6, 8))

    def by_hand(last: np.ndarray, floor: np.ndarray, seed: int) -> list[float]:
        excess, draw = last - floor, np.random.default_rng(seed)
        means = [excess[draw.integers(0, len(excess), len(excess))].mean() for _ in range(1000)]
        return [excess.mean(), *np.percentile(means, [2.5, 97.5])]

    for shift in (-0.6, 0.0, 0.6):       # the last level far below, near, far above the floor
        moved = correlations.clone()
        moved[:, -1] = floor + shift + torch.from_numpy(generator.normal(0, 0.05, 8))
        found = verdict(moved, floor, 7)
        expected = by_hand(moved[:, -1].numpy(), floor.numpy(), 7)
        assert found["excess"] == pytest.approx(expected, abs=1e-12)
        assert found["flagged"] == (expected[1] > 0) == (shift > 0)
    unchanged = torch.ones(8, 4, dtype=torch.float64)
    assert verdict(unchanged, torch.ones(8, dtype=torch.float64), 7) == {"excess": [0.0, 0.0, 0.0], "flagged": True}
    almost = unchanged.clone()
    almost[0, -1] = 0.99
    assert not verdict(almost, torch.ones(8, dtype=torch.float64), 7)["flagged"]    # one image changed: not "unchanged"


def test_the_image_to_image_floor_pairs_each_map_with_the_previous_image():
    maps = torch.randn(4, 5, 5, generator=torch.Generator().manual_seed(2))
    floor = image_to_image(maps)
    for i in range(4):
        assert floor[i].item() == pytest.approx(spearmanr(maps[i].flatten(), maps[i - 1].flatten())[0], abs=1e-9)
    with pytest.raises(ValueError, match="at least two images"):
        image_to_image(maps[:1])


def test_a_method_failing_on_a_randomised_model_is_reported_not_fatal():
    model = make_vit()
    images = torch.randn(2, 3, 32, 32)
    targets = torch.tensor([0, 1])

    def explain(method, randomised, images, targets):
        if method == "broken":
            raise RuntimeError("cannot explain")
        return vitexplain.explain(randomised, images, method, target=targets)

    original = {"gae": vitexplain.explain(model, images, "gae", target=targets), "broken": torch.zeros(2, 4, 4)}
    result = cascading_randomisation(model, images, targets, original, explain)
    assert result.errors == {"broken": "RuntimeError: cannot explain"} and list(result.correlations) == ["gae"]


# ---------------------------------------------------------------------------------------------- localisation


@pytest.mark.parametrize("model_name", ["digits_vit", "digits_deit"])
def test_seed_methods_localise_digits_far_better_than_the_controls(model_name):
    """On a shipped digits model and 20 test canvases, each seed method finds the digit far better than
    both controls (seeded noise, a constant map): TokenTM and GradToken's transposed variant by the
    segmentation test with the mean threshold (TokenTM's Table 1) and the pointing game, TIS by the
    pointing game (its Table 3) and the segmentation test at GradToken's best threshold (its diffuse
    maps score below the constant map's mIoU at the mean threshold, about 32 against 48).

    GradToken as printed (Eq. 16, the default) does not localise on these small models: background
    tokens attend to the digit, so it ranks the background first and its mAP stays below the random
    map's (about 36-50 against 55; docs/decisions/gradtoken.md). That is asserted, so that a change of
    the models or of the method that alters the finding is noticed and the decision record updated.
    """
    from vitexplain.datasets import get_dataset
    from vitexplain.datasets.base import collate
    from vitexplain.metrics.pointing_game import pointing_game
    from vitexplain.metrics.segmentation import reduce_segmentation, segmentation
    from vitexplain.models import load_model

    model, config = load_model(model_name, device="cpu")
    dataset = get_dataset("digits", split="test", n=1000, preprocess=config)
    batch = collate([dataset[i] for i in range(0, 1000, 50)])
    methods = {"tokentm": ("tokentm", {}), "gradtoken": ("gradtoken", {}),
               "gradtoken_transposed": ("gradtoken", {"transpose": True}), "tis": ("tis", {"n_masks": 64}),
               "random_baseline": ("random_baseline", {}), "constant_baseline": ("constant_baseline", {})}
    seg, seg_best, pointing = {}, {}, {}
    for label, (method, options) in methods.items():
        maps = vitexplain.explain(model, batch["images"], method, **options)
        seg[label] = reduce_segmentation(segmentation(maps, batch["masks"]))
        seg_best[label] = reduce_segmentation(segmentation(maps, batch["masks"], threshold="best"))
        pointing[label] = pointing_game(maps, batch["boxes"], tuple(batch["images"].shape[-2:]))["hit"].mean().item()
    controls = ("random_baseline", "constant_baseline")
    for method in ("tokentm", "gradtoken_transposed", "tis"):
        assert pointing[method] >= max(pointing[c] for c in controls) + 0.4, (method, pointing)
    for method in ("tokentm", "gradtoken_transposed"):
        assert seg[method]["miou"] >= max(seg[c]["miou"] for c in controls) + 10, (method, seg)
    assert seg_best["tis"]["miou"] >= max(seg_best[c]["miou"] for c in controls) + 10, seg_best
    printed, transposed = seg["gradtoken"]["map"], seg["gradtoken_transposed"]["map"]
    noise = seg["random_baseline"]["map"]
    assert printed < noise < transposed - 20, (printed, noise, transposed)


def test_one_image_is_refused_once_for_the_check_not_once_per_method(tmp_path):
    """With one image the image-to-image floor cannot be formed: one error for the check, before any work."""
    from vitexplain.bench import BenchConfig, run_benchmark

    result = run_benchmark(BenchConfig(models=["digits_vit"], methods=["gae", "rollout"], metrics=["sparseness"],
                                       dataset={"name": "digits", "options": {"n": 4}}, limit=1, gallery=0,
                                       sanity={"images": 8}, output_dir=tmp_path, progress=False, device="cpu"))
    assert [(e["method"], e["metric"]) for e in result.errors] == [("", "sanity")]
    assert "needs at least 2 images" in result.errors[0]["error"] and not result.sanity.get("digits_vit")
    assert result.scores["digits_vit"]["gae"]["sparseness"]                  # the rest of the run went on
