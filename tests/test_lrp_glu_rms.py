"""LRP rules for gated feed-forwards (timm's GluMlp / SwiGLU in ViT, DINOv2-giant, AIMv2, BEiT) and for RMSNorm:
conservation as the LayerNorm / GELU models have it, and the RMSNorm rules against their plain formulas and LXT's."""
from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import RmsNorm, SwiGLUPacked

from vitexplain.instrumentation import adapter_for, lrp
from vitexplain.instrumentation.lrp import attention_aware
from vitexplain.instrumentation.lrp import rules as r

from test_lrp import assert_conserves, randomise_biases, zero_biases
from zoo import SIZE, images, randomise

#: tiny builds of the models that carry a gated feed-forward or an RMSNorm: timm architecture, arguments over SIZE
MODELS = {
    # DINOv2-giant: GluMlp packed (SwiGLUPacked, the value first), SiLU, LayerScale
    "dinov2_giant": ("vit_giant_patch14_dinov2", dict(mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, patch_size=8)),
    # AIMv2: RmsNorm everywhere (patch embedding, blocks, final), SwiGLU, no q/k/v or projection biases
    "aimv2": ("aimv2_large_patch14_224", dict(patch_size=8)),
    "beit_swiglu": ("beit_base_patch16_224", dict(swiglu_mlp=True, use_abs_pos_emb=True)),
}


def build(name: str) -> torch.nn.Module:
    """The tiny model, its parameters random (timm draws SwiGLU's gate weights near zero: they are redrawn, so that
    the gate's path matters)."""
    architecture, arguments = MODELS[name]
    torch.manual_seed(0)
    model = randomise(timm.create_model(architecture, pretrained=False, **{**SIZE, **arguments}))
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "fc1_g" in parameter_name:
                parameter.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_rules_keep_the_models_output(name):
    """The gating product written out by the arithmetic computes what the model's own GluMlp / SwiGLU does."""
    model = build(name)
    found = lrp.relevance(adapter_for(model), images(2), None, "chefer", at=("residuals",))
    torch.testing.assert_close(found.logits, model(images(2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_chefer_rules_conserve_relevance_through_every_block(name, rules, monkeypatch):
    """The gate held constant (signal-take-all) and RMSNorm's relevance passed unchanged keep Chefer et al.'s sets
    conservative despite biases, as on GELU / LayerNorm models (tests/test_lrp.py)."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    assert_conserves(randomise_biases(build(name)).double(), images(2).double(), rules)


@pytest.mark.parametrize("rules", ["conservative", attention_aware(True, 0.25, 0.25)], ids=["conservative", "cplrp"])
@pytest.mark.parametrize("name", ["aimv2", "dinov2_giant"])
def test_constant_attention_sets_conserve_the_target_logit_without_biases(name, rules):
    """Attention and gate constant, RMSNorm's root mean square constant: without biases every layer is linear in its
    input, so every block's input holds the whole target logit."""
    model = zero_biases(build(name)).double()
    found = lrp.relevance(adapter_for(model), images(2).double(), None, rules)
    target_logits = found.logits.gather(1, found.targets[:, None])[:, 0]
    for relevance in found.residuals:
        torch.testing.assert_close(relevance.sum((1, 2)), target_logits)


# -- the RMSNorm rules on one layer ----------------------------------------------------------------
def rms_norm(kind: str) -> torch.nn.Module:
    torch.manual_seed(3)
    norm = RmsNorm(6, eps=1e-5) if kind == "timm" else torch.nn.RMSNorm(6)  # torch's: eps=None
    with torch.no_grad():
        norm.weight.normal_(0, 1)
    return norm.double()


def input_relevance(rule: r.ModuleRule, norm: torch.nn.Module, x: torch.Tensor, output_relevance: torch.Tensor):
    """R_x = x ⊙ ∂(y ⊙ R_y / y)/∂x under ``rule`` (Gradient×Input form), and the norm's output y."""
    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = rule.output(norm, x, norm(x))
        (grad,) = torch.autograd.grad(y, x, grad_outputs=output_relevance / y.detach())
    return x.detach() * grad, y.detach()


@pytest.mark.parametrize("kind", ["timm", "torch"])
@pytest.mark.parametrize("rule", [r.PassUnchanged, r.ConstantStd])
def test_rms_norm_passes_relevance_unchanged(rule, kind):
    """Chefer et al.'s norm rule and the root mean square held constant (Ali et al.'s LN-rule, AttnLRP Prop. 3.4) are
    the same on an RMSNorm: nothing centres, no bias absorbs, so each element keeps its relevance."""
    norm, x = rms_norm(kind), torch.randn(2, 5, 6, dtype=torch.float64)
    output_relevance = torch.randn(2, 5, 6, dtype=torch.float64)
    found, _ = input_relevance(rule(), norm, x, output_relevance)
    torch.testing.assert_close(found, output_relevance)


def test_rms_norm_rule_of_attention_aware_sets_is_lxts():
    """LXT's ``rms_norm_forward`` (lxt/efficient/patches.py: w · x · stop_gradient(rsqrt(mean x² + ε))), written
    out here and taken Gradient×Input, gives the attnlrp / cplrp rule's relevance. (LXT itself is not imported:
    importing it patches torch.nn for the whole process.)"""
    norm, x = rms_norm("timm"), torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    output_relevance = torch.randn(2, 5, 6, dtype=torch.float64)
    y = norm.weight.detach() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps).detach()
    (grad,) = torch.autograd.grad(y, x, grad_outputs=output_relevance / y.detach())
    for constant_attention in (False, True):
        found, _ = input_relevance(attention_aware(constant_attention).norm(), norm, x.detach(), output_relevance)
        torch.testing.assert_close(found, x.detach() * grad)


@pytest.mark.parametrize("kind", ["timm", "torch"])
def test_absolute_rule_on_rms_norm(kind, monkeypatch):
    """Vukadin et al.'s rule with |x| standardised by its own root mean square (that of x) and |weight|:
    R_x = (x w + |x w|) / rms / |y| · R_y = (y + |y|) / |y| · R_y."""
    monkeypatch.setattr(r.core, "STABILISER", 1e-300)
    norm, x = rms_norm(kind), torch.randn(2, 5, 6, dtype=torch.float64)
    output_relevance = torch.randn(2, 5, 6, dtype=torch.float64)
    found, y = input_relevance(r.AbsoluteNorm(), norm, x, output_relevance)
    torch.testing.assert_close(found, (y + y.abs()) / y.abs() * output_relevance)


def test_absolute_rule_rescales_every_layer_on_aimv2():
    """abs LRP's "relative" step holds through RMSNorms and SwiGLU: Σ|R| = 1 per image at the pixels and the top."""
    model = build("aimv2").double()
    found = lrp.relevance(adapter_for(model), images(2).double(), None, "abslrp")
    ones = torch.ones(2, dtype=torch.float64)
    torch.testing.assert_close(found.pixels.abs().sum((1, 2, 3)), ones)
    torch.testing.assert_close(found.residuals[-1].abs().sum((1, 2)), ones)
