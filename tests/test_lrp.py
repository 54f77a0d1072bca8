"""LRP family: transformer_attribution, lrp, partial_lrp, conservative_lrp and the rules behind them."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from timm.layers import Attention

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, lrp
from vitexplain.instrumentation.lrp import RULE_SETS

from conftest import make_vit


class GatedAttention(Attention):
    """timm's attention with its sigmoid output gate on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, gated=True, **kwargs)


def relevance(model, *args, **kwargs):
    """The LRP relevance of ``model`` (relevance takes an adapter)."""
    return lrp.relevance(adapter_for(model), *args, **kwargs)

LRP_METHODS = ("transformer_attribution", "lrp", "partial_lrp", "conservative_lrp")


def images_like(batch: int = 2, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def randomise_biases(model: torch.nn.Module, scale: float = 0.3, seed: int = 5) -> torch.nn.Module:
    """Non-zero biases and LayerNorm affines, so that ignoring or absorbing them is visible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + torch.randn(p.shape, generator=g) * scale)
    return model


def zero_biases(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


# -- an independent, written-out forward and relevance propagation -----------------------------
def layer_norm(x, norm, constant_std=False):
    centred = x - x.mean(-1, keepdim=True)
    std = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    return centred / (std.detach() if constant_std else std) * norm.weight + norm.bias


def written_out_forward(model, images, conservative=False):
    """Plain ViT forward from the weights; returns logits and every intermediate the rules need."""
    conv = model.patch_embed.proj
    batch = images.shape[0]
    patches = F.conv2d(images, conv.weight, conv.bias, stride=conv.stride).flatten(2).transpose(1, 2)
    content = torch.cat([model.cls_token.expand(batch, -1, -1), patches], 1)
    tokens = (content + model.pos_embed).detach().requires_grad_(True)
    x, blocks = tokens, []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        heads, width = attn.num_heads, attn.head_dim
        n, c = x.shape[1], x.shape[2]
        n1 = layer_norm(x, block.norm1, conservative)
        qkv = n1 @ attn.qkv.weight.T + attn.qkv.bias
        q, k, v = qkv.reshape(batch, n, 3, heads, width).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * width ** -0.5
        probs = scores.softmax(-1)
        if conservative:
            probs = probs.detach()
        else:
            probs.retain_grad()
        mixed = probs @ v
        merged = mixed.transpose(1, 2).reshape(batch, n, c)
        branch1 = merged @ attn.proj.weight.T + attn.proj.bias
        x1 = x + branch1
        n2 = layer_norm(x1, block.norm2, conservative)
        hidden = n2 @ mlp.fc1.weight.T + mlp.fc1.bias
        gelu = hidden * (F.gelu(hidden) / hidden).detach() if conservative else F.gelu(hidden)
        branch2 = gelu @ mlp.fc2.weight.T + mlp.fc2.bias
        blocks.append(dict(x=x, n1=n1, q=q, k=k, v=v, scores=scores, probs=probs, mixed=mixed, merged=merged,
                           branch1=branch1, x1=x1, n2=n2, gelu=gelu, branch2=branch2))
        x = x1 + branch2
    pooled = layer_norm(x, model.norm, conservative)[:, 0]
    logits = pooled @ model.head.weight.T + model.head.bias
    return logits, dict(patches=patches, content=content, tokens=tokens, blocks=blocks, pooled=pooled)


def alpha1beta0_rule(x, weight, rel, separate=False):
    """LRP-αβ, α=1, β=0 for y = x Wᵀ: each output's relevance shared by the positive x_i w_ji — over one
    denominator (layers_ours.py), or ``separate``: the x⁺ and x⁻ parts each over their own (layers_lrp.py)."""
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    if separate:
        return xp * ((rel / (xp @ wp.T)) @ wp) + xn * ((rel / (xn @ wn.T)) @ wn)
    s = rel / (xp @ wp.T + xn @ wn.T)
    return xp * (s @ wp) + xn * (s @ wn)


def add_rule(a, b, rel, normalised):
    """z-rule for a + b, optionally rescaled per image as in Chefer et al. Eq. 7."""
    ra, rb = rel * a / (a + b), rel * b / (a + b)
    if not normalised:
        return ra, rb
    sa, sb, total = ra.sum((1, 2)), rb.sum((1, 2)), rel.sum((1, 2))
    fa = sa.abs() / (sa.abs() + sb.abs()) * total / sa
    fb = sb.abs() / (sa.abs() + sb.abs()) * total / sb
    return ra * fa[:, None, None], rb * fb[:, None, None]


def written_out_relevance(model, images, targets, normalised, separate=False):
    """Chefer et al.'s relprop, layer by layer, from relevance 1 on the target logit (``separate``: the
    Linear rule of layers_lrp.py)."""
    alpha1beta0 = functools.partial(alpha1beta0_rule, separate=separate)
    logits, acts = written_out_forward(model, images)
    batch = images.shape[0]
    start = F.one_hot(targets, logits.shape[1]).to(images.dtype)
    rel = torch.zeros_like(acts["tokens"])
    rel[:, 0] = alpha1beta0(acts["pooled"], model.head.weight, start)  # token pooling, LayerNorm: identity
    attn_rel = []
    for block, a in reversed(list(zip(model.blocks, acts["blocks"]))):
        attn, mlp = block.attn, block.mlp
        r_x1, r_branch2 = add_rule(a["x1"], a["branch2"], rel, normalised)
        r_hidden = alpha1beta0(a["gelu"], mlp.fc2.weight, r_branch2)  # GELU: identity
        r_x1 = r_x1 + alpha1beta0(a["n2"], mlp.fc1.weight, r_hidden)  # norm2: identity
        r_x, r_branch1 = add_rule(a["x"], a["branch1"], r_x1, normalised)
        r_merged = alpha1beta0(a["merged"], attn.proj.weight, r_branch1)
        s = r_merged.reshape(a["mixed"].transpose(1, 2).shape).transpose(1, 2) / a["mixed"]
        r_probs = a["probs"] * (s @ a["v"].transpose(-1, -2)) / 2
        r_v = a["v"] * (a["probs"].transpose(-1, -2) @ s) / 2
        attn_rel.insert(0, r_probs)
        s = r_probs / a["scores"] * attn.head_dim ** -0.5  # softmax: identity
        r_q, r_k = a["q"] * (s @ a["k"]) / 2, a["k"] * (s.transpose(-1, -2) @ a["q"]) / 2
        r_qkv = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(batch, a["x"].shape[1], -1)
        rel = r_x + alpha1beta0(a["n1"], attn.qkv.weight, r_qkv)  # norm1: identity
    r_patches = (rel * acts["content"] / acts["tokens"])[:, 1:]
    # z^B at the patch convolution, bounds = each image's min and max
    conv = model.patch_embed.proj
    size = conv.kernel_size
    columns = F.unfold(images, size, stride=size).transpose(1, 2)  # [B, L, 3*p*p]
    weight = conv.weight.reshape(conv.weight.shape[0], -1)  # [C, 3*p*p]
    low = images.amin((1, 2, 3))[:, None, None, None]
    high = images.amax((1, 2, 3))[:, None, None, None]
    contrib = columns[:, :, None] * weight - low * weight.clamp(min=0) - high * weight.clamp(max=0)
    r_columns = (contrib / contrib.sum(-1, keepdim=True) * r_patches[..., None]).sum(2)
    pixels = F.fold(r_columns.transpose(1, 2), images.shape[-2:], size, stride=size)
    return dict(attn=attn_rel, tokens=rel, patches=r_patches, pixels=pixels)


@pytest.fixture(scope="module")
def double_model():
    return randomise_biases(make_vit(seed=3, depth=2)).double()


@pytest.fixture
def unstabilised(monkeypatch):
    """The written-out rules divide exactly; take the 1e-9 stabiliser out of the comparison."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
def test_rules_match_a_written_out_relevance_propagation(double_model, rules, unstabilised):
    images = images_like(dtype=torch.float64)
    targets = torch.tensor([2, 7])
    expected = written_out_relevance(double_model, images, targets, normalised=rules == "chefer")
    found = relevance(double_model, images, targets, rules)
    for got, want in zip(found.attn, expected["attn"]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(found.tokens, expected["tokens"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(found.patches, expected["patches"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(found.pixels, expected["pixels"], rtol=1e-9, atol=1e-12)


def test_separate_linear_rule_matches_a_written_out_relevance_propagation(double_model, unstabilised):
    """layers_lrp.py's Linear.relprop, the x⁺ and x⁻ parts each normalised by their own sum, at every Linear."""
    images = images_like(dtype=torch.float64)
    targets = torch.tensor([2, 7])
    expected = written_out_relevance(double_model, images, targets, normalised=False, separate=True)
    found = relevance(double_model, images, targets, lrp.lrp_baseline("separate"))
    for got, want in zip(found.attn, expected["attn"]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(found.tokens, expected["tokens"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(found.pixels, expected["pixels"], rtol=1e-9, atol=1e-12)
    shared = written_out_relevance(double_model, images, targets, normalised=False)
    assert not torch.allclose(expected["pixels"], shared["pixels"], rtol=1e-2)
    partial = expected["attn"][-1].clamp(min=0).mean(1)[:, 0, 1:].reshape(2, 4, 4)
    torch.testing.assert_close(explain(double_model, images, "partial_lrp", targets, linear_rule="separate"),
                               partial.float())
    torch.testing.assert_close(explain(double_model, images, "lrp", targets, linear_rule="separate"),
                               expected["pixels"].sum(1).float())


def test_normalised_residual_rule_changes_the_relevance(double_model):
    images = images_like(dtype=torch.float64)
    chefer, plain = relevance(double_model, images, 2, "chefer"), relevance(double_model, images, 2, "lrp")
    assert not torch.allclose(chefer.tokens, plain.tokens, rtol=1e-3, atol=1e-6)


def test_methods_match_their_definitions_on_the_written_out_relevance(double_model, unstabilised):
    images, targets = images_like(dtype=torch.float64), torch.tensor([2, 7])
    logits, acts = written_out_forward(double_model, images)
    logits.gather(1, targets[:, None]).sum().backward()
    grads = [a["probs"].grad for a in acts["blocks"]]
    chefer = written_out_relevance(double_model, images, targets, normalised=True)
    plain = written_out_relevance(double_model, images, targets, normalised=False)
    eye = torch.eye(grads[0].shape[-1], dtype=torch.float64)
    for start in (0, 1):
        joint = eye
        for grad, rel in list(zip(grads, chefer["attn"]))[start:]:
            joint = (eye + (grad * rel).clamp(min=0).mean(1)) @ joint
        got = explain(double_model, images, "transformer_attribution", targets, start_layer=start)
        torch.testing.assert_close(got, joint[:, 0, 1:].reshape(2, 4, 4).float(), rtol=1e-5, atol=1e-7)
    partial = plain["attn"][-1].clamp(min=0).mean(1)[:, 0, 1:].reshape(2, 4, 4)
    torch.testing.assert_close(explain(double_model, images, "partial_lrp", targets), partial.float())
    torch.testing.assert_close(explain(double_model, images, "lrp", targets), plain["pixels"].sum(1).float())


def test_conservative_lrp_is_gradient_times_input_of_a_forward_with_constant_attention_and_std():
    model = randomise_biases(make_vit(seed=4, depth=2)).double()
    images, targets = images_like(dtype=torch.float64), torch.tensor([1, 4])
    logits, acts = written_out_forward(model, images, conservative=True)
    logits.gather(1, targets[:, None]).sum().backward()
    tokens = acts["tokens"]
    expected = (tokens * tokens.grad).sum(-1)[:, 1:].reshape(2, 4, 4)
    torch.testing.assert_close(explain(model, images, "conservative_lrp", targets), expected.float())


# -- conservation -------------------------------------------------------------------------------
FAMILY_VARIANTS = [dict(), dict(distilled=True), dict(reg_tokens=2), dict(init_values=0.5, qkv_bias=True)]


def assert_conserves(model, images, rules):
    """Relevance 1 on the target logit reaches every block's input whole, and the pixels hold the patches' relevance
    (a float64 ``model``, stabilisers taken out)."""
    found = relevance(model, images, None, rules)
    for rel in found.residuals:
        torch.testing.assert_close(rel.sum((1, 2)), torch.ones(len(images), dtype=torch.float64))
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))


@pytest.mark.parametrize("family", FAMILY_VARIANTS)
@pytest.mark.parametrize("rules", ["chefer", "lrp"])
def test_chefer_rules_conserve_relevance_through_every_block_despite_biases(family, rules, unstabilised):
    assert_conserves(randomise_biases(make_vit(**family)).double(), images_like(dtype=torch.float64), rules)


def test_conservative_rules_conserve_exactly_without_biases():
    model = zero_biases(make_vit(depth=3)).double()
    found = relevance(model, images_like(dtype=torch.float64), None, "conservative")
    target_logits = found.logits.gather(1, found.targets[:, None])[:, 0]
    torch.testing.assert_close(found.output, target_logits)
    for rel in found.residuals:
        torch.testing.assert_close(rel.sum((1, 2)), target_logits)
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))
    assert all((rel == 0).all() for rel in found.attn)  # attention is a constant: no relevance


def test_conservative_rules_lose_relevance_to_biases():
    model = randomise_biases(make_vit(depth=2)).double()
    found = relevance(model, images_like(dtype=torch.float64), None, "conservative")
    assert not torch.allclose(found.residuals[0].sum((1, 2)), found.residuals[-1].sum((1, 2)), rtol=1e-3)


# -- the model is left exactly as it was ---------------------------------------------------------
def model_state(model):
    return [(m, dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks),
             m.__dict__.get("forward"), m.training) for m in model.modules()]


@pytest.mark.parametrize("rules", sorted(RULE_SETS))
def test_model_is_restored_after_use_and_after_an_exception(rules):
    model = make_vit(init_values=0.5).train()
    images = images_like()
    before, state = model.eval()(images).detach(), model_state(model.train())
    relevance(model, images, None, rules)
    assert model_state(model) == state

    def fail(module, args, output):
        raise RuntimeError("injected")

    handle = model.blocks[1].mlp.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="injected"):
        relevance(model, images, None, rules)
    handle.remove()
    assert model_state(model) == state
    assert torch.equal(model.eval()(images), before)


# -- methods -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return make_vit(seed=2)


@pytest.mark.parametrize("method", LRP_METHODS)
def test_batch_of_four_equals_one_at_a_time(tiny, method):
    images, targets = images_like(4), torch.tensor([0, 3, 5, 9])
    together = explain(tiny, images, method, targets)
    alone = torch.cat([explain(tiny, images[i:i + 1], method, targets[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-6)
    size = (32, 32) if method == "lrp" else (4, 4)
    assert together.shape == (4, *size) and together.isfinite().all()


@pytest.mark.parametrize("method", LRP_METHODS + ("abs_lrp", "attnlrp", "cp_lrp"))
def test_maps_do_not_depend_on_whether_the_parameters_are_frozen(tiny, method):
    """A user explaining a trained model often freezes it; the relevance must not need parameter gradients."""
    images, targets = images_like(2), torch.tensor([1, 6])
    trainable = explain(tiny, images, method, targets)
    for parameter in tiny.parameters():
        parameter.requires_grad_(False)
    try:
        frozen = explain(tiny, images, method, targets)
    finally:
        for parameter in tiny.parameters():
            parameter.requires_grad_(True)
    assert trainable.abs().sum() > 0
    torch.testing.assert_close(frozen, trainable)


@pytest.mark.parametrize("method", LRP_METHODS)
def test_maps_depend_on_the_target_class(tiny, method):
    images = images_like(2)
    first, second = explain(tiny, images, method, 0), explain(tiny, images, method, 1)
    assert not torch.allclose(first, second, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("method", LRP_METHODS)
def test_works_on_distilled_deit(method):
    model = make_vit(distilled=True)
    maps = explain(model, images_like(2), method)
    size = (32, 32) if method == "lrp" else (4, 4)
    assert maps.shape == (2, *size) and maps.isfinite().all() and maps.abs().sum() > 0


@pytest.mark.parametrize("pool", ["avg", "map"])
def test_models_without_class_token_read_the_pooled_tokens(pool):
    model = make_vit(class_token=False, global_pool=pool)
    images = images_like(2)
    assert explain(model, images, "conservative_lrp").shape == (2, 4, 4)
    assert explain(model, images, "lrp").shape == (2, 32, 32)
    for method in ("transformer_attribution", "partial_lrp"):
        maps = explain(model, images, method)
        assert maps.shape == (2, 4, 4) and maps.isfinite().all() and maps.abs().sum() > 0


def test_clear_errors(tiny):
    images = images_like(2)
    with pytest.raises(ValueError, match="unknown LRP rule set"):
        relevance(tiny, images, None, "zplus")
    for method in ("lrp", "partial_lrp"):
        with pytest.raises(ValueError, match="option linear_rule of method .* must be one of 'shared', 'separate'"):
            explain(tiny, images, method, linear_rule="split")
    with pytest.raises(ValueError, match="start_layer"):
        explain(tiny, images, "transformer_attribution", start_layer=3)
    with pytest.raises(UnsupportedModelError, match="its attention has a gate"):
        relevance(make_vit(attn_layer=GatedAttention), images)


def test_a_backward_after_the_rules_are_removed_is_refused():
    """Each block is computed again in the backward under the rules placed (docs/decisions/performance.md): a backward
    taken after ``lrp_rules`` has exited would compute it without the module rules, so it is refused, naming why."""
    adapter = adapter_for(make_vit(depth=2))
    with lrp.lrp_rules(adapter, "chefer"):
        logits = adapter.forward(images_like())
        inside = torch.autograd.grad(logits[:, 0].sum(), adapter.model.cls_token, retain_graph=True)[0]
    assert inside.abs().sum() > 0
    with pytest.raises(RuntimeError, match=r"within lrp_rules\(\)"):
        torch.autograd.grad(logits[:, 0].sum(), adapter.model.cls_token)
