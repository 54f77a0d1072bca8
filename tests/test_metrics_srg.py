"""SRG, the Symmetric Relevance Gain (Blücher, Vielhaben & Strodthoff, TMLR 2024): the area between the
least- and the most-relevant-first removal curves."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.insertion_deletion import baseline_images
from vitexplain.metrics.srg import reduce_srg, symmetric_relevance_gain
from vitexplain.options import InvalidOption

from conftest import make_vit
from test_metrics_contract import make_batch
from test_metrics_perturbation import WeightedPixels, linear_model

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)


def tiles(height, width, size):
    """The patches of a grid centred on the image, written out: (rows, columns) slices in raster order."""
    top, left = -(((-height) % size) // 2), -(((-width) % size) // 2)
    return [(slice(max(r, 0), min(r + size, height)), slice(max(c, 0), min(c + size, width)))
            for r in range(top, height, size) for c in range(left, width, size)]


def plain_srg(model, images, maps, targets, size, n_steps, fill):
    """SRG one image and one step at a time: patches by mean relevance, removed by slicing, areas by trapezoids."""
    rows = []
    for image, raw, target in zip(images, maps, targets):
        relevance = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        patches = tiles(*image.shape[-2:], size)
        means = [relevance[ys, xs].double().mean().item() for ys, xs in patches]
        mif = sorted(range(len(patches)), key=lambda p: (-means[p], p))
        lif = sorted(range(len(patches)), key=lambda p: (means[p], p))
        removed = [len(patches) * k // n_steps for k in range(n_steps + 1)]
        substitute = fill(image)
        curves = []
        for order in (mif, lif):
            curve = []
            for count in removed:
                perturbed = image.clone()
                for p in order[:count]:
                    ys, xs = patches[p]
                    perturbed[:, ys, xs] = substitute[:, ys, xs]
                with torch.no_grad():
                    curve.append(model(perturbed[None]).softmax(-1)[0, target].item())
            curves.append(curve)
        x = [count / len(patches) for count in removed]
        area = [sum((x[k + 1] - x[k]) * (c[k] + c[k + 1]) / 2 for k in range(n_steps)) for c in curves]
        rows.append((curves[0], curves[1], area[1] - area[0]))
    return rows


@pytest.mark.parametrize("fill", ["zero", "black", "mean", "blur"])
def test_srg_matches_a_plain_computation(fill):
    g = torch.Generator().manual_seed(0)
    images, maps = torch.randn(3, 3, 11, 13, generator=g), torch.rand(3, 3, 4, generator=g)
    targets = torch.tensor([0, 3, 1])
    model = linear_model(11 * 13)
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    fills = {"zero": lambda image: torch.zeros_like(image), "black": lambda image: (-mean / std).expand_as(image),
             "mean": lambda image: torch.full_like(image, image.mean().item()),
             "blur": lambda image: baseline_images(image[None], "blur")[0]}
    values = symmetric_relevance_gain(model, images, maps, targets, patch_size=4, n_steps=5, fill=fill,
                                      pixel_mean=MEAN, pixel_std=STD, batch_size=7)
    for i, (mif, lif, srg) in enumerate(plain_srg(model, images, maps, targets, 4, 5, fills[fill])):
        assert values["mif"][i].tolist() == pytest.approx(mif, abs=1e-6)
        assert values["lif"][i].tolist() == pytest.approx(lif, abs=1e-6)
        assert values["srg"][i].item() == pytest.approx(srg, abs=1e-6)
    assert torch.allclose(values["srg"], values["lif_auc"] - values["mif_auc"], atol=1e-6)
    reported = reduce_srg(values)
    assert reported["srg"] == pytest.approx(values["srg"].double().mean().item())


def test_a_perfect_map_gains_what_its_reverse_loses_and_a_constant_map_nothing():
    weights = torch.linspace(-1.0, 2.0, 64).roll(17)                      # the evidence of class 0, pixel by pixel
    model = WeightedPixels(weights.tolist(), constant=0.5)
    images = torch.ones(2, 3, 8, 8)
    perfect = weights.view(1, 8, 8).expand(2, -1, -1)
    options = dict(patch_size=2, n_steps=8, fill="zero")
    gained = symmetric_relevance_gain(model, images, perfect, torch.tensor([0, 1]), **options)
    lost = symmetric_relevance_gain(model, images, -perfect, torch.tensor([0, 1]), **options)
    assert gained["srg"][0] > 0.1 and gained["srg"][1] < -0.1          # class 1 gains where class 0 loses
    assert torch.allclose(lost["srg"], -gained["srg"], atol=1e-6)      # the reversed map swaps MIF and LIF
    flat = symmetric_relevance_gain(model, images, torch.ones(2, 8, 8), torch.tensor([0, 1]), **options)
    assert torch.allclose(flat["mif"], flat["lif"], atol=1e-6) and flat["srg"].abs().max() < 1e-6


def test_srg_does_not_depend_on_batching_and_shares_the_end_points():
    g = torch.Generator().manual_seed(1)
    images, maps = torch.randn(4, 3, 12, 12, generator=g), torch.rand(4, 3, 3, generator=g)
    targets = torch.tensor([2, 0, 4, 1])
    model = linear_model(144)
    seen = []

    def forward(batch):
        seen.append(batch.shape[0])
        return model(batch)

    whole = symmetric_relevance_gain(forward, images, maps, targets, patch_size=3, n_steps=6, batch_size=64)
    assert sum(seen) == 4 * 2 * 6                                       # 2 n forwards: intact and all-removed once
    alone = symmetric_relevance_gain(model, images[2:3], maps[2:3], targets[2:3], patch_size=3, n_steps=6,
                                     batch_size=5)
    for key in whole:
        assert torch.allclose(whole[key][2:3], alone[key], atol=1e-6), key
    assert torch.equal(whole["mif"][:, 0], whole["lif"][:, 0]) and torch.equal(whole["mif"][:, -1], whole["lif"][:, -1])


def test_srg_refuses_bad_options_in_one_line(tiny_vit):
    metric = get_metric("srg")
    batch = EvalBatch(images=torch.zeros(1, 3, 32, 32), maps=torch.zeros(1, 4, 4), targets=torch.tensor([0]),
                      labels=torch.tensor([0]), explain=None, logits=vitexplain.adapter_for(tiny_vit).logits,
                      ids=["a"])
    for options in ({"n_steps": 1}, {"fill": "noise"}, {"patch_size": 0}, {"batch_size": 0}):
        with pytest.raises(InvalidOption) as error:
            metric.check_options(options)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="exceeds the image"):
        metric.compute(batch, **{**metric.options, "patch_size": 40})
    with pytest.raises(ValueError, match="mean and std the images were normalised with"):
        metric.compute(batch, **{**metric.options, "fill": "black"})
    with pytest.raises(TypeError, match="n_step"):
        metric.check_options({"n_step": 3})


def contract_holds(name, options):
    """The bench's contract, as tests/test_metrics_contract.py checks it: per-image values of the right shapes that
    reduce the same whatever the batching, the reported numbers all ranked, the batch and options only."""
    model = make_vit(depth=2)
    metric = get_metric(name)
    options = {**metric.options, **options}
    whole = metric.compute(make_batch(model, "gae"), **options)
    assert all(value.shape[0] == 4 and value.dim() <= 2 for value in whole.values())
    halves = [metric.compute(make_batch(model, "gae", rows), **options) for rows in (slice(0, 1), slice(1, 4))]
    joined = {key: torch.cat([half[key] for half in halves]) for key in whole}
    reported = metric.reduce(whole)
    assert reported == pytest.approx(metric.reduce(joined), abs=1e-6)
    assert set(metric.higher_is_better) == set(reported) and all(math.isfinite(v) for v in reported.values())
    assert metric.group == "faithfulness" and metric.requires == ()
    parameters = [p for p in __import__("inspect").signature(metric.compute).parameters.values()]
    assert [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY] == ["batch"]
    for key, value in whole.items():
        if value.dim() == 2 and metric.curves is not None:
            x = metric.curves.x(options, value.shape[1])
            assert len(x) == value.shape[1] and key in metric.curves.ylabels
    return metric, options


def test_srg_keeps_the_bench_contract():
    metric, options = contract_holds("srg", {"patch_size": 8, "n_steps": 4})
    assert metric.passes(options, 3.0) == 8 and metric.curves.x(options, 5) == [0, 0.25, 0.5, 0.75, 1]


def test_evaluate_gives_the_per_image_values_of_the_plain_function(tiny_vit, images):
    maps = vitexplain.explain(tiny_vit, images, "gae")
    scores = vitexplain.evaluate(tiny_vit, images, maps, "srg", mean=MEAN, std=STD, batch_size=3, patch_size=8,
                                 n_steps=4, fill="black")
    with torch.no_grad():
        targets = tiny_vit(images).argmax(1)
    direct = symmetric_relevance_gain(vitexplain.adapter_for(tiny_vit).logits, images, maps, targets, patch_size=8,
                                      n_steps=4, fill="black", pixel_mean=MEAN, pixel_std=STD)
    for key, value in direct.items():
        assert torch.allclose(scores.values[key], value, atol=1e-6), key
    assert scores.numbers == pytest.approx(reduce_srg(direct)) and scores.images == 4
    assert set(scores.intervals) == {"srg", "mif_auc", "lif_auc"}


def test_the_batch_forward_sees_every_perturbed_image(tiny_vit):
    batch = make_batch(tiny_vit, "gae")
    calls, forward = [], batch.logits
    batch = dataclasses.replace(batch, logits=lambda images: calls.append(images.shape[0]) or forward(images))
    get_metric("srg").compute(batch, **{**get_metric("srg").options, "patch_size": 8, "n_steps": 3, "batch_size": 5})
    assert sum(calls) == 4 * 2 * 3 and max(calls) <= 5
