"""Selectivity (Montavon, Samek & Müller, DSP 2018): the area under the explained score while patches turn
black, most relevant first."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.selectivity import reduce_selectivity, selectivity
from vitexplain.options import InvalidOption

from test_metrics_perturbation import WeightedPixels, linear_model
from test_metrics_srg import contract_holds, tiles

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)


def plain_selectivity(model, images, maps, targets, size):
    """Patches set to black (0 before normalisation) one at a time in order of their summed relevance; the score
    after each, and the trapezoid area with the K + 1 points at k / K."""
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    curves, areas = [], []
    for image, raw, target in zip(images, maps, targets):
        relevance = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        patches = tiles(*image.shape[-2:], size)
        sums = [relevance[ys, xs].double().sum().item() for ys, xs in patches]
        pixels = image * std + mean
        curve = []
        for k, p in enumerate([None] + sorted(range(len(patches)), key=lambda p: (-sums[p], p))):
            if p is not None:
                ys, xs = patches[p]
                pixels[:, ys, xs] = 0.0
            with torch.no_grad():
                curve.append(model(((pixels - mean) / std)[None]).softmax(-1)[0, target].item())
        steps = len(curve) - 1
        curves.append(curve)
        areas.append(sum((curve[k] + curve[k + 1]) / 2 / steps for k in range(steps)))
    return curves, areas


def test_selectivity_matches_patch_by_patch_blackening():
    g = torch.Generator().manual_seed(0)
    images, maps = torch.randn(3, 3, 10, 8, generator=g), torch.rand(3, 4, 2, generator=g)
    targets = torch.tensor([3, 0, 2])
    model = linear_model(80)
    values = selectivity(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=3, batch_size=6)
    curves, areas = plain_selectivity(model, images, maps, targets, 3)
    assert values["score"].shape == (3, len(tiles(10, 8, 3)) + 1)
    for got, curve in zip(values["score"], curves):
        assert got.tolist() == pytest.approx(curve, abs=1e-6)
    assert reduce_selectivity(values)["auc"] == pytest.approx(sum(areas) / 3, abs=1e-6)


def test_the_default_patches_keep_the_papers_seven_by_seven_grid():
    for side, patches in ((28, 49), (30, 36), (112, 49)):          # 4-px patches at 28 px, 5 at 30, 16 at 112
        model = linear_model(side * side, classes=3)
        values = selectivity(model, torch.zeros(1, 3, side, side), torch.rand(1, 4, 4), torch.tensor([0]),
                             pixel_mean=MEAN, pixel_std=STD)
        assert values["score"].shape == (1, patches + 1)
    literal = selectivity(model, torch.zeros(1, 3, 112, 112), torch.rand(1, 4, 4), torch.tensor([0]),
                          pixel_mean=MEAN, pixel_std=STD, patch_size=28)
    assert literal["score"].shape == (1, 17)


def test_a_perfect_map_is_more_selective_than_its_reverse():
    weights = torch.linspace(-1.0, 2.0, 144).roll(31)
    model = WeightedPixels(weights.tolist(), constant=weights.sum().item())      # p = 1/2 on the image itself
    images = torch.ones(1, 3, 12, 12)                                              # black (0) lowers every pixel
    perfect = weights.view(1, 12, 12)
    options = dict(pixel_mean=(0.0,) * 3, pixel_std=(1.0,) * 3, patch_size=3)
    good = reduce_selectivity(selectivity(model, images, perfect, torch.tensor([0]), **options))
    bad = reduce_selectivity(selectivity(model, images, -perfect, torch.tensor([0]), **options))
    assert good["auc"] < 0.3 < bad["auc"]


def test_selectivity_does_not_depend_on_batching():
    g = torch.Generator().manual_seed(2)
    images, maps = torch.randn(3, 3, 12, 12, generator=g), torch.rand(3, 6, 6, generator=g)
    targets = torch.tensor([1, 1, 0])
    model = linear_model(144)
    whole = selectivity(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=4, batch_size=64)
    alone = selectivity(model, images[1:2], maps[1:2], targets[1:2], pixel_mean=MEAN, pixel_std=STD, patch_size=4,
                        batch_size=3)
    assert torch.allclose(whole["score"][1:2], alone["score"], atol=1e-6)


def test_selectivity_refuses_bad_options_in_one_line(tiny_vit):
    metric = get_metric("selectivity")
    for options in ({"patch_size": 0}, {"patch_size": 2.5}, {"score": "softmax"}, {"batch_size": -1}):
        with pytest.raises(InvalidOption) as error:
            metric.check_options(options)
        assert "\n" not in str(error.value)
    batch = EvalBatch(images=torch.zeros(1, 3, 32, 32), maps=torch.zeros(1, 4, 4), targets=torch.tensor([0]),
                      labels=torch.tensor([0]), explain=None, logits=vitexplain.adapter_for(tiny_vit).logits,
                      ids=["a"])
    with pytest.raises(ValueError, match="mean and std the images were normalised with"):
        metric.compute(batch, **metric.options)
    with pytest.raises(ValueError, match="exceeds the image"):
        metric.compute(dataclasses.replace(batch, mean=MEAN, std=STD), **{**metric.options, "patch_size": 64})


def test_selectivity_keeps_the_bench_contract():
    metric, options = contract_holds("selectivity", {"patch_size": 16})
    assert metric.curves.x(options, 5) == [0, 0.25, 0.5, 0.75, 1]
    assert metric.passes({}, 3.0) == 50 and metric.passes({"patch_size": 16}, 3.0) == 197   # at 224 px


def test_evaluate_gives_the_per_image_values_of_the_plain_function(tiny_vit, images):
    maps = vitexplain.explain(tiny_vit, images, "gae")
    scores = vitexplain.evaluate(tiny_vit, images, maps, "selectivity", mean=MEAN, std=STD, batch_size=3,
                                 patch_size=8, score="logit")
    with torch.no_grad():
        targets = tiny_vit(images).argmax(1)
    direct = selectivity(vitexplain.adapter_for(tiny_vit).logits, images, maps, targets, pixel_mean=MEAN,
                         pixel_std=STD, patch_size=8, score="logit")
    assert torch.allclose(scores.values["score"], direct["score"], atol=1e-5)
    assert scores.numbers == pytest.approx(reduce_selectivity(direct)) and scores.images == 4
