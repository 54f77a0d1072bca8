"""SaCo (Wu et al., CVPR 2024): pairwise consistency of salience groups and their probability drops."""
import math

import pytest
import torch

from vitexplain.metrics import get_metric
from vitexplain.metrics.saco import reduce_saco, saco

from test_metrics_perturbation import WeightedPixels, linear_model

# one channel-equal 1 x 3 image (per-sample mean 1/3) and a model whose logit 0 is 4.5 p0 + 3 p1 - 3 p2:
# replacing pixel p by the mean lowers that logit by a_p (x_p - 1/3) = 3, -1, 1, so the drops rank 0 > 2 > 1
THREE = torch.tensor([1.0, 0.0, 0.0]).view(1, 1, 1, 3).expand(1, 3, 1, 3)
TOY = WeightedPixels([4.5, 3.0, -3.0])


@pytest.mark.parametrize("salience, expected", [
    ([3.0, 2.0, 1.0], (1 + 2 - 1) / (1 + 2 + 1)),           # pair (1, 2) breaks the order, weight s1 - s2 = 1
    ([3.0, 2.5, 0.0], (0.5 + 3 - 2.5) / (0.5 + 3 + 2.5)),   # weights are the salience differences
    ([1.0, 2.0, 3.0], -(1 + 2 - 1) / (1 + 2 + 1)),          # the same groups ranked the other way round
])
def test_three_groups_with_a_known_answer(salience, expected):
    values = saco(TOY, THREE, torch.tensor([[salience]]), torch.tensor([0]), n_groups=3)
    assert values["saco"].item() == pytest.approx(expected)
    sigmoid = lambda s: 1 / (1 + math.exp(-s))                                      # noqa: E731
    logit = 4.5
    by_pixel = [sigmoid(logit) - sigmoid(logit - d) for d in (3.0, -1.0, 1.0)]
    order = sorted(range(3), key=lambda p: -salience[p])
    assert values["group_drop"][0].tolist() == pytest.approx([by_pixel[p] for p in order], abs=1e-6)


def plain_saco(model, images, maps, targets, groups):
    """Algorithm 1 of the paper as a loop, s(G) the mean salience of a group (the sum when groups are equal)."""
    result = []
    for image, salience, target in zip(images, maps, targets):
        values = salience.flatten().tolist()
        order = sorted(range(len(values)), key=lambda p: (-values[p], p))
        p0 = model(image[None]).softmax(-1)[0, target].item()
        s, drop = [], []
        for k in range(groups):
            members = order[int(len(values) * k / groups):int(len(values) * (k + 1) / groups)]
            s.append(sum(values[p] for p in members) / len(members))
            perturbed = image.clone().view(image.shape[0], -1)
            perturbed[:, members] = image.mean()
            drop.append(p0 - model(perturbed.view(image.shape)[None]).softmax(-1)[0, target].item())
        total = weighted = 0.0
        for i in range(groups - 1):
            for j in range(i + 1, groups):
                weight = s[i] - s[j] if drop[i] >= drop[j] else -(s[i] - s[j])
                weighted += weight
                total += abs(weight)
        result.append(weighted / total)
    return torch.tensor(result)


@pytest.mark.parametrize("groups", [8, 5])                  # 8 groups of 8 pixels; 5 groups of 12 or 13
def test_saco_matches_algorithm_1_whatever_the_batch_size(groups):
    g = torch.Generator().manual_seed(3)
    images, maps = torch.randn(4, 3, 8, 8, generator=g), torch.rand(4, 8, 8, generator=g)
    targets = torch.tensor([0, 3, 4, 1])
    model = linear_model(64)
    with torch.no_grad():
        expected = plain_saco(model, images, maps, targets, groups)
        for batch_size in (7, 64):
            values = saco(model, images, maps, targets, n_groups=groups, batch_size=batch_size)
            assert torch.allclose(values["saco"], expected, atol=1e-6)


def test_properties():
    g = torch.Generator().manual_seed(4)
    images, maps = torch.randn(4, 3, 8, 8, generator=g), torch.rand(4, 4, 4, generator=g)
    targets = torch.tensor([0, 1, 2, 3])
    model = linear_model(64)
    plain = saco(model, images, maps, targets, n_groups=6)["saco"]
    assert ((plain >= -1) & (plain <= 1)).all()
    assert torch.allclose(saco(model, images, 3 * maps - 7, targets, n_groups=6)["saco"], plain, atol=1e-6)
    assert torch.equal(saco(model, images, torch.ones(4, 4, 4), targets)["saco"], torch.zeros(4))   # no weight
    # the map that is the model (its per-pixel effect of the replacement) scores 1, its reverse -1
    weights = torch.rand(64, generator=g)
    bright = torch.ones(1, 3, 8, 8)
    bright.view(1, 3, 64)[..., ::2] = 0.0
    toy = WeightedPixels(weights.tolist(), constant=weights[1::2].sum().item())     # p = 1/2: no saturation
    effect = (toy.weights * (bright.mean(1).flatten() - bright.mean())).view(1, 8, 8)
    assert saco(toy, bright, effect, torch.tensor([0]), n_groups=8)["saco"].item() == pytest.approx(1.0)
    assert saco(toy, bright, -effect, torch.tensor([0]), n_groups=8)["saco"].item() == pytest.approx(-1.0)
    assert reduce_saco({"saco": torch.tensor([1.0, -0.5])}) == {"saco": 0.25}


def test_errors_and_cost():
    with pytest.raises(ValueError, match="n_groups"):
        saco(TOY, THREE, torch.ones(1, 1, 3), torch.tensor([0]), n_groups=4)
    with pytest.raises(ValueError, match="n_groups"):
        get_metric("saco").check_options({"n_groups": 1})
    assert get_metric("saco").passes({}, 1) == 11
