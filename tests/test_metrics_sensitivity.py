"""Max-sensitivity (Yeh et al. 2019) computed as Captum's sensitivity_max (TIS Table 4)."""
import pytest
import torch
from captum.metrics import sensitivity_max

from vitexplain.metrics import get_metric
from vitexplain.metrics.sensitivity import max_sensitivity, sample_seeds, sensitivity_noise
from vitexplain.options import InvalidOption


def nonlinear_explain(images, target=None):
    """A deterministic stand-in for an explanation method, coarser than the image, class-dependent."""
    coarse = torch.nn.functional.avg_pool2d(images, 4)                  # [B, 3, 2, 2]
    return (coarse[:, 0] * (target[:, None, None] + 1)).relu() + coarse.pow(2).sum(1)


def test_matches_captum_with_the_same_perturbations():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(3, 3, 8, 8, generator=g)
    targets = torch.tensor([0, 2, 1])
    noise = sensitivity_noise(10, (3, 8, 8), 0.02, seed=5)
    expected = sensitivity_max(lambda inputs, target: (nonlinear_explain(inputs[0], target),), images,
                               perturb_func=lambda x: (x + noise.repeat(3, 1, 1, 1),),     # Captum's order
                               n_perturb_samples=10, target=targets)
    maps = nonlinear_explain(images, targets)
    ours = max_sensitivity(nonlinear_explain, images, maps, targets, seed=5)
    assert torch.allclose(ours, expected.float(), rtol=1e-5, atol=1e-7)


def test_hand_computed_identity_explanation():
    images = torch.rand(2, 3, 4, 4) + 1
    maps = images[:, 0]
    noise = sensitivity_noise(4, (3, 4, 4), 0.1, seed=1)
    ours = max_sensitivity(lambda x, t: x[:, 0], images, maps, torch.zeros(2), n_samples=4, radius=0.1, seed=1)
    largest = noise[:, 0].flatten(1).norm(dim=1).max()
    assert torch.allclose(ours, largest / maps.flatten(1).norm(dim=1))


def test_zero_explanation_norm_divides_by_one():
    images = torch.zeros(1, 3, 4, 4)
    noise = sensitivity_noise(3, (3, 4, 4), 0.05, seed=0)
    ours = max_sensitivity(lambda x, t: x[:, 1], images, torch.zeros(1, 4, 4), torch.zeros(1), n_samples=3,
                           radius=0.05, seed=0)
    assert ours.item() == pytest.approx(noise[:, 1].flatten(1).norm(dim=1).max().item())


def test_noise_is_seeded_bounded_and_the_same_for_every_image():
    noise = sensitivity_noise(10, (3, 8, 8), 0.02, seed=3)
    assert noise.abs().max() <= 0.02 and noise.abs().max() > 0.015
    assert torch.equal(noise, sensitivity_noise(10, (3, 8, 8), 0.02, seed=3))
    g = torch.Generator().manual_seed(1)
    images, targets = torch.randn(3, 3, 8, 8, generator=g), torch.tensor([0, 1, 2])
    maps = nonlinear_explain(images, targets)
    whole = max_sensitivity(nonlinear_explain, images, maps, targets, seed=3)
    alone = max_sensitivity(nonlinear_explain, images[2:], maps[2:], targets[2:], seed=3)
    assert torch.equal(whole[2:], alone)


def test_errors():
    images = torch.rand(2, 3, 4, 4)
    with pytest.raises(ValueError, match="image 1"):
        max_sensitivity(lambda x, t: x[:, 0], images, torch.tensor([[[0.0]], [[float("nan")]]]), torch.zeros(2))
    with pytest.raises(ValueError, match="perturbed image"):
        max_sensitivity(lambda x, t: x[:, 0] / 0 - x[:, 0] / 0, images, images[:, 0], torch.zeros(2))
    with pytest.raises(InvalidOption, match=r"^option n_samples of metric 'max_sensitivity' must be an integer >= 1, "
                                            r"got 0$"):
        get_metric("max_sensitivity").compute(None, n_samples=0)


def tis_wrapper_minmax(maps):
    """What tis.TIS(normalise=True) returns: saliency - min, then / max, per image."""
    shifted = maps - maps.amin((1, 2), keepdim=True)
    return shifted / shifted.amax((1, 2), keepdim=True)


def rollout_wrapper_max(maps):
    """What vit-explain's rollout returns: mask / max, per image."""
    return maps / maps.amax((1, 2), keepdim=True)


@pytest.mark.parametrize("normalise, wrapper", [("minmax", tis_wrapper_minmax), ("max", rollout_wrapper_max)])
def test_normalised_maps_match_captum_on_the_authors_wrapped_method(normalise, wrapper):
    """The TIS authors' pipeline hands Captum the wrapper's rescaled maps: the option gives the same number."""
    g = torch.Generator().manual_seed(2)
    images = torch.randn(3, 3, 8, 8, generator=g)
    targets = torch.tensor([1, 0, 2])
    noise = sensitivity_noise(10, (3, 8, 8), 0.02, seed=7)
    expected = sensitivity_max(lambda inputs, target: (wrapper(nonlinear_explain(inputs[0], target)),), images,
                               perturb_func=lambda x: (x + noise.repeat(3, 1, 1, 1),), n_perturb_samples=10,
                               target=targets)
    maps = nonlinear_explain(images, targets)
    ours = max_sensitivity(nonlinear_explain, images, maps, targets, seed=7, normalise=normalise)
    assert torch.allclose(ours, expected.float(), rtol=1e-5, atol=1e-7)
    plain = max_sensitivity(nonlinear_explain, images, maps, targets, seed=7)
    assert not torch.allclose(ours, plain, rtol=1e-2)


def test_minmax_of_a_constant_map_is_zero_and_a_zero_maximum_is_left_alone():
    images = torch.zeros(1, 3, 4, 4)
    constant = torch.full((1, 4, 4), 3.0)
    assert max_sensitivity(lambda x, t: constant, images, constant, torch.zeros(1), n_samples=2,
                           normalise="minmax").item() == 0.0
    negative = -torch.arange(16.0).view(1, 4, 4)
    assert max_sensitivity(lambda x, t: negative, images, negative, torch.zeros(1), n_samples=2,
                           normalise="max").item() == 0.0


class SeededExplain:
    """A randomised stand-in: its map is the image's channel mean plus noise drawn from the seed it is given;
    it records the seeds of its calls."""

    def __init__(self, base_seed: int = 11):
        self.base_seed, self.seeds = base_seed, []

    def __call__(self, images, targets, seed=None):
        seed = self.base_seed if seed is None else seed
        self.seeds.append(seed)
        jitter = torch.rand(images.shape[-2:], generator=torch.Generator().manual_seed(seed))
        return images.mean(1) + 0.1 * jitter


def test_reseed_gives_every_perturbed_call_its_own_reproducible_seed():
    g = torch.Generator().manual_seed(4)
    images, targets = torch.rand(3, 3, 6, 6, generator=g) + 1, torch.tensor([0, 1, 2])
    method = SeededExplain()
    maps = method(images, targets)
    fixed = max_sensitivity(method, images, maps, targets, n_samples=6, seed=3)
    assert method.seeds[1:] == [11] * 6                              # without reseed: the method's own seed
    method.seeds = []
    found = max_sensitivity(method, images, maps, targets, n_samples=6, seed=3, reseed=True)
    seeds = list(method.seeds)
    assert len(set(seeds)) == 6 and 11 not in seeds and seeds == sample_seeds(3, 6)
    noise = sensitivity_noise(6, (3, 6, 6), 0.02, seed=3)
    expected = torch.stack([(maps - method(images + delta, targets, seed=s)).flatten(1).norm(dim=1)
                            / maps.flatten(1).norm(dim=1) for delta, s in zip(noise, seeds)]).max(0).values
    assert torch.allclose(found, expected)
    assert (found > fixed + 0.01).all()                              # the method's own spread is measured
    method.seeds = []
    assert torch.equal(max_sensitivity(method, images, maps, targets, n_samples=6, seed=3, reseed=True), found)
    assert method.seeds == seeds                                     # the same seeds on every run
    assert not set(sample_seeds(4, 6)) & set(seeds)                  # another base seed, other seeds
    alone = max_sensitivity(method, images[1:2], maps[1:2], targets[1:2], n_samples=6, seed=3, reseed=True)
    assert torch.equal(alone, found[1:2])


def test_option_errors():
    images = torch.rand(2, 3, 4, 4)
    metric = get_metric("max_sensitivity")
    with pytest.raises(InvalidOption, match=r"^option normalise of metric 'max_sensitivity' must be one of 'none', "
                                            r"'minmax', 'max', 'maxabs', got 'l2'$"):
        metric.compute(None, normalise="l2")
    with pytest.raises(TypeError, match=r"^option reseed of metric 'max_sensitivity' must be True or False, "
                                        r"got 'yes'$"):
        metric.compute(None, reseed="yes")
    with pytest.raises(ValueError, match="non-negative integer seed"):
        max_sensitivity(lambda x, t, seed=None: x[:, 0], images, images[:, 0], torch.zeros(2), seed=-1, reseed=True)
