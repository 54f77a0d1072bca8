"""The methods run through the Captum bridge (vitexplain/methods/_captum.py): each equals Captum's own call on the same
model and inputs, on a tiny timm ViT and a tiny torchvision ResNet; any score works as a target; the draws are seeded
per image; the model comes back as it was, also after an error; and what the ReLU rules mean on a ViT (none applies:
Guided Backprop is the gradient, DeepLIFT is Input × Gradient against its baseline)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from captum._utils.models.linear_model import SGDLasso
from captum.attr import (
    DeepLift,
    DeepLiftShap,
    GradientShap,
    GuidedBackprop,
    InputXGradient,
    KernelShap,
    Lime,
    Occlusion,
    Saliency,
)
from torch import nn

from vitexplain import explain
from vitexplain.methods.expected_gradients import expected_gradients_draws

from conftest import make_vit
from test_instrumentation import _assert_same, _snapshot

TARGET = torch.tensor([3, 7])


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def vit():
    return make_vit(depth=2)


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)  # a ResNet-10: torchvision's basic blocks, one per stage
    return torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=10).eval()


def positive_sum(attributions):
    """LATEC's channel reduction, written out: each channel's positive part, summed."""
    return torch.where(attributions > 0, attributions, torch.zeros_like(attributions)).sum(1)


def patches(size):
    """8 px patches of a 32 px image numbered in raster order, as [1, 1, 32, 32]."""
    index = torch.arange(32) // size
    return (index[:, None] * (32 // size) + index[None, :])[None, None]


def seeded(call, seed=0):
    """``call()`` with torch's CPU generator and numpy's seeded with ``seed``, both put back after."""
    state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        try:
            return call()
        finally:
            np.random.set_state(state)


GRADIENTS = {"saliency": Saliency, "input_x_gradient": InputXGradient, "guided_backprop": GuidedBackprop}


@pytest.mark.parametrize("name", ["vit", "resnet"])
@pytest.mark.parametrize("method", sorted(GRADIENTS))
def test_gradient_methods_equal_captums_own_call(request, x, name, method):
    model = request.getfixturevalue(name)
    expected = positive_sum(GRADIENTS[method](model).attribute(x, target=TARGET))
    assert torch.equal(explain(model, x, method, TARGET), expected)


def test_deeplift_and_deeplift_shap_equal_captums_own_calls_on_a_vit(vit, x):
    expected = positive_sum(DeepLift(vit, eps=1e-9).attribute(x, baselines=torch.zeros_like(x), target=TARGET))
    torch.testing.assert_close(explain(vit, x, "deeplift", TARGET), expected, rtol=0, atol=0)
    references = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    expected = positive_sum(DeepLiftShap(vit).attribute(x, baselines=references, target=TARGET))
    found = explain(vit, x, "deeplift_shap", TARGET, baselines=references, batch_size=6)  # one image per call
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=1e-7)


def test_deeplift_refuses_a_resnet_that_calls_its_relu_twice_as_captum_does(resnet, x):
    with pytest.raises(RuntimeError, match="used more than once"):  # and leaves attributes on the ReLUs
        DeepLift(copy.deepcopy(resnet)).attribute(x, target=TARGET)
    before = _snapshot(resnet)
    for method in ("deeplift", "deeplift_shap"):
        with pytest.raises(TypeError, match=r"calls ReLU\(inplace=True\) more than once"):
            explain(resnet, x, method, TARGET, **({"n_samples": 2} if method == "deeplift_shap" else {}))
    _assert_same(before, _snapshot(resnet))
    assert not any(hasattr(m, "input") or hasattr(m, "output") for m in resnet.modules())


@pytest.mark.parametrize("name", ["vit", "resnet"])
def test_occlusion_lime_and_kernel_shap_equal_captums_own_calls(request, x, name):
    model = request.getfixturevalue(name)
    expected = Occlusion(model).attribute(x, sliding_window_shapes=(3, 16, 16), strides=(3, 12, 12), baselines=0.0,
                                          target=TARGET)  # 12 px strides: a last window aligned with the far edge
    torch.testing.assert_close(explain(model, x, "occlusion", TARGET, window=16, stride=12), positive_sum(expected),
                               rtol=1e-5, atol=1e-6)
    for method, cls, init in (("lime", Lime, {"interpretable_model": SGDLasso()}), ("kernel_shap", KernelShap, {})):
        expected = torch.cat([seeded(lambda: cls(model, **init).attribute(
            x[i:i + 1], target=TARGET[i:i + 1], feature_mask=patches(8), n_samples=8, baselines=0.0,
            perturbations_per_eval=8)) for i in range(2)])
        found = explain(model, x, method, TARGET, n_samples=8, patch_size=8)
        torch.testing.assert_close(found, positive_sum(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["vit", "resnet"])
def test_expected_gradients_equal_captums_gradient_shap_on_the_same_draws(request, x, name, monkeypatch):
    """Captum's GradientShap draws from numpy (baselines, points) and the device's generator (noise): given our
    draws (and no noise, the one draw it makes on the device), it gives our maps."""
    model = request.getfixturevalue(name)
    references = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    alphas, _, chosen = expected_gradients_draws(4, (3, 32, 32), 5, seed=2, device=torch.device("cpu"))
    monkeypatch.setattr(np.random, "choice", lambda k, n: chosen.numpy()[:n])
    monkeypatch.setattr(np.random, "uniform", lambda low, high, n: alphas.double().numpy()[:n])
    expected = torch.cat([GradientShap(model).attribute(x[i:i + 1], baselines=references, target=TARGET[i:i + 1],
                                                        n_samples=4, stdevs=0.0) for i in range(2)])
    monkeypatch.undo()
    found = explain(model, x, "expected_gradients", TARGET, n_samples=4, stdev=0.0, baselines=references, seed=2,
                    batch_size=3, channel_reduction="sum")
    torch.testing.assert_close(found, expected.sum(1), rtol=1e-5, atol=1e-7)


def test_on_a_vit_guided_backprop_is_the_gradient_and_deeplift_is_input_times_gradient(vit, resnet, x):
    """A timm ViT has GELUs and no ReLU module: Captum's rules change nothing there; on a ResNet they do."""
    gradient = explain(vit, x, "saliency", TARGET, absolute=False, channel_reduction="sum")
    assert torch.equal(explain(vit, x, "guided_backprop", TARGET, channel_reduction="sum"), gradient)
    torch.testing.assert_close(explain(vit, x, "deeplift", TARGET, channel_reduction="sum"),
                               explain(vit, x, "input_x_gradient", TARGET, channel_reduction="sum"),
                               rtol=1e-5, atol=1e-7)
    guided = explain(resnet, x, "guided_backprop", TARGET, channel_reduction="sum")
    assert not torch.allclose(guided, explain(resnet, x, "saliency", TARGET, absolute=False, channel_reduction="sum"))


QUICK = {"deeplift_shap": {"n_samples": 2}, "expected_gradients": {"n_samples": 3}, "occlusion": {"window": 16,
         "stride": 16}, "lime": {"n_samples": 5, "patch_size": 8}, "kernel_shap": {"n_samples": 5, "patch_size": 8},
         "captum": {}}


@pytest.mark.parametrize("method", sorted(set(QUICK) | set(GRADIENTS) | {"deeplift"}))
def test_any_score_is_a_target_and_a_batch_is_its_images_one_at_a_time(vit, x, method):
    """A score function reaches every class through the rows the bridge hands Captum (expanded with the inputs)."""
    options = QUICK.get(method, {})
    classes = explain(vit, x, method, 3, batch_size=3, **options)
    torch.testing.assert_close(explain(vit, x, method, lambda outputs: outputs[:, 3], batch_size=3, **options),
                               classes, rtol=0, atol=0)
    alone = torch.cat([explain(vit, x[i:i + 1], method, 3, **options) for i in range(2)])
    torch.testing.assert_close(classes, alone, rtol=1e-5, atol=1e-6)


def test_an_embedding_direction_is_scored_per_image(vit, x):
    direction = torch.randn(10, generator=torch.Generator().manual_seed(3))

    class Cosine(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = vit

        def forward(self, inputs):
            return F.cosine_similarity(self.model(inputs), direction[None], dim=-1)

    references = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    expected = DeepLiftShap(Cosine()).attribute(x, baselines=references).sum(1)
    found = explain(vit, x, "deeplift_shap", direction, baselines=references, channel_reduction="sum", batch_size=4)
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-7)


def test_draws_are_seeded_per_image_and_leave_the_callers_random_state(vit, x):
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    first = explain(vit, x, "lime", 3, n_samples=6, patch_size=8)
    assert torch.equal(first, explain(vit, x, "lime", 3, n_samples=6, patch_size=8))
    assert not torch.equal(first, explain(vit, x, "lime", 3, n_samples=6, patch_size=8, seed=1))
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], numpy_state)


def test_the_model_is_restored_after_an_error_inside_a_hooked_class(x):
    """DeepLift hooks the ReLUs and sets attributes on them; an error after the first ReLU leaves neither behind."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 10)).eval()

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model[2].register_forward_hook(explode)
    try:
        before = _snapshot(model)
        for method in ("deeplift", "guided_backprop"):
            with pytest.raises(RuntimeError, match="injected"):
                explain(model, x, method, TARGET)
            _assert_same(before, _snapshot(model))
            assert not any(hasattr(m, "input") or hasattr(m, "output") for m in model.modules())
    finally:
        handle.remove()
    expected = positive_sum(DeepLift(model, eps=1e-9).attribute(x, baselines=torch.zeros_like(x), target=TARGET))
    torch.testing.assert_close(explain(model, x, "deeplift", TARGET), expected, rtol=0, atol=0)


def test_bfloat16_images_are_explained_in_float32(vit, x):
    from vitexplain import adapter_for, get_method

    found = get_method("saliency").fn(adapter_for(vit), x.bfloat16(), TARGET)
    assert found.dtype == torch.float32
    assert torch.equal(found, explain(vit, x.bfloat16().float(), "saliency", TARGET))


def test_the_generic_method_runs_a_captum_class_by_name_and_refuses_an_unknown_one(vit, x):
    found = explain(vit, x, "captum", TARGET, algorithm="InputXGradient", channel_reduction="sum")
    assert torch.equal(found, InputXGradient(vit).attribute(x, target=TARGET).sum(1))
    found = explain(vit, x, "captum", TARGET, algorithm="Occlusion", channel_reduction="sum",
                    attribute_kwargs={"sliding_window_shapes": (3, 16, 16), "strides": 16})
    expected = Occlusion(vit).attribute(x, sliding_window_shapes=(3, 16, 16), strides=16, target=TARGET).sum(1)
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"^unknown Captum attribution class 'InputXGradiant' \(did you mean "
                                         r"'InputXGradient'.*\)[^\n]*$"):
        explain(vit, x, "captum", TARGET, algorithm="InputXGradiant")
