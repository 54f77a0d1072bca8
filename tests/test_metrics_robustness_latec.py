"""Avg-sensitivity, the local Lipschitz estimate, continuity, non-sensitivity and input invariance: each against a
plain per-image computation of its equation, batch independence, and properties that could fail."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.evaluation import reexplainer
from vitexplain.instrumentation.modifying import modifier
from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics._relative_stability import gaussian_noise
from vitexplain.metrics.avg_sensitivity import avg_sensitivity
from vitexplain.metrics.continuity import continuity, translation_shifts
from vitexplain.metrics.input_invariance import input_invariance
from vitexplain.metrics.local_lipschitz_estimate import local_lipschitz_estimate
from vitexplain.metrics.non_sensitivity import non_sensitivity
from vitexplain.metrics.sensitivity import max_sensitivity, sensitivity_noise
from vitexplain.registry import get_method

from conftest import make_vit

NAMES = ("avg_sensitivity", "local_lipschitz_estimate", "continuity", "non_sensitivity", "input_invariance")
CHEAP = {"avg_sensitivity": {"n_samples": 3}, "local_lipschitz_estimate": {"n_samples": 3},
         "continuity": {"n_steps": 2}, "non_sensitivity": {"patch_size": 8}, "input_invariance": {}}


def coarse_explain(images, targets):
    """A deterministic, class-dependent stand-in for a method, coarser than the image (4 x 4 cells)."""
    coarse = F.avg_pool2d(images, images.shape[-1] // 4)
    return (coarse[:, 0] * (targets[:, None, None] + 1)).relu() + coarse.pow(2).sum(1)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 3, 16, 16, generator=g), torch.tensor([0, 2, 1])


@pytest.fixture(scope="module")
def model():
    return make_vit(depth=2)


def up(maps, size):
    return F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]


def maxabs(m):
    return m / m.abs().max() if m.abs().max() > 0 else m


def test_avg_sensitivity_is_the_mean_of_the_per_sample_ratios_and_at_most_max_sensitivity(data):
    images, targets = data
    maps = coarse_explain(images, targets)
    noise = sensitivity_noise(5, (3, 16, 16), 0.1, seed=2)
    ours = avg_sensitivity(coarse_explain, images, maps, targets, n_samples=5, radius=0.1, seed=2)
    for i in range(3):
        e = maps[i]
        ratios = [(e - coarse_explain(images[i:i + 1] + d, targets[i:i + 1])[0]).norm() / e.norm() for d in noise]
        assert ours[i].item() == pytest.approx(torch.stack(ratios).double().mean().item(), rel=1e-6)
    highest = max_sensitivity(coarse_explain, images, maps, targets, n_samples=5, radius=0.1, seed=2)
    assert (ours <= highest.double() + 1e-7).all() and (ours < highest.double()).any()


def test_local_lipschitz_estimate_equals_a_plain_loop(data):
    images, targets = data
    maps = coarse_explain(images, targets)
    noise = gaussian_noise(4, (3, 16, 16), 0.2, seed=1)
    ours = local_lipschitz_estimate(coarse_explain, images, maps, targets, n_samples=4, sigma=0.2, seed=1)
    for i in range(3):
        e = maxabs(up(maps[i:i + 1], (16, 16))[0])
        ratios = [(e - maxabs(up(coarse_explain(images[i:i + 1] + d, targets[i:i + 1]), (16, 16))[0])).norm()
                  / d.norm() for d in noise]
        assert ours[i].item() == pytest.approx(max(ratios).item(), rel=1e-5)


def test_continuity_equals_a_plain_loop_over_translations(data):
    images, targets = data
    maps = coarse_explain(images, targets)
    fill = torch.tensor([-1.0, 0.5, 2.0]).view(1, 3, 1, 1)
    shifts = translation_shifts(4, 3)
    assert shifts == [3, -3, 6, -6]
    ours = continuity(coarse_explain, images, maps, targets, shifts=shifts, fill=fill, normalise="none")
    for i in range(3):
        ratios = []
        for s in shifts:
            moved = torch.roll(images[i:i + 1], s, dims=-1)
            if s > 0:
                moved[..., :s] = fill
            else:
                moved[..., s:] = fill
            change = (up(maps[i:i + 1], (16, 16)) - up(coarse_explain(moved, targets[i:i + 1]), (16, 16))).abs().sum()
            ratios.append(change / (images[i] - moved[0]).norm())
        assert ours[i].item() == pytest.approx(max(ratios).item(), rel=1e-5)


def half_blind_vit():
    """A tiny ViT whose patch embedding ignores the left half of every 8-pixel patch (exactly)."""
    model = make_vit(depth=2)
    with torch.no_grad():
        model.patch_embed.proj.weight[..., :4] = 0
    return model


def test_non_sensitivity_equals_a_plain_loop_and_is_zero_for_a_map_zero_exactly_where_the_model_is_blind():
    model = half_blind_vit()
    g = torch.Generator().manual_seed(5)
    images, targets = torch.randn(2, 3, 32, 32, generator=g), torch.tensor([3, 1])
    logits = vitexplain.adapter_for(model).logits
    maps = torch.rand(2, 8, 8, generator=g) * (torch.rand(2, 8, 8, generator=g) > 0.5)   # zeros on half the cells
    ours = non_sensitivity(logits, images, maps, targets, pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3, patch_size=4)
    for i in range(2):
        base = logits(images[i:i + 1]).softmax(-1)[0, targets[i]]
        moved = images[i:i + 1].repeat(64, 1, 1, 1)
        for row in range(8):
            for col in range(8):
                moved[row * 8 + col, :, row * 4:row * 4 + 4, col * 4:col * 4 + 4] = -1.0     # black: -mean / std
        insensitive = (logits(moved).softmax(-1)[:, targets[i]] - base).abs() < 1e-5
        zero = (maps[i].abs() / maps[i].abs().max() < 1e-5).flatten()
        assert ours["non_sensitivity"][i].item() == pytest.approx((insensitive != zero).double().mean().item())
    blind = torch.ones(2, 8, 8)
    blind[..., 0::2] = 0                                        # zero on the left half of every 8-pixel patch
    perfect = non_sensitivity(logits, images, blind, targets, pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3,
                              patch_size=4, score="logit")      # a saturated probability may not move by eps
    assert perfect["non_sensitivity"].tolist() == [0.0, 0.0] and perfect["insensitive"].tolist() == [0.5, 0.5]
    shifted = non_sensitivity(logits, images, 1 - blind, targets, pixel_mean=(0.5,) * 3, pixel_std=(0.5,) * 3,
                              patch_size=4, score="logit")
    assert shifted["non_sensitivity"].tolist() == [1.0, 1.0]


def gradient(model, images, targets, times_input=False):
    x = images.clone().requires_grad_(True)
    grad, = torch.autograd.grad(model(x).gather(1, targets[:, None]).sum(), x)
    return ((grad * x) if times_input else grad).sum(1).detach()


def piecewise_gradient(model, images, targets):
    """The gradient through the model run piece by piece, as token-subset methods do (patch embedding first)."""
    x = images.clone().requires_grad_(True)
    tokens = model.patch_embed(x)
    tokens = model._pos_embed(tokens)
    out = model.forward_head(model.norm(model.blocks(tokens)))
    grad, = torch.autograd.grad(out.gather(1, targets[:, None]).sum(), x)
    return grad.sum(1)


def test_input_invariance_passes_the_gradient_fails_gradient_times_input_and_restores_the_model(model):
    g = torch.Generator().manual_seed(2)
    images = torch.randn(3, 3, 32, 32, generator=g)
    targets = model(images).argmax(1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    for explain, invariant in ((lambda x, t: gradient(model, x, t), True),
                               (lambda x, t: piecewise_gradient(model, x, t), True),
                               (lambda x, t: gradient(model, x, t, times_input=True), False)):
        values = input_invariance(explain, modifier(model), images, explain(images, targets), targets, shift=-1.0)
        assert values["input_invariant"].tolist() == [float(invariant)] * 3
        assert (values["input_shift_change"] < 1e-4).all() if invariant else (values["input_shift_change"] > 0.1).all()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == hooks
    assert torch.equal(gradient(model, images, targets), gradient(model, images, targets))


def batch(model, method, rows=slice(None), fresh=True):
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(4, 3, 32, 32, generator=g)[rows], torch.tensor([1, 4, 7, 2])[rows]
    explain = reexplainer(vitexplain.adapter_for(model), get_method(method).bind()) if fresh else \
        (lambda x, t: vitexplain.explain(model, x, method, target=t))
    return EvalBatch(images=images, maps=explain(images, labels), targets=labels, labels=labels, explain=explain,
                     logits=vitexplain.adapter_for(model).logits, mean=(0.5,) * 3, std=(0.5,) * 3,
                     modified=modifier(model), ids=[f"img{i}" for i in range(4)][rows])


@pytest.mark.parametrize("name", NAMES)
def test_values_do_not_depend_on_the_batch(model, name):
    metric = get_metric(name)
    options = {**metric.options, **CHEAP[name]}
    whole = metric.compute(batch(model, "gae"), **options)
    parts = [metric.compute(batch(model, "gae", rows), **options) for rows in (slice(0, 1), slice(1, 4))]
    for key, value in whole.items():
        assert torch.allclose(value, torch.cat([p[key] for p in parts]), rtol=1e-5, atol=1e-7), key


def test_a_constant_map_is_perfectly_stable_and_the_random_control_is_the_least_stable(model):
    scores = {}
    for method in ("constant_baseline", "gae", "random_baseline"):
        b = batch(model, method)
        scores[method] = {name: get_metric(name).reduce(get_metric(name).compute(b, **CHEAP[name]))
                          for name in ("avg_sensitivity", "local_lipschitz_estimate", "continuity",
                                       "input_invariance")}
    constant, gae, random = scores["constant_baseline"], scores["gae"], scores["random_baseline"]
    for name, number in (("avg_sensitivity", "avg_sensitivity"), ("continuity", "continuity"),
                         ("local_lipschitz_estimate", "local_lipschitz_estimate"),
                         ("input_invariance", "input_shift_change")):
        assert constant[name][number] == 0.0
        assert 0 < gae[name][number] < random[name][number], name
    assert random["avg_sensitivity"]["avg_sensitivity"] > 0.55             # two unrelated U[0, 1) maps: about 0.71
    assert constant["input_invariance"]["input_invariance"] == 1.0 == gae["input_invariance"]["input_invariance"]
    assert random["input_invariance"]["input_invariance"] == 0.0


def test_bad_input_is_refused_in_one_line(model):
    b = batch(model, "gae")
    with pytest.raises(ValueError, match="mean and std"):
        get_metric("continuity").compute(EvalBatch(**{**b.__dict__, "mean": None}), n_steps=1)
    with pytest.raises(ValueError, match="needs the model"):
        get_metric("input_invariance").compute(EvalBatch(**{**b.__dict__, "modified": None}))
    with pytest.raises(ValueError, match="translated image"):
        continuity(lambda x, t: torch.zeros(len(x), 2, 2), b.images, b.maps, b.targets, shifts=[1],
                   fill=torch.zeros(1))
