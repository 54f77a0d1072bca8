"""AttnLRP and CP-LRP as LXT runs them on ViTs: the "attnlrp" / "cplrp" rule sets, their rules, the two methods,
and their maps against LXT's own on the same model (benchmarks/lxt_agreement.py, docs/decisions/lrp.md).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitexplain import explain
from vitexplain.instrumentation import adapter_for, lrp
from vitexplain.instrumentation.lrp import attention_aware
from vitexplain.instrumentation.lrp import rules as r

from conftest import make_vit
from test_lrp import add_rule, images_like, randomise_biases, written_out_forward, zero_biases


def relevance(model, *args, **kwargs):
    return lrp.relevance(adapter_for(model), *args, **kwargs)


@pytest.fixture
def unstabilised(monkeypatch):
    """The written-out rules divide exactly; take the 1e-9 stabiliser out of the comparison."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)


# -- the rules against their formulas ------------------------------------------------------------
def gamma_rule(x, weight, bias, rel, gamma):
    """R_i = Σ_j (z_ij + γ z_ij^{s_j}) / (y_j + γ (Σ_i z_ij^{s_j} + b_j^{s_j})) R_j over the explicit contributions
    z_ij = x_i w_ji, s_j the sign of y_j (γ = 0: the ε-rule, the bias absorbing its share)."""
    z = x[..., None, :] * weight
    y = z.sum(-1) + bias
    positive = y > 0
    favoured = torch.where(positive[..., None], z.clamp(min=0), z.clamp(max=0))
    denominator = y + gamma * (favoured.sum(-1) + torch.where(positive, bias.clamp(min=0), bias.clamp(max=0)))
    return ((z + gamma * favoured) * (rel / denominator)[..., None]).sum(-2)


def norm_rule(x, norm, rel):
    """LayerNorm with its standard deviation constant: the bias absorbs its share, relevance passes the scaling
    unchanged, the centring x_i − mean (contributions x_i (δ_ij − 1/n)) takes the ε-rule."""
    centred = x - x.mean(-1, keepdim=True)
    scaled = centred / (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt() * norm.weight
    width = x.shape[-1]
    contributions = x[..., :, None] * (torch.eye(width, dtype=x.dtype) - 1 / width)
    return (contributions * (rel * scaled / (scaled + norm.bias) / centred)[..., None, :]).sum(-1)


def written_out_lxt(model, images, targets, gammas, conv_gamma, constant_attention):
    """AttnLRP (or CP-LRP) layer by layer from the target logit down to the pixels, LXT's placement: γ-rule at
    the feed-forward and head Linears (γ of each block, the head the last's) and at the patch convolution, ε at
    the attention's projections and the adds, identity at GELU."""
    logits, acts = written_out_forward(model, images)
    batch, blocks = images.shape[0], acts["blocks"]
    last = blocks[-1]["x1"] + blocks[-1]["branch2"]
    start = F.one_hot(targets, logits.shape[1]).to(images.dtype) * logits
    normed = torch.zeros_like(last)
    normed[:, 0] = gamma_rule(acts["pooled"], model.head.weight, model.head.bias, start, gammas[-1])
    rel, attn_rel = norm_rule(last, model.norm, normed), []
    for block, a, gamma in reversed(list(zip(model.blocks, blocks, gammas))):
        attn, mlp = block.attn, block.mlp
        r_x1, r_branch2 = add_rule(a["x1"], a["branch2"], rel, normalised=False)
        # GELU: identity
        r_hidden = gamma_rule(a["gelu"], mlp.fc2.weight, mlp.fc2.bias, r_branch2, gamma)
        r_normed = gamma_rule(a["n2"], mlp.fc1.weight, mlp.fc1.bias, r_hidden, gamma)
        r_x1 = r_x1 + norm_rule(a["x1"], block.norm2, r_normed)
        r_x, r_branch1 = add_rule(a["x"], a["branch1"], r_x1, normalised=False)
        r_merged = gamma_rule(a["merged"], attn.proj.weight, attn.proj.bias, r_branch1, 0)
        ratio = r_merged.reshape(a["mixed"].transpose(1, 2).shape).transpose(1, 2) / a["mixed"]
        share = 1.0 if constant_attention else 0.5
        r_probs = a["probs"] * (ratio @ a["v"].transpose(-1, -2)) * (0 if constant_attention else 0.5)
        r_v = a["v"] * (a["probs"].transpose(-1, -2) @ ratio) * share
        attn_rel.insert(0, r_probs)
        r_scores = a["scores"] * (r_probs - a["probs"] * r_probs.sum(-1, keepdim=True))  # Prop. 3.1
        ratio = r_scores / a["scores"] * attn.head_dim ** -0.5
        r_q, r_k = a["q"] * (ratio @ a["k"]) / 2, a["k"] * (ratio.transpose(-1, -2) @ a["q"]) / 2
        r_qkv = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(batch, a["x"].shape[1], -1)
        rel = r_x + norm_rule(a["x"], block.norm1, gamma_rule(a["n1"], attn.qkv.weight, attn.qkv.bias, r_qkv, 0))
    r_patches = (rel * acts["content"] / acts["tokens"])[:, 1:]
    conv = model.patch_embed.proj
    columns = F.unfold(images, conv.kernel_size, stride=conv.kernel_size).transpose(1, 2)
    r_columns = gamma_rule(columns, conv.weight.flatten(1), conv.bias, r_patches, conv_gamma)
    pixels = F.fold(r_columns.transpose(1, 2), images.shape[-2:], conv.kernel_size, stride=conv.kernel_size)
    return dict(attn=attn_rel, tokens=rel, patches=r_patches, pixels=pixels)


@pytest.mark.parametrize("constant_attention", [False, True], ids=["attnlrp", "cplrp"])
def test_rule_sets_match_a_written_out_propagation(constant_attention, unstabilised):
    model = randomise_biases(make_vit(seed=3, depth=2)).double()
    images, targets = images_like(dtype=torch.float64), torch.tensor([2, 7])
    gammas, conv_gamma = (0.3, 0.1), 0.25
    expected = written_out_lxt(model, images, targets, gammas, conv_gamma, constant_attention)
    found = relevance(model, images, targets, attention_aware(constant_attention, gammas, conv_gamma))
    for got, want in zip(found.attn, expected["attn"]):
        torch.testing.assert_close(got, want.detach(), rtol=1e-9, atol=1e-12)
    for stage in ("tokens", "patches", "pixels"):
        torch.testing.assert_close(getattr(found, stage), expected[stage].detach(), rtol=1e-9, atol=1e-12)


def test_taylor_softmax_rule_is_its_formula():
    """AttnLRP Prop. 3.1: R_s = s ⊙ (R_A − A ΣR_A) over each row, with relevance R_A put on the probabilities."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    wanted = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        probabilities = r.TaylorAttention().softmax(scores)
        (gradient,) = torch.autograd.grad(probabilities, scores, wanted / probabilities)
    probabilities = scores.softmax(-1)
    torch.testing.assert_close(scores * gradient, scores * (wanted - probabilities * wanted.sum(-1, keepdim=True)))


def test_gamma_rule_on_the_patch_convolution_is_the_linear_rule_on_its_patches():
    g = torch.Generator().manual_seed(1)
    conv = torch.nn.Conv2d(3, 6, 4, stride=4).double()
    images = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    wanted = torch.randn(2, 6, 2, 2, generator=g, dtype=torch.float64)
    with torch.enable_grad():
        output = r.Gamma(0.5).output(conv, images, conv(images))
        (gradient,) = torch.autograd.grad(output, images, wanted / output)
    columns = F.unfold(images, 4, stride=4).transpose(1, 2)
    per_column = gamma_rule(columns, conv.weight.flatten(1), conv.bias, wanted.flatten(2).transpose(1, 2), 0.5)
    torch.testing.assert_close(images * gradient, F.fold(per_column.transpose(1, 2), (8, 8), 4, stride=4).detach())


# -- conservation ---------------------------------------------------------------------------------
def test_cp_lrp_conserves_the_target_logit_without_biases():
    """Constant attention, γ-rules, LayerNorm's identity and the ε-rule at the adds conserve relevance exactly
    when no bias absorbs any: every block boundary holds the target logit, the pixels the patches'."""
    model = zero_biases(make_vit(depth=3)).double()
    found = relevance(model, images_like(dtype=torch.float64), None, attention_aware(True, 0.25, 0.25))
    target_logits = found.logits.gather(1, found.targets[:, None])[:, 0]
    for rel in found.residuals:
        torch.testing.assert_close(rel.sum((1, 2)), target_logits)
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))
    assert all((rel == 0).all() for rel in found.attn)


# -- the methods ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return randomise_biases(make_vit(seed=2))


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_options(tiny, method):
    images, targets = images_like(2), torch.tensor([1, 6])
    pixels = explain(tiny, images, method, targets)
    assert pixels.shape == (2, 32, 32)
    torch.testing.assert_close(explain(tiny, images, method, targets, gamma=[0.05] * 3), pixels)
    assert not torch.allclose(explain(tiny, images, method, targets, gamma=[0.5, 0, 0]), pixels, rtol=1e-3)
    with pytest.raises(ValueError, match="one per block: 3 for this model, got 2"):
        explain(tiny, images, method, gamma=[0.1, 0.2])
    with pytest.raises(ValueError, match="option gamma of method"):
        explain(tiny, images, method, gamma=-0.1)
    patches = explain(tiny, images, method, targets, at="patches")
    rules = attention_aware(method == "cp_lrp")
    expected = relevance(tiny, images, targets, rules, at=("patches",)).patches.sum(-1).reshape(2, 4, 4)
    torch.testing.assert_close(patches.unflatten(1, (4, 8)).unflatten(-1, (4, 8)).sum((2, 4)), expected)


def test_cp_lrp_at_gamma_zero_is_the_conservative_rule_set_read_at_the_pixels(tiny):
    """conservative_lrp and cp_lrp share every rule at γ = 0; conservative_lrp reads the token embeddings
    (position embedding's share included), cp_lrp the pixels (docs/decisions/lrp.md)."""
    images, targets = images_like(2), torch.tensor([3, 4])
    conservative = relevance(tiny, images, targets, "conservative", at=("pixels",)).pixels.sum(1)
    torch.testing.assert_close(explain(tiny, images, "cp_lrp", targets, gamma=0, conv_gamma=0), conservative)


# -- against LXT itself ---------------------------------------------------------------------------
@pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("lxt", "zennit")),
                    reason="LXT is not installed (pip install lxt; the test extra has it)")
def test_maps_equal_lxts_on_the_same_model(tmp_path):
    """LXT and vitexplain explain the same torchvision ViT (random weights, nn.MultiheadAttention's packed
    projection); the benchmark compares the maps in float64, per image, at four γ settings (one per block among
    them), and vitexplain's logits under the rules with the model's own. It runs LXT in subprocesses of its own, since
    importing LXT patches torch.nn classes for the whole process."""
    script = Path(__file__).parents[1] / "benchmarks" / "lxt_agreement.py"
    figures = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, str(script), "--layers", "2", "--heads", "2", "--images", "3", "--json",
                          str(figures)], env=os.environ, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(figures.read_text())
    assert found["logit_difference"] < 1e-10
    assert {label.split()[0] for label in found["maps"]} == {"attnlrp", "cp_lrp"} and len(found["maps"]) == 8
    for label, figure in found["maps"].items():
        assert figure["r_min"] >= 0.999, label
