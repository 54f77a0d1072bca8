"""Pixel-removal protocols: perturbation test (TokenTM Tables 2-4, GradToken Table 2), AOPC / log-odds
(TokenTM Table 5) and insertion / deletion (TIS Tables 1-2)."""
import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.ndimage import correlate
from torch import nn

from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics._perturb import black_pixel
from vitexplain.metrics.aopc import aopc_log_odds, reduce_aopc
from vitexplain.metrics.insertion_deletion import baseline_images, insertion_deletion, reduce_insertion_deletion
from vitexplain.metrics.perturbation import perturbation_test, reduce_perturbation
from vitexplain.options import InvalidOption

PLAIN = dict(pixel_mean=(0.0, 0.0, 0.0), pixel_std=(1.0, 1.0, 1.0))     # black pixel = 0
CHEFER_STEPS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


class WeightedPixels(nn.Module):
    """Two classes: logit 0 = weights . (channel-mean pixels), logit 1 = a constant."""

    def __init__(self, weights, constant=0.0):
        super().__init__()
        self.register_buffer("weights", torch.tensor(weights))
        self.constant = constant
        self.seen = []

    def forward(self, x):
        self.seen.append(x.clone())
        evidence = x.mean(1).flatten(1) @ self.weights
        return torch.stack([evidence, torch.full_like(evidence, self.constant)], 1)


def linear_model(pixels, classes=5, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * pixels, classes)).eval()


ONES = torch.ones(1, 3, 2, 2)
MAP_4321 = torch.tensor([[[4.0, 3.0], [2.0, 1.0]]])                     # ranks pixels 0, 1, 2, 3


# ---------------------------------------------------------------- perturbation test

def test_perturbation_hand_computed():
    # class 0 wins while pixels 0 and 1 are both intact (1 + 1 > 1.5); counts int(4 k / 10) = 0,0,0,1,1,2,2,2,3,3
    model = WeightedPixels([1.0, 1.0, 0.0, 0.0], constant=1.5)
    values = perturbation_test(model, ONES, MAP_4321, torch.tensor([0]), **PLAIN)
    assert values["positive"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]]
    assert values["negative"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 1, 0, 0]]
    reported = reduce_perturbation(values)
    assert reported["positive_auc"] == pytest.approx(100 * (0.1 + 0.1 + 0.05))
    assert reported["negative_auc"] == pytest.approx(100 * (0.7 + 0.05))


def test_ties_are_removed_in_raster_order_in_both_directions():
    model = WeightedPixels([1.0, 1.0, 0.0, 0.0], constant=1.5)
    values = perturbation_test(model, ONES, torch.full((1, 2, 2), 3.0), torch.tensor([0]), **PLAIN)
    assert values["positive"].tolist() == values["negative"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]]


def test_removed_pixels_become_black_in_every_channel():
    model = WeightedPixels([1.0, 1.0, 0.0, 0.0])
    images = torch.rand(1, 3, 2, 2)
    perturbation_test(model, images, MAP_4321, torch.tensor([0]), direction="positive",
                      pixel_mean=(0.5, 0.4, 0.3), pixel_std=(0.5, 0.2, 0.1))
    seen = torch.cat(model.seen)                                         # the 10 steps, in order
    black = torch.tensor([-1.0, -2.0, -3.0])
    assert torch.equal(seen[0], images[0])
    assert torch.allclose(seen[3, :, 0, 0], black) and torch.equal(seen[3, :, 0, 1], images[0, :, 0, 1])
    assert torch.allclose(seen[9].flatten(1)[:, :3], black[:, None].expand(3, 3))
    assert torch.equal(seen[9, :, 1, 1], images[0, :, 1, 1])


def test_registered_protocols_take_black_from_the_batch_normalisation():
    model = WeightedPixels([1.0, 1.0, 0.0, 0.0])
    images = torch.rand(1, 3, 2, 2)
    batch = EvalBatch(images=images, maps=MAP_4321, targets=torch.tensor([0]), labels=torch.tensor([0]), explain=None,
                      logits=model, ids=["a"], mean=(0.5, 0.4, 0.3), std=(0.5, 0.2, 0.1))
    get_metric("perturbation").compute(batch, direction="positive")
    seen = torch.cat(model.seen)
    assert torch.allclose(seen[3, :, 0, 0], torch.tensor([-1.0, -2.0, -3.0]))
    assert torch.equal(seen[3, :, 0, 1], images[0, :, 0, 1])
    for name in ("perturbation", "aopc", "road"):          # no normalisation known: refused, not guessed
        with pytest.raises(ValueError, match="mean and std the images were normalised with"):
            get_metric(name).compute(dataclasses.replace(batch, mean=None, std=None))
    with pytest.raises(ValueError, match="one per channel"):
        black_pixel(images, (0.5, 0.5), (0.5, 0.5))


def _chefer_reference(model, images, maps, labels, positive, mean, std):
    """Chefer et al.'s loop: upsample, normalise, zero the top pixels of the [0, 1] image, renormalise."""
    mean, std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    rows = []
    for image, raw, label in zip(images, maps, labels):
        up = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0]
        vis = ((up - up.min()) / (up.max() - up.min())).flatten().tolist()
        order = sorted(range(len(vis)), key=lambda p: (-vis[p] if positive else vis[p], p))
        row = []
        for step in CHEFER_STEPS:
            pixels = (image * std + mean).reshape(3, -1).clone()
            pixels[:, order[:int(len(vis) * step)]] = 0
            perturbed = (pixels.reshape(image.shape) - mean) / std
            row.append(float(model(perturbed[None]).argmax().item() == label))
        rows.append(row)
    return torch.tensor(rows)


def test_perturbation_matches_reference_loop():
    g = torch.Generator().manual_seed(3)
    images, maps = torch.randn(4, 3, 8, 8, generator=g), torch.rand(4, 2, 2, generator=g)
    model = linear_model(64)
    with torch.no_grad():
        labels = model(images).argmax(1)
    norm = dict(pixel_mean=(0.5, 0.5, 0.5), pixel_std=(0.5, 0.5, 0.5))
    values = perturbation_test(model, images, maps, labels, batch_size=7, **norm)
    with torch.no_grad():
        for name in ("positive", "negative"):
            expected = _chefer_reference(model, images, maps, labels, name == "positive",
                                         norm["pixel_mean"], norm["pixel_std"])
            assert torch.equal(values[name], expected)


def test_perturbation_does_not_depend_on_batching():
    g = torch.Generator().manual_seed(4)
    images, maps = torch.randn(3, 3, 8, 8, generator=g), torch.rand(3, 4, 4, generator=g)
    labels = torch.tensor([0, 1, 2])
    model = linear_model(64)
    whole = perturbation_test(model, images, maps, labels, batch_size=64, **PLAIN)
    single = perturbation_test(model, images[1:2], maps[1:2], labels[1:2], batch_size=3, **PLAIN)
    assert torch.equal(whole["positive"][1:2], single["positive"])
    assert torch.equal(whole["negative"][1:2], single["negative"])


def test_perturbation_errors():
    model = linear_model(4)
    with pytest.raises(ValueError, match="image 0"):
        perturbation_test(model, ONES, torch.full((1, 2, 2), float("inf")), torch.tensor([0]), **PLAIN)
    # options are refused at the registry's edge, a direct compute call included, before the batch is read
    with pytest.raises(InvalidOption, match=r"^option direction of metric 'perturbation' must be one of 'both', "
                                            r"'positive', 'negative', got 'up'$"):
        get_metric("perturbation").compute(None, direction="up")
    with pytest.raises(ValueError, match="label"):
        perturbation_test(model, ONES, MAP_4321, torch.tensor([-1]), **PLAIN)


# ---------------------------------------------------------------- AOPC and log-odds

def test_aopc_log_odds_hand_computed():
    # logit 0 = pixel0 + pixel1, logit 1 = 0: p0 = sigmoid(2), sigmoid(1) once pixel 0 is gone, sigmoid(0) after
    model = WeightedPixels([1.0, 1.0, 0.0, 0.0])
    values = aopc_log_odds(model, ONES, MAP_4321, torch.tensor([0]), **PLAIN)
    evidence = [2, 2, 2, 1, 1, 0, 0, 0, 0, 0]
    sig = [1 / (1 + math.exp(-e)) for e in evidence]
    assert values["probability_drop"][0].tolist() == pytest.approx([sig[0] - s for s in sig], abs=1e-6)
    assert values["log_odds"][0].tolist() == pytest.approx([math.log(s / sig[0]) for s in sig], abs=1e-6)
    reported = reduce_aopc(values)
    assert reported["aopc"] == pytest.approx(sum(sig[0] - s for s in sig) / 10, abs=1e-6)
    assert reported["log_odds"] == pytest.approx(sum(math.log(s / sig[0]) for s in sig) / 10, abs=1e-6)


def test_log_odds_stays_finite_when_the_probability_underflows():
    model = WeightedPixels([100.0, 100.0, 0.0, 0.0], constant=150.0)   # p0 goes from ~1 to ~e^-150
    values = aopc_log_odds(model, ONES, MAP_4321, torch.tensor([0]), **PLAIN)
    assert torch.isfinite(values["log_odds"]).all()
    assert values["log_odds"][0, -1].item() == pytest.approx(-150.0, abs=1e-3)


# ---------------------------------------------------------------- insertion and deletion

def test_insertion_deletion_hand_computed():
    model = WeightedPixels([2.0, 1.0, 0.5, 0.25])
    values = insertion_deletion(model, ONES, MAP_4321, torch.tensor([0]), n_steps=4, baseline="black")
    sigmoid = lambda s: 1 / (1 + math.exp(-s))                           # noqa: E731
    assert values["deletion"][0].tolist() == pytest.approx([sigmoid(s) for s in (1.75, 0.75, 0.25, 0.0)])
    assert values["insertion"][0].tolist() == pytest.approx([sigmoid(s) for s in (2.0, 3.0, 3.5, 3.75)])
    reported = reduce_insertion_deletion(values)
    deletion = np.trapezoid([sigmoid(s) for s in (1.75, 0.75, 0.25, 0.0)], dx=1 / 3)
    insertion = np.trapezoid([sigmoid(s) for s in (2.0, 3.0, 3.5, 3.75)], dx=1 / 3)
    assert reported["deletion"] == pytest.approx(deletion)
    assert reported["insertion"] == pytest.approx(insertion)
    assert reported["insertion_minus_deletion"] == pytest.approx(insertion - deletion)


def _gaussian_blur_reference(images):
    x = np.arange(-5, 6)
    g = np.exp(-x ** 2 / (2 * 5.0 ** 2))
    kernel = np.outer(g, g) / np.outer(g, g).sum()
    return torch.tensor(np.stack([[correlate(c, kernel, mode="mirror") for c in im] for im in images.numpy()]))


def test_baselines():
    g = torch.Generator().manual_seed(5)
    images = torch.randn(2, 3, 16, 16, generator=g)
    assert torch.allclose(baseline_images(images, "blur"), _gaussian_blur_reference(images).float(), atol=1e-5)
    assert torch.equal(baseline_images(images, "black"), torch.zeros(1, 3, 16, 16))
    assert torch.allclose(baseline_images(images, "mean").flatten(), images.flatten(1).mean(1))
    noise = baseline_images(images, "random", seed=7)
    assert noise.shape == (1, 3, 16, 16) and noise.min() >= 0 and noise.max() < 1
    assert torch.equal(noise, baseline_images(images[:1], "random", seed=7))
    assert not torch.equal(noise, baseline_images(images, "random", seed=8))
    with pytest.raises(InvalidOption, match=r"^option baseline of metric 'insertion_deletion' must be one of 'blur', "
                                            r"'black', 'mean', 'random', got 'white'$"):
        get_metric("insertion_deletion").compute(None, baseline="white")


@pytest.mark.parametrize("baseline", ["blur", "mean", "random"])
def test_insertion_deletion_matches_reference_loop(baseline):
    g = torch.Generator().manual_seed(6)
    images = torch.randn(3, 3, 8, 8, generator=g)
    maps = torch.randint(0, 3, (3, 8, 8), generator=g).float()           # ties
    targets = torch.tensor([0, 3, 4])
    model = linear_model(64)
    n_steps = 7                                                          # ceil(64 / 7) = 10 pixels per step
    values = insertion_deletion(model, images, maps, targets, n_steps=n_steps, baseline=baseline, batch_size=5, seed=2)
    substitute = baseline_images(images, baseline, seed=2).expand_as(images)
    with torch.no_grad():
        for i in range(3):
            v = maps[i].flatten().tolist()
            order = sorted(range(64), key=lambda p: (-v[p], p))
            for step in range(n_steps):
                chosen = order[:10 * (step + 1)]
                deleted = images[i].reshape(3, -1).clone()
                deleted[:, chosen] = substitute[i].reshape(3, -1)[:, chosen]
                inserted = substitute[i].reshape(3, -1).clone()
                inserted[:, chosen] = images[i].reshape(3, -1)[:, chosen]
                for name, sample in (("deletion", deleted), ("insertion", inserted)):
                    p = model(sample.reshape(1, 3, 8, 8)).softmax(-1)[0, targets[i]]
                    assert values[name][i, step].item() == pytest.approx(p.item(), abs=1e-6)


def test_insertion_deletion_errors():
    model = linear_model(4)
    with pytest.raises(ValueError, match="image 0"):
        insertion_deletion(model, ONES, torch.full((1, 2, 2), float("nan")), torch.tensor([0]), n_steps=4)
    metric = get_metric("insertion_deletion")
    with pytest.raises(InvalidOption, match=r"^option n_steps of metric 'insertion_deletion' must be an integer >= 2, "
                                            r"got 1$"):
        metric.compute(None, n_steps=1)
    with pytest.raises(InvalidOption, match=r"^option batch_size of metric 'insertion_deletion' must be an integer "
                                            r">= 1, got 0$"):
        metric.compute(None, n_steps=4, batch_size=0)
