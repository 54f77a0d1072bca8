"""Mask localisation (relevance mass / rank accuracy, top-k intersection, attribution localisation, localisation AUC)
and complexity (complexity, effective complexity) protocols: each against a plain per-image loop of its equation,
batch independence, and properties that a wrong implementation would fail."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.attribution_localisation import attribution_localisation
from vitexplain.metrics.complexity import complexity
from vitexplain.metrics.effective_complexity import effective_complexity
from vitexplain.metrics.localisation_auc import localisation_auc
from vitexplain.metrics.relevance_mass_accuracy import relevance_mass_accuracy
from vitexplain.metrics.relevance_rank_accuracy import relevance_rank_accuracy
from vitexplain.metrics.top_k_intersection import top_k_intersection
from vitexplain.uncertainty import Means, bootstrap

H, W = 12, 16
LOCALISATION = ["relevance_mass_accuracy", "relevance_rank_accuracy", "top_k_intersection", "attribution_localisation",
                "localisation_auc"]


def upsample(maps):
    """Bilinear upsampling in float32 (the protocols' precision), then float64 for the sums."""
    return F.interpolate(maps[:, None].float(), size=(H, W), mode="bilinear", align_corners=False)[:, 0].double()


def inputs(seed=0, count=5):
    """Signed token maps [count, 3, 4] (ties on the upsampled borders), blob-ish masks and some ignored pixels."""
    g = torch.Generator().manual_seed(seed)
    maps = torch.randn(count, 3, 4, generator=g)
    masks = torch.rand(count, H, W, generator=g) > 0.6
    ignore = torch.rand(count, H, W, generator=g) > 0.85
    return maps, masks, ignore


# ---- plain per-image computations, one pixel at a time -------------------------------------------------------------

def counted(image_map, mask, ignore):
    """(values, labels) of the counted pixels of one image, in raster order."""
    values, labels = [], []
    for i in range(H):
        for j in range(W):
            if ignore is None or not ignore[i, j]:
                values.append(float(image_map[i, j]))
                labels.append(bool(mask[i, j]))
    return values, labels


def mass_reference(image_map, mask, ignore, negatives="clip", weighted=False):
    values, labels = counted(image_map, mask, ignore)
    if not any(labels):
        return math.nan
    relevance = [max(v, 0.0) if negatives == "clip" else abs(v) for v in values]
    inside = sum(r for r, on in zip(relevance, labels) if on)
    share = sum(labels) / len(labels)
    ratio = inside / sum(relevance) if sum(relevance) > 0 else share
    return ratio / share if weighted else ratio


def top_pixels(values, count):
    """Positions of the ``count`` highest values, ties to the lower raster position."""
    return sorted(range(len(values)), key=lambda p: (-values[p], p))[:count]


def rank_reference(image_map, mask, ignore):
    values, labels = counted(image_map, mask, ignore)
    size = sum(labels)
    return math.nan if size == 0 else sum(labels[p] for p in top_pixels(values, size)) / size


def top_k_reference(image_map, mask, ignore, k, concept_influence=False):
    values, labels = counted(image_map, mask, ignore)
    if not any(labels):
        return math.nan
    taken = top_pixels(values, k)
    score = sum(labels[p] for p in taken) / len(taken)
    return score * len(labels) / sum(labels) if concept_influence else score


def auc_pairs(image_map, mask, ignore):
    """The Mann-Whitney count over every (object, background) pair, ties one half."""
    values, labels = counted(image_map, mask, ignore)
    inside = [v for v, on in zip(values, labels) if on]
    outside = [v for v, on in zip(values, labels) if not on]
    if not inside or not outside:
        return math.nan
    wins = sum((a > b) + 0.5 * (a == b) for a in inside for b in outside)
    return wins / (len(inside) * len(outside))


def entropy_reference(image_map):
    magnitudes = [abs(float(v)) for v in image_map.flatten()]
    total = sum(magnitudes)
    if total == 0:
        return math.log(len(magnitudes))
    return -sum(m / total * math.log(m / total) for m in magnitudes if m > 0)


def effective_reference(image_map, eps):
    magnitudes = [abs(float(v)) for v in image_map.flatten()]
    largest = max(magnitudes)
    return sum(m / largest > eps for m in magnitudes) if largest > 0 else 0


# ---- each protocol against its loop ---------------------------------------------------------------------------------

@pytest.mark.parametrize("negatives", ["clip", "absolute"])
@pytest.mark.parametrize("with_ignore", [False, True])
def test_mass_ratios_match_the_loop(negatives, with_ignore):
    maps, masks, ignore = inputs()
    ignore = ignore if with_ignore else None
    up = upsample(maps)
    rows = range(len(maps))
    mass = relevance_mass_accuracy(maps, masks, negatives=negatives, ignore=ignore)
    expected = [mass_reference(up[b], masks[b], None if ignore is None else ignore[b], negatives) for b in rows]
    assert mass.tolist() == pytest.approx(expected, rel=1e-12)
    assert attribution_localisation(maps, masks, negatives=negatives, ignore=ignore).tolist() == pytest.approx(expected)
    weighted = attribution_localisation(maps, masks, weighted=True, negatives=negatives, ignore=ignore)
    assert weighted.tolist() == pytest.approx(
        [mass_reference(up[b], masks[b], None if ignore is None else ignore[b], negatives, True) for b in rows])


@pytest.mark.parametrize("with_ignore", [False, True])
def test_rankings_match_the_loop(with_ignore):
    maps, masks, ignore = inputs(1)
    maps = maps.round(decimals=0)                      # many ties, inside the map as on its borders
    ignore = ignore if with_ignore else None
    up = upsample(maps)
    rows = range(len(maps))

    def per(b):
        return None if ignore is None else ignore[b]

    assert relevance_rank_accuracy(maps, masks, ignore=ignore).tolist() == pytest.approx(
        [rank_reference(up[b], masks[b], per(b)) for b in rows])
    for k, influence in [(7, False), (40, True), (H * W, False)]:
        got = top_k_intersection(maps, masks, k=k, concept_influence=influence, ignore=ignore)
        assert got.tolist() == pytest.approx([top_k_reference(up[b], masks[b], per(b), k, influence) for b in rows])


@pytest.mark.parametrize("with_ignore", [False, True])
def test_auc_matches_the_pairwise_count_and_scikit_learn(with_ignore):
    maps, masks, ignore = inputs(2)
    maps = maps.round(decimals=0)                      # ties, which count one half
    ignore = ignore if with_ignore else None
    up = upsample(maps)
    got = localisation_auc(maps, masks, ignore=ignore)
    keep = [torch.ones(H, W, dtype=torch.bool) if ignore is None else ~ignore[b] for b in range(len(maps))]
    assert got.tolist() == pytest.approx(
        [auc_pairs(up[b], masks[b], None if ignore is None else ignore[b]) for b in range(len(maps))], abs=1e-12)
    assert got.tolist() == pytest.approx(
        [roc_auc_score(masks[b][keep[b]].numpy(), up[b][keep[b]].numpy()) for b in range(len(maps))], abs=1e-12)


def test_complexities_match_the_loop():
    maps, _, _ = inputs(3)
    maps[1] = 0.0
    maps[2, 0] = 0.0
    up = upsample(maps)
    assert complexity(maps, (H, W)).tolist() == pytest.approx([entropy_reference(m) for m in up], rel=1e-12)
    for eps in (1e-5, 0.3):
        assert effective_complexity(maps, (H, W), eps=eps).tolist() == [effective_reference(m, eps) for m in up]


# ---- properties -----------------------------------------------------------------------------------------------------

def test_a_map_equal_to_the_mask_scores_the_maximum_and_its_complement_the_minimum():
    g = torch.Generator().manual_seed(4)
    masks = torch.rand(3, H, W, generator=g) > 0.6     # under half the image: the complement's K pixels all miss
    share = masks.flatten(1).double().mean(1)
    best, worst = masks.float(), (~masks).float()
    k = int(masks.flatten(1).sum(1).min())
    for metric, top, bottom in [(relevance_mass_accuracy, 1.0, 0.0), (relevance_rank_accuracy, 1.0, 0.0),
                                (localisation_auc, 1.0, 0.0), (attribution_localisation, 1.0, 0.0),
                                (lambda m, s: top_k_intersection(m, s, k=k), 1.0, 0.0)]:
        assert metric(best, masks).tolist() == [top] * 3
        assert metric(worst, masks).tolist() == [bottom] * 3
    weighted = attribution_localisation(best, masks, weighted=True)
    assert weighted.tolist() == pytest.approx((1 / share).tolist())
    # the scores sit at the ends of their ranges: a random map scores in between
    noise = torch.rand(3, H, W, generator=g)
    for metric in (relevance_mass_accuracy, relevance_rank_accuracy, localisation_auc):
        assert ((metric(noise, masks) > 0) & (metric(noise, masks) < 1)).all()


def test_rank_protocols_ignore_increasing_rescaling_and_constant_maps_are_neutral():
    maps, masks, _ = inputs(5)
    up = upsample(maps)                                # at the image's size: upsampling would not commute with exp
    for metric in (relevance_rank_accuracy, localisation_auc, lambda m, s: top_k_intersection(m, s, k=20)):
        assert metric(up, masks).tolist() == metric(3 * up.exp() + 1, masks).tolist()
        assert metric(up, masks).tolist() != metric(-up, masks).tolist()
    constant = torch.full((len(masks), 3, 4), 2.0)
    assert localisation_auc(constant, masks).tolist() == [0.5] * len(masks)
    share = masks.flatten(1).double().mean(1)
    assert relevance_mass_accuracy(constant, masks).tolist() == pytest.approx(share.tolist())
    assert attribution_localisation(constant, masks, weighted=True).tolist() == pytest.approx([1.0] * len(masks))
    # no positive relevance at all: scored as a constant map, not 0 / 0
    assert relevance_mass_accuracy(-constant, masks).tolist() == pytest.approx(share.tolist())


def test_complexity_of_a_one_hot_map_is_zero_and_of_a_uniform_map_log_n():
    one_hot = torch.zeros(2, H, W)
    one_hot[0, 3, 5] = 2.0
    one_hot[1, 0, 0] = -7.0                            # magnitudes: a negative peak is as simple
    uniform = torch.stack([torch.full((H, W), 0.3), torch.full((H, W), -0.3), torch.zeros(H, W)])
    assert complexity(one_hot).tolist() == [0.0, 0.0]
    assert complexity(uniform).tolist() == pytest.approx([math.log(H * W)] * 3, rel=1e-12)
    assert effective_complexity(one_hot).tolist() == [1.0, 1.0]
    assert effective_complexity(uniform).tolist() == [H * W, H * W, 0.0]
    # entropy grows when the mass spreads, within [0, log n]
    two = one_hot[:1].clone()
    two[0, 8, 8] = 2.0
    assert complexity(two).item() == pytest.approx(math.log(2))


def test_effective_complexity_is_relative_to_each_maps_own_peak():
    small = torch.tensor([[[1e-3, 1e-9], [5e-4, 0.0]]])
    large = torch.tensor([[[1e3, 1e-3], [5e2, 0.0]]])
    assert effective_complexity(small).tolist() == [2.0]
    assert effective_complexity(large).tolist() == [2.0]
    assert effective_complexity(torch.cat([small, large])).tolist() == [2.0, 2.0]    # not the batch's peak


# ---- empty masks, ignored pixels, reductions, batches ---------------------------------------------------------------

def test_an_empty_mask_is_undefined_left_out_of_the_mean_and_counted():
    maps, masks, ignore = inputs(6, count=4)
    masks[1] = False
    masks[2] = ignore[2]                               # every mask pixel ignored: nothing left to score
    for name in LOCALISATION:
        metric = get_metric(name)
        options = {"k": 10} if name == "top_k_intersection" else {}
        values = metric.compute(_batch(maps, masks, ignore), **options)[name]
        assert values.isnan().tolist() == [False, True, True, False], name
        reported = metric.reduce({name: values})
        assert reported[name] == pytest.approx(values[[0, 3]].double().mean().item())
        assert reported["undefined"] == 2
    full = torch.ones(1, H, W, dtype=torch.bool)
    assert localisation_auc(maps[:1], full).isnan().all()                 # one class only: no ROC curve
    assert relevance_mass_accuracy(maps[:1], full).tolist() == [1.0]


def test_ignored_pixels_count_nowhere():
    maps, masks, ignore = inputs(7, count=3)
    up = upsample(maps).float()
    loud = torch.where(ignore, torch.full_like(up, 100.0), up)          # huge relevance where nobody looks
    for metric in (relevance_mass_accuracy, relevance_rank_accuracy, localisation_auc, attribution_localisation,
                   lambda m, s, ignore=None: top_k_intersection(m, s, k=15, ignore=ignore)):
        assert metric(loud, masks, ignore=ignore).tolist() == pytest.approx(metric(up, masks, ignore=ignore).tolist())
        assert metric(loud, masks, ignore=ignore).tolist() != pytest.approx(metric(loud, masks).tolist())


def test_mask_means_is_the_plain_mean_without_undefined_images_and_bootstraps_with_them():
    report = get_metric("localisation_auc").reduce
    values = {"localisation_auc": torch.tensor([0.25, 0.5, 1.0, 0.75] * 3, dtype=torch.float64)}
    plain = Means(localisation_auc="localisation_auc")
    assert report(values) == {**plain(values), "undefined": 0}
    assert report.per_image(values) is not None
    # as the bench and evaluate call it (the metric's reporter): a replicate of every number it reports, those of
    # a clean set drawn by indexing, as the plain mean's
    reporter = get_metric("localisation_auc").reporter()
    drawn = bootstrap(values, reporter, seed=0)
    assert drawn.keys() == report(values).keys() and not drawn["undefined"].any()
    assert np.array_equal(drawn["localisation_auc"], bootstrap(values, plain, seed=0)["localisation_auc"])
    values["localisation_auc"][4] = float("nan")
    assert report.per_image(values) is None
    replicates = bootstrap(values, report, seed=0)["localisation_auc"]
    assert np.isfinite(replicates).all() and replicates.min() < report(values)["localisation_auc"] < replicates.max()


def _batch(maps, masks, ignore=None, size=(H, W)):
    count = len(maps)
    truth = {"masks": masks} if ignore is None else {"masks": masks, "ignore": ignore}
    return EvalBatch(images=torch.zeros(count, 3, *size), maps=maps, targets=torch.zeros(count, dtype=torch.long),
                     labels=torch.zeros(count, dtype=torch.long), explain=None, logits=None,
                     ids=[f"img{i}" for i in range(count)], truth=truth)


@pytest.mark.parametrize("name", LOCALISATION + ["complexity", "effective_complexity"])
def test_an_images_value_does_not_depend_on_its_batch(name):
    maps, masks, ignore = inputs(8, count=6)
    metric = get_metric(name)
    options = {"k": 10} if name == "top_k_intersection" else {}
    whole = metric.compute(_batch(maps, masks, ignore), **options)[name]
    parts = [metric.compute(_batch(maps[rows], masks[rows], ignore[rows]), **options)[name]
             for rows in (slice(0, 1), slice(1, 4), slice(4, 6))]
    assert torch.equal(whole, torch.cat(parts))
    assert whole.dtype == torch.float64 and whole.shape == (6,)


def test_bad_input_is_refused_in_one_line():
    maps, masks, _ = inputs(9, count=2)
    with pytest.raises(ValueError, match="k=1000 is more than the 192 pixels"):
        top_k_intersection(maps, masks)
    with pytest.raises(ValueError, match="image's size"):
        get_metric("localisation_auc").compute(_batch(maps, masks[:, :8]))
    with pytest.raises(ValueError, match="ignore must have the masks' shape"):
        relevance_rank_accuracy(maps, masks, ignore=masks[:, :8])
    with pytest.raises(ValueError, match="2 maps for 1 images"):
        relevance_mass_accuracy(maps, masks[:1])
