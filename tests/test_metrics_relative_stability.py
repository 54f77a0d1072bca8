"""Relative input, output and representation stability (Agarwal et al. 2022, arXiv 2203.06877, Eqs. 2, 3, 5)."""
import pytest
import torch

import vitexplain
from vitexplain.evaluation import score
from vitexplain.instrumentation.families.base import UnsupportedModelError
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics._relative_stability import gaussian_noise, relative_stability

from conftest import make_vit

KINDS = ("input", "output", "representation")
NAMES = {"input": "relative_input_stability", "output": "relative_output_stability",
         "representation": "relative_representation_stability"}
PROJECTION = torch.randn(3 * 8 * 8, 5, generator=torch.Generator().manual_seed(7))


def logits(images):
    """A stand-in model: 5 classes from a fixed projection of the image (its predictions change under large noise)."""
    return images.flatten(1) @ PROJECTION


def features(images):
    """A stand-in representation [B, 6]."""
    return torch.tanh(images.flatten(1)[:, :6] * 3)


def explain(images, targets, **ignored):
    """A deterministic stand-in for a method: coarser than the image, class-dependent, with zeros (ReLU)."""
    coarse = torch.nn.functional.avg_pool2d(images, 2)
    return (coarse[:, 0] * (targets[:, None, None] + 1)).relu() + coarse[:, 1] ** 2


def plain(kind, images, maps, targets, n_samples, noise, eps_min, seed):
    """The equations written out, one image and one perturbed copy at a time."""
    deltas = gaussian_noise(n_samples, tuple(images.shape[1:]), noise, seed)
    found = []
    for x, e, t in zip(images, maps, targets):
        best = None
        for delta in deltas:
            copy = x + delta
            if logits(copy[None]).argmax().item() != logits(x[None]).argmax().item():
                continue
            e_copy = explain(copy[None], t[None])[0]
            numerator = (((e - e_copy) / torch.where(e == 0, torch.tensor(eps_min), e)) ** 2).sum().sqrt()
            if kind == "input":
                denominator = (((x - copy) / torch.where(x == 0, torch.tensor(eps_min), x)) ** 2).sum().sqrt()
            elif kind == "output":
                denominator = ((logits(x[None]) - logits(copy[None])) ** 2).sum().sqrt()
            else:
                own, other = features(x[None])[0], features(copy[None])[0]
                denominator = (((own - other) / torch.where(own == 0, torch.tensor(eps_min), own)) ** 2).sum().sqrt()
            ratio = (numerator / max(denominator.item(), eps_min)).item()
            best = ratio if best is None else max(best, ratio)
        found.append(float("nan") if best is None else best)
    return torch.tensor(found)


def data(count=5, seed=0):
    images = torch.randn(count, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    images[0, 0, :2] = 0                           # zeros in an image (divided as eps_min)
    targets = logits(images).argmax(-1)
    return images, explain(images, targets), targets


@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_equation_written_out_per_image(kind):
    images, maps, targets = data()
    options = dict(n_samples=6, noise=0.6, eps_min=1e-6, seed=2)
    ours = relative_stability(kind, explain, logits, images, maps, targets, features=features, batch_size=4,
                              **options)
    expected = plain(kind, images, maps, targets, **options)
    assert torch.allclose(ours, expected, rtol=1e-5, equal_nan=True)
    # the noise is large enough that some copies change their prediction and are left out of the maximum
    deltas = gaussian_noise(6, (3, 8, 8), 0.6, 2)
    changed = logits((images[None] + deltas[:, None]).flatten(0, 1)).argmax(-1).view(6, -1) != targets
    assert changed.any() and not changed.all(0).any()


@pytest.mark.parametrize("kind", KINDS)
def test_neither_batch_size_nor_the_batch_changes_a_value(kind):
    images, maps, targets = data(count=4, seed=1)

    def run(rows, size):
        return relative_stability(kind, explain, logits, images[rows], maps[rows], targets[rows], features=features,
                                  n_samples=5, noise=0.3, seed=4, batch_size=size)

    whole = run(slice(None), 64)
    assert torch.equal(whole, run(slice(None), 1)) and torch.equal(whole, run(slice(None), 3))
    assert torch.equal(whole[2:], run(slice(2, 4), 7))


def test_an_image_whose_copies_all_change_prediction_has_no_value():
    seed = next(s for s in range(50) if gaussian_noise(1, (3, 8, 8), 1.0, s).sum() < -1)
    images = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    images[0] += 1e-3 - images[0].mean()           # sum 0.19: class 0, class 1 once the noise lowers the sum below 0
    images[1] += 5                                 # sum 960: class 0 whatever the noise

    def by_sum(x):
        return torch.stack([x.flatten(1).sum(1), -x.flatten(1).sum(1)], 1)

    targets = by_sum(images).argmax(-1)
    found = relative_stability("input", explain, by_sum, images, explain(images, targets), targets, n_samples=1,
                               noise=1.0, seed=seed)
    assert found[0].isnan() and not found[1].isnan()
    reported = get_metric("relative_input_stability").reduce({"relative_input_stability": found})
    assert reported == {"relative_input_stability": pytest.approx(found[1].item()), "undefined": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_a_map_that_ignores_the_input_is_more_stable_than_one_that_follows_it(kind):
    images, _, targets = data()
    fixed = torch.rand(5, 4, 4, generator=torch.Generator().manual_seed(1)) + 0.5

    def ignores(x, t, **ignored):
        return fixed.clone()

    def follows(x, t, **ignored):
        return torch.nn.functional.avg_pool2d(x, 2)[:, 0].abs() + 0.5

    def constant(x, t, **ignored):
        return torch.ones(x.shape[0], 4, 4)

    def run(fn):
        return relative_stability(kind, fn, logits, images, fn(images, targets), targets, features=features,
                                  n_samples=4, noise=0.1, seed=0)

    assert torch.equal(run(constant), torch.zeros(5)) and torch.equal(run(ignores), torch.zeros(5))
    assert (run(follows) > 0).all()


def test_noise_is_seeded_gaussian_and_the_same_for_every_image():
    noise = gaussian_noise(200, (3, 8, 8), 0.05, seed=3)
    assert torch.equal(noise, gaussian_noise(200, (3, 8, 8), 0.05, seed=3))
    assert noise.std().item() == pytest.approx(0.05, rel=0.02) and abs(noise.mean().item()) < 0.002


@pytest.fixture(scope="module")
def vit():
    return make_vit(depth=1)


def test_the_random_control_is_the_least_stable_map(vit):
    """Through evaluate (EvalBatch.features from the adapter, the control drawn afresh per copy)."""
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    names = list(NAMES.values())
    found = {method: vitexplain.evaluate(vit, images, vitexplain.explain(vit, images, method), names, method=method,
                                         n_samples=2)
             for method in ("gae", "random_baseline", "constant_baseline")}
    for name in names:
        control = found["random_baseline"][name].values[name]
        assert (found["gae"][name].values[name] < control).all(), name
        assert torch.equal(found["constant_baseline"][name].values[name], torch.zeros(4))
        assert found["random_baseline"][name].numbers["undefined"] == 0


def test_features_are_what_the_classifier_reads(vit):
    images = torch.randn(3, 3, 32, 32)
    adapter = vitexplain.adapter_for(vit)
    with torch.no_grad():
        expected = vit.forward_head(vit.forward_features(images), pre_logits=True)
    assert torch.allclose(adapter.features(images), expected)
    assert torch.allclose(vit.head(adapter.features(images)), adapter.logits(images), atol=1e-6)


def test_a_model_without_such_a_representation_is_refused_in_one_line():
    deit = make_vit(distilled=True, depth=1)
    with pytest.raises(UnsupportedModelError, match="no linear classifier") as raised:
        vitexplain.adapter_for(deit).features(torch.randn(1, 3, 32, 32))
    assert "\n" not in str(raised.value)


def test_a_batch_without_features_is_refused_before_any_work(vit):
    images = torch.randn(2, 3, 32, 32)
    adapter = vitexplain.adapter_for(vit)
    batch = EvalBatch(images=images, maps=torch.rand(2, 4, 4), targets=torch.zeros(2, dtype=torch.long),
                      labels=torch.zeros(2, dtype=torch.long), explain=lambda x, t: torch.rand(2, 4, 4),
                      logits=adapter.logits, ids=["a", "b"])
    with pytest.raises(ValueError, match="needs the representation the model's classifier reads"):
        score("relative_representation_stability", batch)
    with pytest.raises(ValueError, match="features="):
        get_metric("relative_representation_stability").compute(batch, n_samples=1)


def test_registration():
    for kind, name in NAMES.items():
        metric = get_metric(name)
        assert metric.group == "robustness" and metric.higher_is_better == {name: False}
        assert "explain" in metric.requires and ("features" in metric.requires) == (kind == "representation")
        assert metric.passes({"n_samples": 10}, 2.0) == 20 + (11 if kind != "representation" else 22)
