"""Faithfulness correlation (Bhatt et al. 2020), faithfulness estimate (Alvarez-Melis & Jaakkola 2018), monotonicity
correlation (Nguyen & Martínez 2020) and pixel flipping (Bach et al. 2015, as Quantus computes it): each against its
equation written out one image and one perturbation at a time, plus properties a wrong implementation would fail."""
import math

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F

from vitexplain.metrics import get_metric
from vitexplain.metrics.faithfulness_correlation import faithfulness_correlation
from vitexplain.metrics.faithfulness_estimate import faithfulness_estimate
from vitexplain.metrics.insertion_deletion import insertion_deletion
from vitexplain.metrics.monotonicity_correlation import monotonicity_correlation
from vitexplain.metrics.pixel_flipping import pixel_flipping, reduce_pixel_flipping
from vitexplain.options import InvalidOption

from test_metrics_perturbation import WeightedPixels, linear_model
from test_metrics_srg import contract_holds, tiles

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)
CHEAP = {"faithfulness_correlation": {"n_samples": 4, "subset_size": 64},
         "faithfulness_estimate": {"patch_size": 16},
         "monotonicity_correlation": {"patch_size": 16, "n_samples": 2},
         "pixel_flipping": {"n_steps": 6}}


def channels(values):
    return torch.tensor(values)[:, None, None]


def score_of(model, image, target, score):
    with torch.no_grad():
        logits = model(image[None])[0]
    return logits[target].item() if score == "logit" else logits.softmax(-1)[target].item()


def blackened(image, ys, xs):
    """The image with the pixels at (ys, xs) set to 0 in pixel units (black), in the normalised space."""
    pixels = image * channels(STD) + channels(MEAN)
    pixels[:, ys, xs] = 0.0
    return (pixels - channels(MEAN)) / channels(STD)


def upsampled(raw, image):
    return F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0].double()


def pearson(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def subsets(seed, count, pixels, size):
    """The seed's subsets: the first ``size`` of a random order of the pixels, one order per subset."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((count, pixels), generator=generator).argsort(1)[:, :size]


# ---------------------------------------------------------------- faithfulness correlation

def plain_faithfulness_correlation(model, images, maps, targets, runs, size, seed, score):
    """Bhatt et al.'s Eq. 2 one image and one subset at a time: the subset's summed attribution against the drop
    of the score when its pixels are black."""
    width = images.shape[-1]
    chosen = subsets(seed, runs, images.shape[-2] * width, size)
    found = []
    for image, raw, target in zip(images, maps, targets):
        relevance = upsampled(raw, image)
        intact = score_of(model, image, target, score)
        sums, drops = [], []
        for subset in chosen:
            ys, xs = subset // width, subset % width
            sums.append(relevance[ys, xs].sum().item())
            drops.append(intact - score_of(model, blackened(image, ys, xs), target, score))
        found.append(pearson(sums, drops))
    return found


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_faithfulness_correlation_matches_the_subset_loop(score):
    g = torch.Generator().manual_seed(0)
    images, maps = torch.randn(3, 3, 9, 8, generator=g), torch.rand(3, 3, 3, generator=g)
    targets = torch.tensor([1, 0, 4])
    model = linear_model(72)
    values = faithfulness_correlation(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, n_samples=12,
                                      subset_size=7, score=score, batch_size=5, seed=3)
    expected = plain_faithfulness_correlation(model, images, maps, targets, 12, 7, 3, score)
    assert values["correlation"].tolist() == pytest.approx(expected, abs=1e-5)
    assert all(abs(value) > 0.05 for value in expected)                      # not the undefined case


def test_an_additive_model_scores_one_for_its_exact_attribution_and_minus_one_for_its_negation():
    """Logit 0 = w . (channel-mean pixels): blackening a subset drops it by the sum over the subset of
    w_i (mean pixel - mean black), exactly what that map gives the subset."""
    weights = torch.linspace(-1.0, 2.0, 64).roll(11)
    model = WeightedPixels(weights.tolist())
    images = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    black = (-channels(MEAN) / channels(STD)).mean(0)
    exact = weights.view(1, 8, 8) * (images.mean(1) - black)
    options = dict(pixel_mean=MEAN, pixel_std=STD, n_samples=10, subset_size=5, score="logit", seed=1)
    good = faithfulness_correlation(model, images, exact, torch.tensor([0, 0]), **options)["correlation"]
    bad = faithfulness_correlation(model, images, -exact, torch.tensor([0, 0]), **options)["correlation"]
    assert good.tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    assert bad.tolist() == pytest.approx([-1.0, -1.0], abs=1e-5)


def test_faithfulness_correlation_batches_every_subset_of_the_batch_together():
    model, calls = linear_model(64), []
    images, maps = torch.randn(3, 3, 8, 8), torch.rand(3, 4, 4)

    def forward(x):
        calls.append(x.shape[0])
        return model(x)

    faithfulness_correlation(forward, images, maps, torch.tensor([0, 1, 2]), pixel_mean=MEAN, pixel_std=STD,
                             n_samples=10, subset_size=6, batch_size=8)
    assert calls == [3] + [8, 8, 8, 6]                              # the images once, then 30 (image, subset) pairs


# ---------------------------------------------------------------- faithfulness estimate

def plain_faithfulness_estimate(model, images, maps, targets, size, fill, score):
    """Every patch removed alone from the intact image; Pearson of the patch sums with the drops."""
    found = []
    for image, raw, target in zip(images, maps, targets):
        relevance = upsampled(raw, image)
        intact = score_of(model, image, target, score)
        sums, drops = [], []
        for ys, xs in tiles(*image.shape[-2:], size):
            sums.append(relevance[ys, xs].sum().item())
            if fill == "black":
                removed = blackened(image, ys, xs)
            else:                                                      # "mean": the image's mean value
                removed = image.clone()
                removed[:, ys, xs] = image.mean()
            drops.append(intact - score_of(model, removed, target, score))
        found.append(pearson(sums, drops))
    return found


@pytest.mark.parametrize("fill, score", [("black", "probability"), ("mean", "logit")])
def test_faithfulness_estimate_matches_removing_each_patch_alone(fill, score):
    g = torch.Generator().manual_seed(1)
    images, maps = torch.randn(3, 3, 11, 10, generator=g), torch.rand(3, 4, 3, generator=g)
    targets = torch.tensor([2, 0, 3])
    model = linear_model(110)
    values = faithfulness_estimate(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=3,
                                   fill=fill, score=score, batch_size=7)
    expected = plain_faithfulness_estimate(model, images, maps, targets, 3, fill, score)
    assert values["correlation"].tolist() == pytest.approx(expected, abs=1e-5)


def test_a_map_of_the_true_drops_scores_one_and_its_reverse_minus_one():
    g = torch.Generator().manual_seed(4)
    images, targets, model = torch.randn(2, 3, 12, 12, generator=g), torch.tensor([1, 3]), linear_model(144, seed=2)
    drops = torch.zeros(2, 12, 12)
    for b, image in enumerate(images):
        intact = score_of(model, image, targets[b], "probability")
        for ys, xs in tiles(12, 12, 4):
            drops[b, ys, xs] = (intact - score_of(model, blackened(image, ys, xs), targets[b], "probability")) / 16
    options = dict(pixel_mean=MEAN, pixel_std=STD, patch_size=4, score="probability")
    good = faithfulness_estimate(model, images, drops, targets, **options)["correlation"]
    bad = faithfulness_estimate(model, images, -drops, targets, **options)["correlation"]
    assert good.tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    assert bad.tolist() == pytest.approx([-1.0, -1.0], abs=1e-5)


# ---------------------------------------------------------------- monotonicity correlation

def plain_monotonicity(model, images, maps, targets, size, draws, seed, score):
    """Each patch replaced by each noise draw (uniform pixel values); Spearman of |patch sum| with the mean squared
    change of the score."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand((draws, *images.shape[1:]), generator=generator)
    found = []
    for image, raw, target in zip(images, maps, targets):
        relevance = upsampled(raw, image)
        intact = score_of(model, image, target, score)
        magnitudes, changes = [], []
        for ys, xs in tiles(*image.shape[-2:], size):
            magnitudes.append(abs(relevance[ys, xs].sum().item()))
            squares = []
            for draw in noise:
                pixels = image * channels(STD) + channels(MEAN)
                pixels[:, ys, xs] = draw[:, ys, xs]
                changed = (pixels - channels(MEAN)) / channels(STD)
                squares.append((intact - score_of(model, changed, target, score)) ** 2)
            changes.append(sum(squares) / draws)
        found.append(scipy.stats.spearmanr(magnitudes, changes)[0])
    return found


@pytest.mark.parametrize("score", ["probability", "logit"])
def test_monotonicity_matches_the_draw_loop(score):
    g = torch.Generator().manual_seed(5)
    images, maps = torch.randn(2, 3, 10, 9, generator=g), torch.randn(2, 5, 3, generator=g)     # signed maps
    targets = torch.tensor([3, 1])
    model = linear_model(90)
    values = monotonicity_correlation(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=3,
                                      n_samples=4, score=score, batch_size=6, seed=2)
    expected = plain_monotonicity(model, images, maps, targets, 3, 4, 2, score)
    assert values["correlation"].tolist() == pytest.approx(expected, abs=1e-5)


def test_monotonicity_is_one_when_the_magnitudes_order_the_changes_and_minus_one_reversed():
    """Logit 0 = w . (channel-mean pixels) with |w| doubling patch by patch on a uniform image: noise on a patch
    moves the logit by |w| times what it moves on any other, so a map of those |w| orders the patches as the
    changes and its reciprocal reverses them."""
    weights = torch.zeros(12, 12)
    for k, (ys, xs) in enumerate(tiles(12, 12, 4)):
        weights[ys, xs] = 2.0 ** k * (-1) ** k
    model = WeightedPixels(weights.flatten().tolist())
    images = torch.zeros(1, 3, 12, 12)
    options = dict(pixel_mean=MEAN, pixel_std=STD, patch_size=4, n_samples=20, score="logit")
    good = monotonicity_correlation(model, images, weights[None], torch.tensor([0]), **options)["correlation"]
    bad = monotonicity_correlation(model, images, 1 / weights[None], torch.tensor([0]), **options)["correlation"]
    assert good.item() == pytest.approx(1.0) and bad.item() == pytest.approx(-1.0)


# ---------------------------------------------------------------- pixel flipping

def plain_pixel_flipping(model, images, maps, targets, n_steps):
    """Pixels ranked on the upsampled map (ties: raster order), ceil(HW / n) more set to black each step."""
    height, width = images.shape[-2:]
    per_step = math.ceil(height * width / n_steps)
    curves = []
    for image, raw, target in zip(images, maps, targets):
        relevance = upsampled(raw, image).flatten()
        order = sorted(range(height * width), key=lambda p: (-relevance[p].item(), p))
        curve = []
        for step in range(1, n_steps + 1):
            gone = torch.tensor(order[:min(step * per_step, height * width)])
            curve.append(score_of(model, blackened(image, gone // width, gone % width), target, "probability"))
        curves.append(curve)
    return curves


def test_pixel_flipping_matches_the_flipping_loop_and_is_the_deletion_curve():
    g = torch.Generator().manual_seed(7)
    images, maps = torch.randn(3, 3, 7, 9, generator=g), torch.rand(3, 3, 3, generator=g)
    maps[1] = maps[1].round(decimals=1)                                         # ties
    targets = torch.tensor([0, 4, 2])
    model = linear_model(63)
    values = pixel_flipping(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, n_steps=5, batch_size=4)
    expected = plain_pixel_flipping(model, images, maps, targets, 5)
    for got, curve in zip(values["curve"], expected):
        assert got.tolist() == pytest.approx(curve, abs=1e-6)
    rise = [(sum(c) - c[0] / 2 - c[-1] / 2) / (len(c) - 1) for c in expected]
    assert values["auc"].tolist() == pytest.approx(rise, abs=1e-6)
    assert reduce_pixel_flipping(values)["auc"] == pytest.approx(sum(rise) / 3, abs=1e-6)
    zero = pixel_flipping(model, images, maps, targets, n_steps=5, fill="zero")["curve"]
    deletion = insertion_deletion(model, images, maps, targets, n_steps=5, baseline="black")["deletion"]
    assert torch.equal(zero, deletion)                     # TIS's "black" (zeros): one arithmetic, one result


def test_a_perfect_map_flips_the_class_away_sooner_than_its_reverse():
    weights = torch.linspace(-1.0, 2.0, 144).roll(31)
    model = WeightedPixels(weights.tolist(), constant=3 * weights.sum().item())
    images = torch.full((1, 3, 12, 12), 3.0)                       # black (0) lowers every pixel
    options = dict(pixel_mean=(0.0,) * 3, pixel_std=(1.0,) * 3, n_steps=8)
    good = pixel_flipping(model, images, weights.view(1, 12, 12), torch.tensor([0]), **options)["auc"]
    bad = pixel_flipping(model, images, -weights.view(1, 12, 12), torch.tensor([0]), **options)["auc"]
    assert good.item() < 0.1 and bad.item() > 0.5


# ---------------------------------------------------------------- all four

RUNS = {
    "faithfulness_correlation": lambda model, images, maps, targets, **kw: faithfulness_correlation(
        model, images, maps, targets, n_samples=6, subset_size=9, **kw),
    "faithfulness_estimate": lambda model, images, maps, targets, seed=0, **kw: faithfulness_estimate(
        model, images, maps, targets, patch_size=3, **kw),
    "monotonicity_correlation": lambda model, images, maps, targets, **kw: monotonicity_correlation(
        model, images, maps, targets, patch_size=3, n_samples=3, **kw),
    "pixel_flipping": lambda model, images, maps, targets, seed=0, **kw: pixel_flipping(
        model, images, maps, targets, n_steps=7, **kw),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_values_do_not_depend_on_batching(name):
    g = torch.Generator().manual_seed(8)
    images, maps, targets = torch.randn(4, 3, 9, 9, generator=g), torch.rand(4, 3, 3, generator=g), torch.tensor(
        [0, 2, 1, 3])
    model = linear_model(81)
    run = RUNS[name]
    whole = run(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, batch_size=64)
    alone = run(model, images[2:3], maps[2:3], targets[2:3], pixel_mean=MEAN, pixel_std=STD, batch_size=2)
    for key in whole:
        assert torch.allclose(whole[key][2:3], alone[key], atol=1e-6)


@pytest.mark.parametrize("name", ["faithfulness_correlation", "monotonicity_correlation"])
def test_the_seed_decides_the_draws(name):
    g = torch.Generator().manual_seed(9)
    images, maps, targets = torch.randn(3, 3, 9, 9, generator=g), torch.rand(3, 3, 3, generator=g), torch.tensor(
        [0, 2, 1])
    model, run = linear_model(81), RUNS[name]
    first, again, other = (run(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, seed=seed)["correlation"]
                           for seed in (1, 1, 2))
    assert torch.equal(first, again) and not torch.allclose(first, other, atol=1e-4)


@pytest.mark.parametrize("name", ["faithfulness_correlation", "faithfulness_estimate", "monotonicity_correlation"])
def test_a_constant_map_scores_zero_even_with_cut_border_patches(name):
    images = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(10))   # 3-px patches: cut borders
    maps = torch.full((2, 3, 3), 0.37)
    values = RUNS[name](linear_model(100), images, maps, torch.tensor([0, 1]), pixel_mean=MEAN, pixel_std=STD)
    assert values["correlation"].tolist() == [0.0, 0.0]


def test_bad_inputs_are_refused_in_one_line():
    images, maps, targets = torch.zeros(1, 3, 8, 8), torch.rand(1, 2, 2), torch.tensor([0])
    model = linear_model(64)
    with pytest.raises(ValueError, match="subset_size must be an integer from 1 to the image's 64 pixels") as error:
        faithfulness_correlation(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, subset_size=65)
    with pytest.raises(ValueError, match="mean and std the images were normalised with"):
        faithfulness_estimate(model, images, maps, targets, patch_size=4)
    with pytest.raises(ValueError, match="mean and std the images were normalised with"):
        monotonicity_correlation(model, images, maps, targets, pixel_mean=None, pixel_std=None, patch_size=4)
    with pytest.raises(ValueError, match="exceeds the image"):
        faithfulness_estimate(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, patch_size=9)
    assert "\n" not in str(error.value)
    for name, options in (("faithfulness_correlation", {"n_samples": 1}), ("faithfulness_estimate", {"fill": "white"}),
                          ("monotonicity_correlation", {"patch_size": 0}), ("pixel_flipping", {"n_steps": 1})):
        with pytest.raises(InvalidOption) as refused:
            get_metric(name).check_options(options)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_the_bench_contract_holds(name):
    metric, options = contract_holds(name, CHEAP[name])
    passes = {"faithfulness_correlation": 5, "faithfulness_estimate": 197, "monotonicity_correlation": 393,
              "pixel_flipping": 6}
    assert metric.passes(options, 0.0) == passes[name]
