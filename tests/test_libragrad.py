"""LibraGrad (vitexplain/instrumentation/libragrad.py and the gradient methods' ``libragrad`` option): the gradients
equal those of a hand-written forward whose pruned paths are ``.detach()``-ed and whose gated product is halved; a
batch is its images one at a time; the model comes back as it was, also after an error; bfloat16 autocast leaves the
float32 maps; the models it cannot serve are refused in one line."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention, SwiGLU
from torch import Tensor, nn

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for
from vitexplain.instrumentation.libragrad import libragrad
from vitexplain.instrumentation.lrp.rules.gating import ConstantGate
from vitexplain.instrumentation.patching import ModelPatch
from vitexplain.methods._captum import captum_attributions
from vitexplain.methods.smoothgrad import noise_samples

from conftest import make_vit

CLASSES = torch.tensor([3, 7, 1])


def randomised(model: nn.Module, seed: int = 5) -> nn.Module:
    """Biases, LayerNorm affines, LayerScale gains and tokens drawn at random, so every path of the backward counts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or "token" in name or "pos_embed" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return model


@pytest.fixture(scope="module")
def vit():
    return randomised(make_vit(seed=2, qkv_bias=True, init_values=0.7))


@pytest.fixture(scope="module")
def swiglu_vit():
    return randomised(make_vit(seed=3, mlp_layer=SwiGLU, act_layer=nn.SiLU))


@pytest.fixture(scope="module")
def x():
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


# -- the independent computation: LibraGrad's backward written with .detach() ------------------------------------
def detached_forward(model: nn.Module, images: Tensor) -> Tensor:
    """The timm ViT's forward on its own parameters, each pruned path detached: LayerNorm's variance, the attention's
    q and k, GELU's / SiLU's gate Φ(x) / σ(x); a SwiGLU product passes half its gradient (½p + ½p.detach())."""

    def norm(m, t):
        centred = t - t.mean(-1, keepdim=True)
        return centred / (centred.pow(2).mean(-1, keepdim=True).detach() + m.eps).sqrt() * m.weight + m.bias

    def gain(ls, t):
        return t * ls.gamma if hasattr(ls, "gamma") else t

    tokens = model.patch_embed.proj(images).flatten(2).transpose(1, 2)
    t = torch.cat([model.cls_token.expand(len(images), -1, -1), tokens], 1) + model.pos_embed
    for block in model.blocks:
        a = block.attn
        h = norm(block.norm1, t)
        b, n, c = h.shape
        q, k, v = F.linear(h, a.qkv.weight, a.qkv.bias).reshape(b, n, 3, a.num_heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q.detach() * a.scale @ k.detach().transpose(-2, -1)).softmax(-1)
        t = t + gain(block.ls1, a.proj((attn @ v).transpose(1, 2).reshape(b, n, c)))
        h = norm(block.norm2, t)
        if isinstance(block.mlp, SwiGLU):
            g = block.mlp.fc1_g(h)
            product = g * torch.sigmoid(g).detach() * block.mlp.fc1_x(h)
            hidden = product / 2 + (product / 2).detach()
        else:
            pre = block.mlp.fc1(h)
            hidden = pre * (0.5 * (1 + torch.erf(pre / math.sqrt(2)))).detach()
        t = t + gain(block.ls2, block.mlp.fc2(hidden))
    return model.head(norm(model.norm, t)[:, 0])


def detached_gradient(model: nn.Module, images: Tensor, classes: Tensor) -> Tensor:
    points = images.clone().requires_grad_(True)
    gradient, = torch.autograd.grad(detached_forward(model, points).gather(1, classes[:, None]).sum(), points)
    return gradient


def close(a: Tensor, b: Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))


# -- the gradients --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["vit", "swiglu_vit"])
def test_input_x_gradient_and_saliency_follow_the_detached_backward(request, x, name):
    model = request.getfixturevalue(name)
    with torch.no_grad():
        assert torch.allclose(detached_forward(model, x), model(x), atol=1e-5)  # the hand-written forward is the model
    gradient = detached_gradient(model, x, CLASSES)
    ixg = explain(model, x, "input_x_gradient", CLASSES, libragrad=True, channel_reduction="sum")
    assert close(ixg, (x * gradient).sum(1))
    saliency = explain(model, x, "saliency", CLASSES, libragrad=True, channel_reduction="sum", absolute=False)
    assert close(saliency, gradient.sum(1))
    # LibraGrad moves the map: the plain gradient is not the detached one
    plain = explain(model, x, "input_x_gradient", CLASSES, channel_reduction="sum")
    assert not close(plain, ixg)


def test_integrated_gradients_and_smoothgrad_take_each_point_through_it(vit, x):
    steps = 3
    integral = sum(detached_gradient(vit, x * step / steps, CLASSES) for step in range(1, steps + 1)) / steps
    ig = explain(vit, x, "integrated_gradients", CLASSES, libragrad=True, n_steps=steps, quadrature="riemann_right")
    assert close(ig, (x * integral).sum(1))
    noise = noise_samples(2, tuple(x.shape[1:]), 0, x.device)
    expected = sum(detached_gradient(vit, x + 0.5 * sample, CLASSES).abs() for sample in noise) / 2
    smooth = explain(vit, x, "smoothgrad", CLASSES, libragrad=True, n_samples=2, stdev=0.5)
    assert close(smooth, expected.sum(1))


def test_gate_rule_holds_each_activations_gate_constant():
    x = torch.linspace(-3, 3, 41, dtype=torch.float64).requires_grad_(True)

    class QuickGELU(nn.Module):  # open_clip's, read through the ratio act(x) / x
        def forward(self, t):
            return t * torch.sigmoid(1.702 * t)

    tanh_gelu = lambda t: 0.5 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))  # noqa: E731
    gates = {nn.GELU(approximate="tanh"): tanh_gelu,
             nn.SiLU(): torch.sigmoid, QuickGELU(): lambda t: torch.sigmoid(1.702 * t),
             nn.Sigmoid(): lambda t: torch.sigmoid(t) * (1 - torch.sigmoid(t))}  # no gate: its own derivative
    for module, gate in gates.items():
        with ModelPatch() as patch:
            ConstantGate().place(module, patch)
            with torch.enable_grad():
                out = module(x)
        gradient, = torch.autograd.grad(out.sum(), x)
        assert torch.allclose(out, type(module).forward(module, x))
        assert torch.allclose(gradient, gate(x.detach()), atol=1e-12), type(module).__name__


# -- batches, restoration, precision -------------------------------------------------------------------------
def test_a_batch_is_its_images_one_at_a_time(vit, x):
    together = explain(vit, x, "input_x_gradient", CLASSES, libragrad=True)
    alone = torch.cat([explain(vit, x[i:i + 1], "input_x_gradient", CLASSES[i:i + 1], libragrad=True)
                       for i in range(len(x))])
    assert torch.allclose(together, alone, rtol=1e-5, atol=1e-7)


def model_state(model):
    return [(m, dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks),
             m.__dict__.get("forward"), m.training) for m in model.modules()]


def test_the_model_is_restored_after_use_and_after_an_error(x):
    model = make_vit(init_values=0.5).train()
    before, state = model.eval()(x).detach(), model_state(model.train())
    explain(model, x, "saliency", libragrad=True)
    assert model_state(model) == state

    def fail(module, args, output):
        raise RuntimeError("injected")

    handle = model.blocks[1].mlp.act.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="injected"):
        explain(model, x, "input_x_gradient", libragrad=True)
    handle.remove()
    assert model_state(model) == state
    with pytest.raises(KeyError, match="inside"), libragrad(adapter_for(model)):
        assert model.blocks[0].__dict__.get("forward") is not None  # placed within the block
        raise KeyError("inside")
    assert model_state(model) == state
    assert torch.equal(model.eval()(x), before)


def test_the_forward_is_unchanged_within_the_block(vit, x):
    with torch.no_grad():
        plain = vit(x)
    with libragrad(adapter_for(vit)), torch.enable_grad():
        ruled = vit(x.clone().requires_grad_(True))
    assert torch.allclose(ruled, plain, atol=1e-5)


def test_bfloat16_autocast_leaves_the_float32_maps(vit, x):
    full = explain(vit, x, "input_x_gradient", CLASSES, libragrad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = explain(vit, x, "input_x_gradient", CLASSES, libragrad=True)
    assert under.dtype == torch.float32
    assert torch.allclose(under, full, rtol=1e-5, atol=1e-6 * float(full.abs().max()))


# -- refusals -------------------------------------------------------------------------------------------------
class GatedAttention(Attention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, gated=True, **kwargs)


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4, 10)

    def forward(self, images):
        return self.fc(self.conv(images).relu().mean((2, 3)))


def test_models_without_a_placement_are_refused_in_one_line(x):
    cnn = TinyCNN().eval()
    with pytest.raises(UnsupportedModelError) as refused:
        explain(cnn, x, "input_x_gradient", libragrad=True)
    assert "libragrad" in str(refused.value) and "TinyCNN" in str(refused.value) and "\n" not in str(refused.value)
    assert explain(cnn, x, "input_x_gradient").shape == (3, 32, 32)  # without it the method serves the CNN
    gated = make_vit(attn_layer=GatedAttention)
    with pytest.raises(UnsupportedModelError, match="libragrad.*its attention has a gate"):
        explain(gated, x, "saliency", libragrad=True)
    vit = adapter_for(make_vit())
    with pytest.raises(ValueError, match="libragrad=True .* DeepLift puts rules of its own"):
        captum_attributions(vit, x, vit.target(x, None), "DeepLift", libragrad=True)
