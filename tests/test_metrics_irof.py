"""IROF (Rieger & Hansen, 2020): area over the normalised class probability while SLIC superpixels are removed,
most relevant first; and the batched SLIC it uses."""
import math

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics._regions import slic
from vitexplain.metrics.irof import irof, reduce_irof
from vitexplain.options import InvalidOption

from test_metrics_perturbation import WeightedPixels, linear_model
from test_metrics_srg import contract_holds


def lab(r, g, b):
    """CIE L*a*b* (D65) of one sRGB colour in [0, 1], written out."""
    def linear(c):
        return ((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92

    r, g, b = linear(r), linear(g), linear(b)
    xyz = (0.412453 * r + 0.357580 * g + 0.180423 * b, 0.212671 * r + 0.715160 * g + 0.072169 * b,
           0.019334 * r + 0.119193 * g + 0.950227 * b)
    fx, fy, fz = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
                  for t in (xyz[0] / 0.95047, xyz[1] / 1.0, xyz[2] / 1.08883)]
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def plain_slic(image, n_segments, compactness=10.0, iterations=10):
    """scikit-image's SLIC loop (``_slic_cython``, no connectivity step) one pixel and one seed at a time, for a
    square-ish image whose seed grid is given by its rule: step round(sqrt(HW / n)), first seed at step // 2."""
    channels, height, width = image.shape
    low, high = image.min().item(), image.max().item()
    scaled = (image.double() - low) / (high - low)
    features = [[lab(*scaled[:, y, x].tolist()) for x in range(width)] for y in range(height)]
    features = [[tuple(v / compactness for v in f) for f in row] for row in features]
    size = (height * width / n_segments) ** 0.5
    start, step = int(size // 2), int(round(size))
    seeds = [[float(y), float(x), 0.0, 0.0, 0.0] for y in range(start, height, step) for x in range(start, width, step)]
    labels = [[-1] * width for _ in range(height)]
    for _ in range(iterations):
        distance = [[math.inf] * width for _ in range(height)]
        for k, (cy, cx, *colour) in enumerate(seeds):
            if math.isnan(cy):
                continue
            for y in range(int(max(cy - 2 * step, 0)), int(min(cy + 2 * step + 1, height))):
                for x in range(int(max(cx - 2 * step, 0)), int(min(cx + 2 * step + 1, width))):
                    d = ((cy - y) ** 2 + (cx - x) ** 2) / step ** 2 + sum((f - c) ** 2 for f, c in
                                                                          zip(features[y][x], colour))
                    if distance[y][x] > d:
                        distance[y][x], labels[y][x] = d, k
        totals = [[0.0] * 6 for _ in seeds]
        for y in range(height):
            for x in range(width):
                total = totals[labels[y][x]]
                for i, v in enumerate((1, y, x, *features[y][x])):
                    total[i] += v
        seeds = [[v / t[0] if t[0] else math.nan for v in t[1:]] for t in totals]
    first = {}
    for position, k in enumerate(k for row in labels for k in row):
        first.setdefault(k, position)
    renamed = {k: i for i, k in enumerate(sorted(first, key=first.get))}
    return torch.tensor([[renamed[k] for k in row] for row in labels])


def test_slic_follows_scikit_images_loop():
    g = torch.Generator().manual_seed(0)
    smooth = F.interpolate(torch.rand(2, 3, 3, 4, generator=g), size=(15, 17), mode="bilinear")
    images = torch.cat([smooth, torch.rand(1, 3, 15, 17, generator=g) * 4 - 2])    # any range: rescaled first
    labels, counts = slic(images, n_segments=12)
    for image, got, count in zip(images, labels, counts):
        expected = plain_slic(image, 12)
        assert torch.equal(got, expected) and count == expected.max() + 1


def plain_irof(model, images, maps, targets, n_segments):
    """Superpixels (``slic``, checked above) by their mean relevance, removed one by one into the image's mean; the
    probability over its intact value; 1 - the trapezoid over l / L."""
    labels, counts = slic(images, n_segments)
    scores = []
    for image, raw, target, segments, count in zip(images, maps, targets, labels, counts.tolist()):
        relevance = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        means = [relevance[segments == s].double().mean().item() for s in range(count)]
        perturbed, fill = image.clone(), image.mean().item()
        ratios = []
        for s in [None] + sorted(range(count), key=lambda s: (-means[s], s)):
            if s is not None:
                perturbed[:, segments == s] = fill
            with torch.no_grad():
                ratios.append(model(perturbed[None]).softmax(-1)[0, target].item())
        ratios = [r / ratios[0] for r in ratios]
        scores.append(1 - sum((ratios[k] + ratios[k + 1]) / 2 / count for k in range(count)))
    return scores


def test_irof_matches_superpixel_by_superpixel_removal():
    g = torch.Generator().manual_seed(1)
    images = F.interpolate(torch.rand(3, 3, 4, 4, generator=g), size=(16, 16), mode="bilinear") * 2 - 1
    maps, targets = torch.rand(3, 4, 4, generator=g), torch.tensor([0, 2, 1])
    model = linear_model(256)
    values = irof(model, images, maps, targets, n_segments=10, batch_size=7)
    assert values["irof"].tolist() == pytest.approx(plain_irof(model, images, maps, targets, 10), abs=1e-5)
    assert reduce_irof(values)["irof"] == pytest.approx(values["irof"].double().mean().item())


def test_a_perfect_map_removes_the_class_first():
    g = torch.Generator().manual_seed(2)
    weights = torch.rand(144, generator=g) * 3 - 1
    images = F.interpolate(torch.rand(1, 3, 3, 3, generator=g), size=(12, 12), mode="bilinear") + 1.0
    model = WeightedPixels(weights.tolist(), constant=(images.mean(1).flatten() @ weights).item())   # p = 1/2
    perfect = weights.view(1, 12, 12)
    good = irof(model, images, perfect, torch.tensor([0]), n_segments=9)["irof"]
    bad = irof(model, images, -perfect, torch.tensor([0]), n_segments=9)["irof"]
    assert good.item() > 0.2 > bad.item()


def test_irof_does_not_depend_on_batching():
    g = torch.Generator().manual_seed(3)
    images = torch.cat([F.interpolate(torch.rand(2, 3, 3, 3, generator=g), size=(12, 12), mode="bilinear"),
                        torch.rand(1, 3, 12, 12, generator=g)])            # different superpixel counts
    maps, targets = torch.rand(3, 3, 3, generator=g), torch.tensor([1, 0, 2])
    model = linear_model(144)
    whole = irof(model, images, maps, targets, n_segments=8, batch_size=64)["irof"]
    for i in range(3):
        alone = irof(model, images[i:i + 1], maps[i:i + 1], targets[i:i + 1], n_segments=8, batch_size=3)["irof"]
        assert torch.allclose(whole[i:i + 1], alone, atol=1e-6)


def test_irof_refuses_bad_options_in_one_line(tiny_vit):
    metric = get_metric("irof")
    for options in ({"n_segments": 1}, {"compactness": 0.0}, {"compactness": "high"}, {"batch_size": 0}):
        with pytest.raises(InvalidOption) as error:
            metric.check_options(options)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="image 0 contains NaN"):
        irof(tiny_vit, torch.zeros(1, 3, 32, 32), torch.full((1, 4, 4), math.nan), torch.tensor([0]))
    batch = EvalBatch(images=torch.zeros(1, 3, 32, 32), maps=torch.zeros(1, 4, 4), targets=torch.tensor([0]),
                      labels=torch.tensor([-1]), explain=None, logits=vitexplain.adapter_for(tiny_vit).logits,
                      ids=["a"])
    assert metric.compute(batch, **{**metric.options, "n_segments": 4})["irof"].shape == (1,)   # no labels, no mean


def test_irof_keeps_the_bench_contract():
    metric, options = contract_holds("irof", {"n_segments": 6})
    assert metric.passes(options, 3.0) == 7 and metric.curves is None


def test_evaluate_gives_the_per_image_values_of_the_plain_function(tiny_vit, images):
    maps = vitexplain.explain(tiny_vit, images, "gae")
    scores = vitexplain.evaluate(tiny_vit, images, maps, "irof", batch_size=3, n_segments=6)
    with torch.no_grad():
        targets = tiny_vit(images).argmax(1)
    direct = irof(vitexplain.adapter_for(tiny_vit).logits, images, maps, targets, n_segments=6)
    assert torch.allclose(scores.values["irof"], direct["irof"], atol=1e-6)
    assert scores.numbers == pytest.approx(reduce_irof(direct)) and scores.images == 4
