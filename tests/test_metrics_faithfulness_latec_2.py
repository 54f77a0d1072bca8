"""Sufficiency, infidelity, completeness, normalised AOPC and the random logit test, each against a plain per-image
computation of its paper's equation written here, and the properties that could fail."""
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.distance import cdist

import vitexplain
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.completeness import completeness
from vitexplain.metrics.infidelity import infidelity, square_masks
from vitexplain.metrics.naopc import naopc
from vitexplain.metrics.random_logit import random_classes, random_logit, ssim
from vitexplain.metrics.sufficiency import local_sufficiency, reduce_sufficiency, sufficiency_inputs

from test_metrics_perturbation import linear_model
from test_metrics_srg import tiles

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)
NORM = dict(pixel_mean=MEAN, pixel_std=STD)


def black(image):
    return (-torch.tensor(MEAN) / torch.tensor(STD))[:, None, None].expand_as(image)


def probability(model, image, target):
    with torch.no_grad():
        return model(image[None])[0].softmax(-1)[target].item()


class ChannelLinear(torch.nn.Module):
    """Logit 0 = sum over channels and pixels of weights[pixel] * x; logit 1 = 0: linear in the image."""

    def __init__(self, weights):
        super().__init__()
        self.weights = weights

    def forward(self, x):
        evidence = (x * self.weights).flatten(1).sum(1)
        return torch.stack([evidence, torch.zeros_like(evidence)], 1)


# ---------------------------------------------------------------- sufficiency

def test_sufficiency_matches_a_plain_computation_over_the_whole_set():
    g = torch.Generator().manual_seed(0)
    maps = torch.randn(9, 3, 3, generator=g)
    maps[3] = maps[2] * 2.5 + 0.01 * torch.randn(3, 3, generator=g)        # a close pair
    predictions = torch.tensor([0, 1, 1, 1, 0, 2, 2, 0, 1]).float()
    for threshold in (0.3, 0.6, 0.8):
        local, covered = local_sufficiency(sufficiency_inputs_of(maps), predictions, threshold)
        flat = np.abs(maps.flatten(1).double().numpy())
        flat = flat / flat.max(1, keepdims=True)
        distance = cdist(flat, flat, "seuclidean")               # SciPy: V = the variance over the set, ddof = 1
        distance = distance / distance.max()
        expected = []
        for i in range(9):
            near = [j for j in range(9) if j != i and distance[i, j] <= threshold]
            expected.append(sum(predictions[j] == predictions[i] for j in near) / len(near) if near else 0.0)
        assert local.tolist() == pytest.approx(expected, abs=1e-9)
        assert covered.tolist() == [float(any(distance[i, j] <= threshold for j in range(9) if j != i))
                                    for i in range(9)]
    assert 0 < reduce_sufficiency({"explanation": sufficiency_inputs_of(maps), "prediction": predictions})[
        "covered"] < 1


def sufficiency_inputs_of(maps):
    flat = maps.flatten(1).abs()
    return flat / flat.max(1, keepdim=True).values


def test_sufficiency_values_do_not_depend_on_batching_and_reduce_over_the_set():
    model = linear_model(16, classes=3)
    g = torch.Generator().manual_seed(1)
    images, maps = torch.randn(6, 3, 4, 4, generator=g), torch.rand(6, 2, 2, generator=g)
    whole = sufficiency_inputs(model, images, maps)
    parts = [sufficiency_inputs(model, images[rows], maps[rows], batch_size=1) for rows in (slice(0, 2), slice(2, 6))]
    joined = {key: torch.cat([part[key] for part in parts]) for key in whole}
    assert torch.equal(whole["prediction"], model(images.flatten(1)).argmax(1).float())
    assert torch.allclose(whole["explanation"], joined["explanation"])
    assert reduce_sufficiency(whole) == pytest.approx(reduce_sufficiency(joined))
    # the same map everywhere: every image is every other's neighbour; sufficiency = agreement of the predictions
    same = sufficiency_inputs(model, images, maps[:1].expand(6, -1, -1))
    shares = [(same["prediction"] == p).sum().item() - 1 for p in same["prediction"]]
    assert reduce_sufficiency(same)["sufficiency"] == pytest.approx(np.mean([s / 5 for s in shares]))
    assert reduce_sufficiency(same)["covered"] == 1.0


# ---------------------------------------------------------------- infidelity

def plain_infidelity(model, images, maps, targets, perturbations, normalize):
    """Yeh et al.'s Eq. 2 one image and one perturbation at a time (perturbations: x -> perturbed x, per sample)."""
    rows = []
    for image, raw, target in zip(images, maps, targets):
        relevance = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        dots, changes = [], []
        for perturb in perturbations:
            changed = perturb(image)
            dots.append(((image - changed) * relevance).sum().item())
            with torch.no_grad():
                changes.append(model(image[None])[0, target].item() - model(changed[None])[0, target].item())
        dots, changes = np.array(dots), np.array(changes)
        beta = (dots * changes).sum() / (dots * dots).sum() if normalize else 1.0
        rows.append(np.mean((beta * dots - changes) ** 2))
    return rows


@pytest.mark.parametrize("perturbation", ["square", "noisy_baseline"])
@pytest.mark.parametrize("normalize", [True, False])
def test_infidelity_matches_the_papers_equation(perturbation, normalize):
    g = torch.Generator().manual_seed(2)
    images, maps = torch.randn(3, 3, 7, 6, generator=g), torch.randn(3, 4, 3, generator=g)
    targets = torch.tensor([2, 0, 1])
    model = linear_model(42, classes=3)
    model = torch.nn.Sequential(model, torch.nn.Tanh())           # not linear: the error is not 0
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    if perturbation == "square":
        masks = square_masks(5, 7, 6, seed=4)
        perturbations = [lambda x, m=m: torch.where(m, black(x), x) for m in masks]
    else:
        noise = torch.randn((5, 3, 7, 6), generator=torch.Generator().manual_seed(4))
        perturbations = [lambda x, n=n: ((0.2 * n).clamp(0, 1) - mean) / std for n in noise]
    got = infidelity(model, images, maps, targets, perturbation=perturbation, n_samples=5, normalize=normalize,
                     seed=4, batch_size=4, **NORM)
    expected = plain_infidelity(model, images, maps, targets, perturbations, normalize)
    assert got.tolist() == pytest.approx(expected, rel=1e-4, abs=1e-7)
    alone = infidelity(model, images[1:2], maps[1:2], targets[1:2], perturbation=perturbation, n_samples=5,
                       normalize=normalize, seed=4, batch_size=64, **NORM)
    assert alone.item() == pytest.approx(got[1].item(), rel=1e-5)


def test_a_linear_model_explained_by_its_weights_has_zero_infidelity_and_a_shuffled_map_does_not():
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(8, 8, generator=g)
    model = ChannelLinear(weights)
    images = torch.randn(2, 3, 8, 8, generator=g)
    targets = torch.tensor([0, 0])
    for normalize in (True, False):
        exact = infidelity(model, images, weights.expand(2, -1, -1), targets, n_samples=6, normalize=normalize,
                           **NORM)
        assert exact.abs().max() < 1e-6
    shuffled = weights.flatten()[torch.randperm(64, generator=g)].view(8, 8)
    assert (infidelity(model, images, shuffled.expand(2, -1, -1), targets, n_samples=6, **NORM) > 1e-3).all()
    # the optimal scaling: a map that is a multiple of the right one is as good, without it it is not
    scaled = 3 * weights.expand(2, -1, -1)
    assert infidelity(model, images, scaled, targets, n_samples=6, **NORM).abs().max() < 1e-6
    assert (infidelity(model, images, scaled, targets, n_samples=6, normalize=False, **NORM) > 1e-3).all()


def test_squares_are_drawn_among_every_square_of_the_allowed_sides():
    masks = square_masks(400, 28, 20, seed=0)
    assert torch.equal(masks, square_masks(400, 28, 20, seed=0))
    assert not torch.equal(masks, square_masks(400, 28, 20, seed=1))
    sides = set()
    for mask in masks[:, 0]:
        ys, xs = mask.nonzero(as_tuple=True)
        height, width = int(ys.max() - ys.min()) + 1, int(xs.max() - xs.min()) + 1
        assert height == width and mask.sum() == height * width                 # one filled square
        sides.add(height)
    assert sides == set(range(1, 8))                                             # round(10 / 28 * 20) = 7


# ---------------------------------------------------------------- completeness

def test_completeness_matches_the_sum_against_the_black_baseline():
    g = torch.Generator().manual_seed(5)
    images, maps = torch.randn(3, 3, 5, 4, generator=g), torch.randn(3, 2, 2, generator=g)
    targets = torch.tensor([0, 3, 1])
    model = linear_model(20, classes=4)
    for score in ("logit", "probability"):
        got = completeness(model, images, maps, targets, score=score, batch_size=2, **NORM)
        for i, (image, raw, target) in enumerate(zip(images, maps, targets)):
            with torch.no_grad():
                outputs = model(torch.stack([image, black(image)]))
            outputs = outputs.softmax(-1) if score == "probability" else outputs
            difference = (outputs[0, target] - outputs[1, target]).item()
            assert got["output_difference"][i].item() == pytest.approx(difference, abs=1e-5)
            assert got["attribution_sum"][i].item() == pytest.approx(raw.sum().item(), abs=1e-6)
            assert got["gap"][i].item() == pytest.approx(raw.sum().item() - difference, abs=1e-5)


def test_gradient_times_difference_of_a_linear_model_is_complete_and_twice_it_is_not():
    g = torch.Generator().manual_seed(6)
    weights = torch.randn(6, 6, generator=g)
    model = ChannelLinear(weights)
    images = torch.randn(3, 3, 6, 6, generator=g)
    attributions = ((images - black(images[0])) * weights).sum(1)       # integrated gradients of a linear model
    exact = completeness(model, images, attributions, torch.zeros(3), **NORM)
    assert exact["abs_gap"].max() < 1e-4 and exact["complete"].tolist() == [1.0, 1.0, 1.0]
    twice = completeness(model, images, 2 * attributions, torch.zeros(3), **NORM)
    assert twice["complete"].tolist() == [0.0, 0.0, 0.0]
    assert twice["abs_gap"].tolist() == pytest.approx(exact["output_difference"].abs().tolist(), rel=1e-4)


# ---------------------------------------------------------------- normalised AOPC

def order_aopc(model, image, target, patches, order):
    """AOPC of one order: 1/N sum_{k=0}^{N-1} p(x) - p(x with the first k patches black)."""
    full = probability(model, image, target)
    total = 0.0
    for k in range(len(order)):
        changed = image.clone()
        for p in order[:k]:
            ys, xs = patches[p]
            changed[:, ys, xs] = black(image)[:, ys, xs]
        total += full - probability(model, changed, target)
    return total / len(order)


def plain_beam(model, image, target, patches, beam_size):
    """The authors' beam search written out with lists: both directions, candidates beam by beam then feature by
    feature, Python's stable sort, the cumulative drop of every prefix."""
    full = probability(model, image, target)

    def drop(removed):
        changed = image.clone()
        for p in removed:
            ys, xs = patches[p]
            changed[:, ys, xs] = black(image)[:, ys, xs]
        return full - probability(model, changed, target)

    found = []
    for descending in (True, False):
        beam = [([], 0.0)]
        for _ in range(len(patches) - 1):
            candidates = [(order + [f], score + drop(order + [f])) for order, score in beam
                          for f in range(len(patches)) if f not in order]
            beam = sorted(candidates, key=lambda c: c[1], reverse=descending)[:beam_size]
        best = beam[0][0]
        found.append(best + [f for f in range(len(patches)) if f not in best])
    return found


def test_naopc_is_exact_when_the_beam_holds_every_order():
    g = torch.Generator().manual_seed(7)
    images, maps = torch.randn(2, 3, 4, 4, generator=g), torch.rand(2, 4, 4, generator=g)
    targets = torch.tensor([1, 2])
    model = torch.nn.Sequential(linear_model(16, classes=3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
    got = naopc(model, images, maps, targets, patch_size=2, beam_size=24, batch_size=7, **NORM)
    patches = tiles(4, 4, 2)
    for i in range(2):
        aopcs = [order_aopc(model, images[i], targets[i], patches, list(order))
                 for order in itertools.permutations(range(4))]
        sums = [maps[i][ys, xs].sum().item() for ys, xs in patches]
        ranked = sorted(range(4), key=lambda p: (-sums[p], p))
        own = order_aopc(model, images[i], targets[i], patches, ranked)
        assert got["lower"][i].item() == pytest.approx(min(aopcs), abs=1e-6)
        assert got["upper"][i].item() == pytest.approx(max(aopcs), abs=1e-6)
        assert got["aopc"][i].item() == pytest.approx(own, abs=1e-6)
        assert got["naopc"][i].item() == pytest.approx((own - min(aopcs)) / (max(aopcs) - min(aopcs)), abs=1e-5)
        assert -1e-6 <= got["naopc"][i].item() <= 1 + 1e-6


def test_naopc_bounds_follow_the_authors_beam_search():
    g = torch.Generator().manual_seed(8)
    images, maps = torch.randn(2, 3, 6, 4, generator=g), torch.rand(2, 3, 2, generator=g)
    targets = torch.tensor([0, 2])
    model = torch.nn.Sequential(linear_model(24, classes=3, seed=1), torch.nn.Tanh(), torch.nn.Linear(3, 3))
    got = naopc(model, images, maps, targets, patch_size=2, beam_size=2, **NORM)
    patches = tiles(6, 4, 2)
    for i in range(2):
        upper, lower = plain_beam(model, images[i], targets[i], patches, 2)
        assert got["upper"][i].item() == pytest.approx(order_aopc(model, images[i], targets[i], patches, upper),
                                                      abs=1e-6)
        assert got["lower"][i].item() == pytest.approx(order_aopc(model, images[i], targets[i], patches, lower),
                                                      abs=1e-6)
    alone = naopc(model, images[1:], maps[1:], targets[1:], patch_size=2, beam_size=2, batch_size=3, **NORM)
    for key in alone:
        assert alone[key].item() == pytest.approx(got[key][1].item(), abs=1e-6)


def test_naopc_of_a_model_that_ignores_the_removal_is_one_half_and_the_default_grid_is_seven_by_seven():
    seen = []

    def model(x):                 # the removal changes nothing
        seen.append(x.shape[0])
        return torch.stack([x.sum((1, 2, 3)) * 0, torch.ones(x.shape[0])], 1)

    got = naopc(model, torch.zeros(1, 3, 14, 14), torch.rand(1, 2, 2), torch.tensor([0]), beam_size=1,
                batch_size=10_000, **NORM)
    assert got["naopc"].tolist() == [0.5] and got["upper"].tolist() == got["lower"].tolist()
    assert seen[0] == 49          # the map's curve: 49 levels, one patch of 2 x 2 px each


# ---------------------------------------------------------------- random logit

def plain_ssim(a, b, window):
    """scikit-image's structural_similarity written out: uniform windows inside the map, sample covariances,
    data range of both maps."""
    a, b = a.double().numpy(), b.double().numpy()
    span = max(a.max(), b.max()) - min(a.min(), b.min())
    c1, c2 = (0.01 * span) ** 2, (0.03 * span) ** 2
    n = window * window
    values = []
    for y in range(a.shape[0] - window + 1):
        for x in range(a.shape[1] - window + 1):
            u, v = a[y:y + window, x:x + window].ravel(), b[y:y + window, x:x + window].ravel()
            cov = np.cov(u, v)                          # ddof = 1: N / (N - 1)
            assert n == u.size
            values.append((2 * u.mean() * v.mean() + c1) * (2 * cov[0, 1] + c2)
                          / ((u.mean() ** 2 + v.mean() ** 2 + c1) * (cov[0, 0] + cov[1, 1] + c2)))
    return float(np.mean(values))


def test_ssim_matches_scikit_images_definition_written_out():
    g = torch.Generator().manual_seed(9)
    a, b = torch.rand(3, 9, 11, generator=g), torch.rand(3, 9, 11, generator=g)
    b[1] = a[1] * 0.5 + 0.2 * b[1]
    got = ssim(a, b, 7)
    assert got.tolist() == pytest.approx([plain_ssim(x, y, 7) for x, y in zip(a, b)], abs=1e-12)
    small = ssim(a[:, :4, :5], b[:, :4, :5], 7)                               # a 4 x 5 map: 3 x 3 windows
    assert small.tolist() == pytest.approx([plain_ssim(x[:4, :5], y[:4, :5], 3) for x, y in zip(a, b)], abs=1e-12)
    assert ssim(a, a).tolist() == pytest.approx([1.0] * 3) and ssim(torch.ones(1, 7, 7), torch.ones(1, 7, 7)) == 1


def test_random_classes_are_other_classes_decided_by_seed_and_id():
    targets = torch.arange(200) % 5
    ids = [f"image{i}" for i in range(200)]
    drawn = random_classes(targets, 5, ids, seed=0)
    assert (drawn != targets).all() and set(drawn.tolist()) == set(range(5))
    for target in range(5):          # uniform among the 4 others
        counts = torch.bincount(drawn[targets == target], minlength=5).tolist()
        assert counts[target] == 0 and min(c for k, c in enumerate(counts) if k != target) >= 3
    assert torch.equal(random_classes(targets[7:9], 5, ids[7:9], seed=0), drawn[7:9])
    assert not torch.equal(random_classes(targets, 5, ids, seed=1), drawn)


def test_random_logit_compares_the_map_with_that_of_the_random_class():
    g = torch.Generator().manual_seed(10)
    images, targets = torch.randn(3, 3, 8, 8, generator=g), torch.tensor([0, 1, 2])
    per_class = torch.rand(4, 8, 8, generator=g)
    asked = []

    def explain(imgs, classes):
        asked.append(classes.clone())
        return per_class[classes] * torch.arange(1, imgs.shape[0] + 1).view(-1, 1, 1)

    maps = explain(images, targets)
    got = random_logit(explain, images, maps, targets, ["a", "b", "c"], classes=4, seed=3)
    others = random_classes(targets, 4, ["a", "b", "c"], 3)
    assert torch.equal(asked[-1], others) and torch.equal(got["random_class"], others)
    other = per_class.double()[others] * torch.arange(1, 4).view(-1, 1, 1)
    expected = [plain_ssim(maps[i].double() / maps[i].abs().max(), other[i] / other[i].abs().max(), 7)
                for i in range(3)]
    assert got["ssim"].tolist() == pytest.approx(expected, abs=1e-8)          # the maps are float32
    agnostic = random_logit(lambda imgs, classes: maps, images, maps, targets, ["a", "b", "c"], classes=4)
    assert agnostic["ssim"].tolist() == pytest.approx([1.0] * 3)


# ---------------------------------------------------------------- the registered entries

def batch_of(model, images, method, ids):
    def explain(imgs, targets):
        return vitexplain.explain(model, imgs, method, targets)

    with torch.no_grad():
        targets = model(images).argmax(1)
    return EvalBatch(images=images, maps=explain(images, targets), targets=targets, labels=targets, explain=explain,
                     logits=vitexplain.adapter_for(model).logits, ids=ids, mean=MEAN, std=STD)


@pytest.mark.parametrize("name, options, group", [
    ("sufficiency", {}, "faithfulness"), ("infidelity", {"n_samples": 3}, "faithfulness"),
    ("completeness", {}, "faithfulness"), ("naopc", {"patch_size": 16, "beam_size": 2}, "faithfulness"),
    ("random_logit", {}, "class sensitivity")])
def test_the_entries_reduce_the_same_whatever_the_batching(tiny_vit, images, name, options, group):
    metric = get_metric(name)
    ids = [f"img{i}" for i in range(4)]
    options = {**metric.options, **options}
    whole = metric.compute(batch_of(tiny_vit, images, "gae", ids), **options)
    parts = [metric.compute(batch_of(tiny_vit, images[rows], "gae", ids[rows]), **{**options, "batch_size": 5}
                            if "batch_size" in options else options) for rows in (slice(0, 1), slice(1, 4))]
    joined = {key: torch.cat([part[key] for part in parts]) for key in whole}
    reported = metric.reduce(whole)
    assert reported == pytest.approx(metric.reduce(joined), abs=1e-5)
    assert set(metric.higher_is_better) <= set(reported) and all(math.isfinite(v) for v in reported.values())
    assert metric.group == group and metric.requires == (("explain",) if name == "random_logit" else ())


def test_pixel_unit_protocols_refuse_a_batch_without_the_normalisation(tiny_vit, images):
    batch = batch_of(tiny_vit, images[:1], "rollout", ["a"])
    batch.mean = batch.std = None
    for name in ("infidelity", "completeness", "naopc"):
        with pytest.raises(ValueError, match="mean and std the images were normalised with"):
            get_metric(name).compute(batch, **{**get_metric(name).options, "n_samples": 1} if name == "infidelity"
                                     else get_metric(name).options)
