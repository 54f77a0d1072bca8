"""Region Perturbation (Samek et al., IEEE TNNLS 2017): AOPC while the most relevant patches become uniform noise."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.region_perturbation import reduce_region_perturbation, region_perturbation
from vitexplain.options import InvalidOption
from vitexplain.seeding import seeded_draw

from test_metrics_perturbation import WeightedPixels, linear_model
from test_metrics_srg import contract_holds, tiles

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)


def plain_region_perturbation(model, images, maps, targets, size, steps, seed, score):
    """The MoRF recursion one image and one region at a time: x^(k) = x^(k-1) with patch r_k made U[0, 1) noise
    in pixel units (the seed's one draw), the patches ranked by their summed relevance."""
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    noise = seeded_draw(seed, lambda generator: torch.rand(images.shape[1:], generator=generator))
    rows = []
    for image, raw, target in zip(images, maps, targets):
        relevance = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        patches = tiles(*image.shape[-2:], size)
        sums = [relevance[ys, xs].double().sum().item() for ys, xs in patches]
        order = sorted(range(len(patches)), key=lambda p: (-sums[p], p))
        pixels = image * std + mean
        values = []
        for k in range(min(steps, len(patches)) + 1):
            if k:
                ys, xs = patches[order[k - 1]]
                pixels[:, ys, xs] = noise[:, ys, xs]
            with torch.no_grad():
                logits = model(((pixels - mean) / std)[None])[0]
            values.append(logits[target].item() if score == "logit" else logits.softmax(-1)[target].item())
        rows.append([values[0] - value for value in values])
    return rows


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_region_perturbation_matches_the_morf_recursion(score):
    g = torch.Generator().manual_seed(0)
    images, maps = torch.randn(3, 3, 13, 10, generator=g), torch.rand(3, 5, 3, generator=g)
    targets = torch.tensor([1, 0, 4])
    model = linear_model(130)
    values = region_perturbation(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=4,
                                 n_regions=7, score=score, batch_size=5, seed=3)
    expected = plain_region_perturbation(model, images, maps, targets, 4, 7, 3, score)
    assert values["drop"].shape == (3, 8)
    for got, row in zip(values["drop"], expected):
        assert got.tolist() == pytest.approx(row, abs=2e-5)
    assert reduce_region_perturbation(values)["aopc"] == pytest.approx(torch.tensor(expected).double().mean().item(),
                                                                       abs=1e-5)
    every = region_perturbation(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=4,
                                n_regions=100, score=score)
    assert every["drop"].shape == (3, len(tiles(13, 10, 4)) + 1)            # L is capped at the patch count


def test_a_perfect_map_has_a_higher_aopc_than_its_reverse():
    weights = torch.linspace(-1.0, 2.0, 144).roll(31)
    model = WeightedPixels(weights.tolist(), constant=3 * weights.sum().item())   # p = 1/2 on the image itself
    images = torch.full((1, 3, 12, 12), 3.0)                       # noise in [0, 1) lowers every pixel's value
    perfect = weights.view(1, 12, 12)
    options = dict(pixel_mean=(0.0,) * 3, pixel_std=(1.0,) * 3, patch_size=3, n_regions=6)
    good = reduce_region_perturbation(region_perturbation(model, images, perfect, torch.tensor([0]), **options))
    bad = reduce_region_perturbation(region_perturbation(model, images, -perfect, torch.tensor([0]), **options))
    assert good["aopc"] > 0.05 > bad["aopc"]


def test_values_do_not_depend_on_batching_and_the_seed_decides_the_noise():
    g = torch.Generator().manual_seed(1)
    images, maps = torch.randn(4, 3, 9, 9, generator=g), torch.rand(4, 3, 3, generator=g)
    targets = torch.tensor([0, 2, 1, 3])
    model = linear_model(81)
    options = dict(pixel_mean=MEAN, pixel_std=STD, patch_size=3, n_regions=5)
    whole = region_perturbation(model, images, maps, targets, batch_size=64, **options)["drop"]
    alone = region_perturbation(model, images[3:], maps[3:], targets[3:], batch_size=2, **options)["drop"]
    assert torch.allclose(whole[3:], alone, atol=1e-6)
    again = region_perturbation(model, images, maps, targets, seed=0, **options)["drop"]
    other = region_perturbation(model, images, maps, targets, seed=1, **options)["drop"]
    assert torch.allclose(whole, again, atol=1e-6) and not torch.allclose(whole, other, atol=1e-4)


def test_region_perturbation_refuses_bad_options_in_one_line(tiny_vit):
    metric = get_metric("region_perturbation")
    for options in ({"patch_size": 0}, {"n_regions": 0}, {"score": "softmax"}, {"seed": 0.5}):
        with pytest.raises(InvalidOption) as error:
            metric.check_options(options)
        assert "\n" not in str(error.value)
    batch = EvalBatch(images=torch.zeros(1, 3, 32, 32), maps=torch.zeros(1, 4, 4), targets=torch.tensor([0]),
                      labels=torch.tensor([0]), explain=None, logits=vitexplain.adapter_for(tiny_vit).logits,
                      ids=["a"])
    with pytest.raises(ValueError, match="mean and std the images were normalised with"):
        metric.compute(batch, **metric.options)
    with pytest.raises(ValueError, match="exceeds the image"):
        metric.compute(dataclasses.replace(batch, mean=MEAN, std=STD), **{**metric.options, "patch_size": 33})


def test_region_perturbation_keeps_the_bench_contract():
    metric, options = contract_holds("region_perturbation", {"patch_size": 8, "n_regions": 5})
    assert metric.passes(options, 3.0) == 6 and metric.curves.x(options, 6) == [0, 1, 2, 3, 4, 5]


def test_evaluate_gives_the_per_image_values_of_the_plain_function(tiny_vit, images):
    maps = vitexplain.explain(tiny_vit, images, "gae")
    scores = vitexplain.evaluate(tiny_vit, images, maps, "region_perturbation", mean=MEAN, std=STD, batch_size=3,
                                 patch_size=8, n_regions=5, seed=4)
    with torch.no_grad():
        targets = tiny_vit(images).argmax(1)
    direct = region_perturbation(vitexplain.adapter_for(tiny_vit).logits, images, maps, targets, pixel_mean=MEAN,
                                 pixel_std=STD, patch_size=8, n_regions=5, seed=4)
    assert torch.allclose(scores.values["drop"], direct["drop"], atol=1e-6)
    assert scores.numbers == pytest.approx(reduce_region_perturbation(direct)) and scores.images == 4
