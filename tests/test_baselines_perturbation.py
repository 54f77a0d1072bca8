"""RISE, ViT-CX, Integrated Gradients and SmoothGrad against plain loop computations, and their properties."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.cluster import AgglomerativeClustering

import vitexplain
from vitexplain.methods.rise import grid_masks, random_grids
from vitexplain.methods.smoothgrad import noise_samples
from vitexplain.methods.vitcx import complete_linkage, mask_noise

from conftest import make_vit

#: Small options that keep every call fast.
FAST = {
    "rise": dict(n_masks=24, grid_size=3),
    "vitcx": dict(),
    "integrated_gradients": dict(n_steps=6),
    "smoothgrad": dict(n_samples=4),
}
RANDOMISED = ("rise", "vitcx", "smoothgrad")


def make_images(count=4, seed=1):
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def logit_and_probability(model, inputs, target):
    """Target logit and probability [B] of a batch; ``target`` is a class or one class per input."""
    with torch.no_grad():
        logits = model(inputs)
    index = torch.as_tensor(target).expand(len(inputs))[:, None]
    return logits.gather(1, index)[:, 0], logits.softmax(-1).gather(1, index)[:, 0]


# -- RISE ----------------------------------------------------------------------------------------

def test_rise_masks_are_upsampled_grids_cropped_at_their_shift():
    grids, shifts = random_grids(6, 4, 0.5, (32, 30), seed=3, device=torch.device("cpu"))
    assert set(grids.unique().tolist()) <= {0.0, 1.0}
    assert (shifts[:, 0] < 8).all() and (shifts[:, 1] < 8).all() and (shifts >= 0).all()
    masks = grid_masks(grids, shifts, (32, 30))
    for i in range(6):
        upsampled = F.interpolate(grids[i][None, None], size=(5 * 8, 5 * 8), mode="bilinear", align_corners=False)[0, 0]
        row, col = shifts[i].tolist()
        torch.testing.assert_close(masks[i], upsampled[row:row + 32, col:col + 30], atol=1e-6, rtol=0)


def test_rise_grid_cells_are_kept_with_probability_p1():
    grids, _ = random_grids(2000, 7, 0.1, (32, 32), seed=0, device=torch.device("cpu"))
    assert abs(grids.mean().item() - 0.1) < 0.01


def test_rise_equals_plain_sum_over_masks():
    model, images = make_vit(), make_images(3)
    targets = torch.tensor([2, 5, 7])
    n_masks, grid_size, p1, seed = 10, 3, 0.4, 5
    maps = vitexplain.explain(model, images, "rise", targets, n_masks=n_masks, grid_size=grid_size, p1=p1,
                              seed=seed, batch_size=4)
    masks = grid_masks(*random_grids(n_masks, grid_size, p1, (32, 32), seed, torch.device("cpu")), (32, 32))
    for b in range(3):
        expected = torch.zeros(32, 32)
        for mask in masks:
            _, probability = logit_and_probability(model, (images[b] * mask)[None], targets[b])
            expected += probability[0] * mask
        torch.testing.assert_close(maps[b], expected / (n_masks * p1), atol=1e-5, rtol=1e-4)


def test_rise_logit_score_uses_raw_logits():
    model, images = make_vit(), make_images(1)
    masks = grid_masks(*random_grids(5, 3, 0.5, (32, 32), 0, torch.device("cpu")), (32, 32))
    logit, _ = logit_and_probability(model, images * masks[:, None], 4)
    expected = (logit[:, None, None] * masks).sum(0) / (5 * 0.5)
    maps = vitexplain.explain(model, images, "rise", 4, n_masks=5, grid_size=3, score="logit")
    torch.testing.assert_close(maps[0], expected, atol=1e-5, rtol=1e-4)


# -- ViT-CX --------------------------------------------------------------------------------------

def as_partition(labels):
    groups = {}
    for item, label in enumerate(labels):
        groups.setdefault(int(label), set()).add(item)
    return sorted(sorted(group) for group in groups.values())


@pytest.mark.parametrize("threshold", [0.05, 0.2, 0.5])
def test_complete_linkage_matches_sklearn(threshold):
    points = torch.rand(3, 25, 6, generator=torch.Generator().manual_seed(0))
    unit = F.normalize(points, dim=-1)
    distance = 1 - unit @ unit.transpose(1, 2)
    labels = complete_linkage(distance, threshold)
    for b in range(3):
        reference = AgglomerativeClustering(n_clusters=None, distance_threshold=threshold, metric="precomputed",
                                            linkage="complete").fit(distance[b].double().numpy()).labels_
        assert as_partition(labels[b].tolist()) == as_partition(reference)
        assert all(labels[b, i] == min(group) for group in as_partition(labels[b].tolist()) for i in group)
    assert 1 < len(set(labels[0].tolist())) < 25


def plain_vitcx(model, image, target, *, threshold, noise_std, seed):
    """ViT-CX for one image written out step by step, masks at image size, sklearn's clustering."""
    captured = {}
    handle = model.blocks[-1].norm1.register_forward_hook(lambda module, args, output: captured.update(x=output))
    _, clean_probability = logit_and_probability(model, image[None], target)
    handle.remove()
    tokens = captured["x"][0, model.num_prefix_tokens:]
    dims = tokens.shape[1]
    feature_maps = tokens.T.reshape(dims, 4, 4)
    resized = F.interpolate(feature_maps[None], size=(32, 32), mode="bilinear", align_corners=False)
    resized = resized[0].reshape(dims, -1)
    low, high = resized.min(1, keepdim=True).values, resized.max(1, keepdim=True).values
    masks = (resized - low) / (high - low)
    cosine = (masks @ masks.T) / (masks.norm(dim=1)[:, None] * masks.norm(dim=1)[None, :])
    labels = AgglomerativeClustering(n_clusters=None, distance_threshold=threshold, metric="precomputed",
                                     linkage="complete").fit((1 - cosine).double().numpy()).labels_
    groups = as_partition(labels)  # sorted by smallest member: the method's cluster order
    saliency, coverage = torch.zeros(32 * 32), torch.zeros(32 * 32)
    for k, group in enumerate(groups):
        summed = masks[group].sum(0)
        mask = (summed - summed.min()) / (summed.max() - summed.min())
        noise = mask_noise(seed, k, k, (3, 32, 32), dims, torch.device("cpu"))[0]
        filler = noise_std * noise * (1 - mask.view(1, 32, 32))
        _, masked = logit_and_probability(model, (image * mask.view(1, 32, 32) + filler)[None], target)
        _, reference = logit_and_probability(model, (image + filler)[None], target)
        saliency += (masked[0] - reference[0] + clean_probability[0]) * mask
        coverage += mask
    return (saliency / coverage / len(groups)).view(32, 32), len(groups)


@pytest.mark.parametrize("distilled", [False, True])
def test_vitcx_equals_plain_computation(distilled):
    model, images = make_vit(distilled=distilled), make_images(2)
    targets = torch.tensor([3, 8])
    maps = vitexplain.explain(model, images, "vitcx", targets, seed=4, noise_std=0.3, batch_size=6)
    for b in range(2):
        expected, clusters = plain_vitcx(model, images[b], targets[b], threshold=0.1, noise_std=0.3, seed=4)
        assert 1 < clusters < 48
        torch.testing.assert_close(maps[b], expected, atol=1e-5, rtol=1e-4)


def test_vitcx_layer_and_features_choose_the_masks():
    model, images = make_vit(), make_images(2)
    default = vitexplain.explain(model, images, "vitcx")
    assert not torch.allclose(default, vitexplain.explain(model, images, "vitcx", layer=0))
    assert not torch.allclose(default, vitexplain.explain(model, images, "vitcx", features="output"))


# -- Integrated Gradients -----------------------------------------------------------------------

def plain_integrated_gradients(model, images, targets, alphas, weights, baseline):
    total = torch.zeros_like(images)
    for alpha, weight in zip(alphas, weights):
        point = (baseline + alpha * (images - baseline)).requires_grad_(True)
        score = model(point).gather(1, targets[:, None]).sum()
        total += weight * torch.autograd.grad(score, point)[0]
    return ((images - baseline) * total).sum(1)


def test_integrated_gradients_riemann_equals_plain_sum():
    model, images, targets, steps = make_vit(), make_images(3), torch.tensor([1, 4, 9]), 7
    alphas = [k / steps for k in range(1, steps + 1)]
    expected = plain_integrated_gradients(model, images, targets, alphas, [1 / steps] * steps, torch.zeros(()))
    maps = vitexplain.explain(model, images, "integrated_gradients", targets, n_steps=steps, quadrature="riemann_right",
                              batch_size=5)
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=1e-4)


def test_integrated_gradients_gauss_legendre_with_baseline_equals_plain_quadrature():
    model, images, targets, steps = make_vit(), make_images(2), torch.tensor([6, 0]), 5
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    baseline = torch.tensor([-1.0, 0.5, 2.0])[:, None, None]
    expected = plain_integrated_gradients(model, images, targets, (nodes + 1) / 2, weights / 2, baseline)
    maps = vitexplain.explain(model, images, "integrated_gradients", targets, n_steps=steps, baseline=baseline)
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=1e-4)


def test_integrated_gradients_is_complete():
    """Sundararajan et al.'s completeness axiom: the attributions add up to F(x) - F(x')."""
    model, images, targets = make_vit(), make_images(2), torch.tensor([2, 3])
    maps = vitexplain.explain(model, images, "integrated_gradients", targets, n_steps=64)
    at_image, _ = logit_and_probability(model, images, targets)
    at_baseline, _ = logit_and_probability(model, torch.zeros_like(images), targets)
    torch.testing.assert_close(maps.sum((1, 2)), at_image - at_baseline, atol=1e-3, rtol=1e-3)


def test_integrated_gradients_channel_reductions():
    model, images = make_vit(), make_images(2)
    signed = vitexplain.explain(model, images, "integrated_gradients", n_steps=4)
    absolute = vitexplain.explain(model, images, "integrated_gradients", n_steps=4, channel_reduction="abs_sum")
    largest = vitexplain.explain(model, images, "integrated_gradients", n_steps=4, channel_reduction="max_abs")
    assert (absolute >= signed.abs() - 1e-6).all() and (absolute >= largest - 1e-6).all()
    assert (largest * 3 >= absolute - 1e-6).all() and not torch.allclose(signed.abs(), absolute)


# -- SmoothGrad ----------------------------------------------------------------------------------

@pytest.mark.parametrize("relative_to_range, absolute", [(False, True), (True, False)])
def test_smoothgrad_equals_plain_noise_loop(relative_to_range, absolute):
    model, images, targets = make_vit(), make_images(3), torch.tensor([5, 1, 2])
    samples, stdev, seed = 4, 0.3, 9
    noise = noise_samples(samples, (3, 32, 32), seed, torch.device("cpu"))
    expected = []
    for b in range(3):
        sigma = stdev * (images[b].max() - images[b].min()) if relative_to_range else stdev
        total = torch.zeros(3, 32, 32)
        for sample in noise:
            noisy = (images[b] + sigma * sample)[None].requires_grad_(True)
            gradient = torch.autograd.grad(model(noisy)[0, targets[b]], noisy)[0][0]
            total += gradient.abs() if absolute else gradient
        expected.append((total / samples).sum(0))
    maps = vitexplain.explain(model, images, "smoothgrad", targets, n_samples=samples, stdev=stdev, seed=seed,
                              relative_to_range=relative_to_range, absolute=absolute, batch_size=5)
    torch.testing.assert_close(maps, torch.stack(expected), atol=1e-5, rtol=1e-4)


def test_smoothgrad_noise_has_the_requested_spread():
    noise = noise_samples(64, (3, 32, 32), 0, torch.device("cpu"))
    assert abs(noise.mean().item()) < 0.01 and abs(noise.std().item() - 1) < 0.01


# -- properties shared by the four methods ------------------------------------------------------

@pytest.mark.parametrize("method", sorted(FAST))
def test_batch_of_four_equals_one_at_a_time_and_is_pixel_level(method):
    model, images = make_vit(), make_images(4)
    together = vitexplain.explain(model, images, method, **FAST[method])
    assert together.shape == (4, 32, 32) and torch.isfinite(together).all()
    alone = torch.cat([vitexplain.explain(model, images[i:i + 1], method, **FAST[method]) for i in range(4)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", sorted(FAST))
def test_batch_size_only_bounds_memory(method):
    model, images = make_vit(), make_images(3)
    small = vitexplain.explain(model, images, method, batch_size=2, **FAST[method])
    large = vitexplain.explain(model, images, method, batch_size=500, **FAST[method])
    torch.testing.assert_close(small, large, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", RANDOMISED)
def test_seed_determines_the_map(method):
    model, images = make_vit(), make_images(2)
    first = vitexplain.explain(model, images, method, seed=1, **FAST[method])
    torch.testing.assert_close(first, vitexplain.explain(model, images, method, seed=1, **FAST[method]), atol=0, rtol=0)
    assert not torch.allclose(first, vitexplain.explain(model, images, method, seed=2, **FAST[method]))


@pytest.mark.parametrize("method", sorted(FAST))
def test_global_rng_untouched_and_model_left_clean(method):
    model, images = make_vit(), make_images(2)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    vitexplain.explain(model, images, method, **FAST[method])
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert not model.training


@pytest.mark.parametrize("method", sorted(FAST))
def test_class_specific(method):
    model, images = make_vit(), make_images(2)
    one = vitexplain.explain(model, images, method, 0, **FAST[method])
    other = vitexplain.explain(model, images, method, 1, **FAST[method])
    assert not torch.allclose(one, other, atol=1e-4)
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    torch.testing.assert_close(vitexplain.explain(model, images, method, **FAST[method]),
                               vitexplain.explain(model, images, method, predicted, **FAST[method]))


@pytest.mark.parametrize("method", sorted(FAST))
def test_works_on_distilled_deit_and_registers(method):
    for model in (make_vit(distilled=True), make_vit(reg_tokens=2)):
        maps = vitexplain.explain(model, make_images(2), method, **FAST[method])
        assert maps.shape == (2, 32, 32) and torch.isfinite(maps).all() and maps.abs().sum() > 0


@pytest.mark.parametrize("method, options, message", [
    ("rise", dict(p1=0), "p1"),
    ("rise", dict(n_masks=0), "n_masks"),
    ("rise", dict(score="softmax"), "option score of method .* must be one of"),
    ("vitcx", dict(features="tokens"), "option features of method .* must be one of"),
    ("vitcx", dict(layer=3), "layer"),
    ("vitcx", dict(distance_threshold=-1), "distance_threshold"),
    ("integrated_gradients", dict(quadrature="simpson"), "option quadrature of method .* must be one of"),
    ("integrated_gradients", dict(baseline=torch.zeros(2, 1, 1)), "does not broadcast"),
    ("smoothgrad", dict(channel_reduction="mean"), "option channel_reduction of method .* must be one of"),
    ("smoothgrad", dict(stdev=-0.1), "stdev"),
])
def test_bad_options_are_named(method, options, message):
    with pytest.raises(ValueError, match=message):
        vitexplain.explain(make_vit(), make_images(1), method, **options)

