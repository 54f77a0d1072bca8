"""absLRP (Vukadin et al., ACM TIST 2024): the "abslrp" rule set of instrumentation.lrp and the abs_lrp method."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

from vitexplain import explain
from vitexplain.instrumentation import adapter_for, lrp
from vitexplain.instrumentation.lrp import RULE_SETS, other_classes

from conftest import make_vit
from test_lrp import randomise_biases

OTHERS = dataclasses.replace(RULE_SETS["abslrp"], start=other_classes)

def relevance(model, *args, **kwargs):
    """The LRP relevance of ``model`` (relevance takes an adapter)."""
    return lrp.relevance(adapter_for(model), *args, **kwargs)



def images_like(batch: int = 2, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def randomise_affines(model: torch.nn.Module, seed: int = 5) -> torch.nn.Module:
    """Non-zero biases, LayerNorm weights and LayerScale factors of both signs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith("gamma") or "norm" in name and name.endswith("weight"):
                p.copy_(0.5 + torch.randn(p.shape, generator=g))
    return model


@pytest.fixture
def unstabilised(monkeypatch):
    """The written-out rules divide exactly; take the 1e-9 stabiliser out of the comparison."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)


# -- an independent, written-out absLRP, layer by layer in the order of the authors' explain ------
def normalise(r):
    """Σ|R| = 1 per image."""
    return r / r.abs().flatten(1).sum(1).reshape(-1, *[1] * (r.ndim - 1))


def linear_rule(x, weight, bias, r):
    """R_i = Σ_j (x_i w_ji + |x_i w_ji|) / |y_j| R_j over the explicit contributions z_ji = x_i w_ji."""
    y = x @ weight.T + bias
    z = x[..., None, :] * weight
    return normalise(((z + z.abs()) * (r / y.abs())[..., None]).sum(-2))


def layer_norm_rule(x, norm, r):
    """Mean and std held constant; the absolute version standardises |x| by its own std and uses |w|."""
    std = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    abs_std = (x.abs().var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    y = (x - x.mean(-1, keepdim=True)) / std * norm.weight + norm.bias
    return normalise((x * norm.weight / std + x.abs() * norm.weight.abs() / abs_std) * r / y.abs())


def gelu_rule(h, r):
    """R_h = (h gelu'(h) + |h| gelu'(|h|)) / |gelu(h)| R, gelu'(t) = Φ(t) + t φ(t)."""
    def derivative(t):
        return 0.5 * (1 + torch.erf(t / math.sqrt(2))) + t * torch.exp(-t ** 2 / 2) / math.sqrt(2 * math.pi)

    gelu = h * 0.5 * (1 + torch.erf(h / math.sqrt(2)))
    return normalise((h * derivative(h) + h.abs() * derivative(h.abs())) * r / gelu.abs())


def pass_rule(x, r):
    """An identity layer (eval-mode dropout, class-token pooling): (x + |x|) / |x| R."""
    return normalise((x + x.abs()) * r / x.abs())


def layer_scale_rule(layer_scale, x, r):
    """LayerScale x γ like a diagonal Linear: (xγ + |xγ|) / |xγ| R; timm's Identity (no LayerScale) passes R."""
    if not hasattr(layer_scale, "gamma"):
        return r
    z = x * layer_scale.gamma
    return normalise((z + z.abs()) * r / z.abs())


def add_rule(a, b, r):
    total = (a + b).abs()
    return normalise((a + a.abs()) * r / total), normalise((b + b.abs()) * r / total)


def product_rule(left, right, r):
    """out[n, d] = Σ_m left[n, m] right[m, d]; contributions z_nmd = left[n, m] right[m, d]."""
    out = left @ right
    z = left[..., :, :, None] * right[..., None, :, :]
    share = (z + z.abs()) * (r / out.abs())[..., :, None, :]
    return normalise(share.sum(-1)), normalise(share.sum(-3))


def softmax_rule(scores, r):
    probs = scores.softmax(-1)
    return normalise((scores * probs + scores.abs() * scores.abs().softmax(-1)) * r / probs)


def written_out_abslrp(model, images, start):
    """Forward from the weights, then absLRP from ``start`` [B, classes] down to the pixels."""
    batch, conv = images.shape[0], model.patch_embed.proj
    size = conv.kernel_size
    columns = F.unfold(images, size, stride=size).transpose(1, 2)  # [B, L, 3*p*p]
    conv_weight = conv.weight.reshape(conv.weight.shape[0], -1)
    patches = columns @ conv_weight.T + conv.bias
    content = torch.cat([model.cls_token.expand(batch, -1, -1), patches], 1)
    x = content + model.pos_embed
    acts = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        heads, width = attn.num_heads, attn.head_dim
        n, c = x.shape[1], x.shape[2]
        a = dict(x=x, n1=F.layer_norm(x, (c,), block.norm1.weight, block.norm1.bias, block.norm1.eps))
        qkv = a["n1"] @ attn.qkv.weight.T + attn.qkv.bias
        q, k, v = qkv.reshape(batch, n, 3, heads, width).permute(2, 0, 3, 1, 4)
        a.update(q=q * width ** -0.5, k=k, v=v)
        a["scores"] = a["q"] @ k.transpose(-1, -2)
        a["probs"] = a["scores"].softmax(-1)
        a["merged"] = (a["probs"] @ v).transpose(1, 2).reshape(batch, n, c)
        a["projected"] = a["merged"] @ attn.proj.weight.T + attn.proj.bias
        a["branch1"] = block.ls1(a["projected"])
        a["x1"] = x + a["branch1"]
        a["n2"] = F.layer_norm(a["x1"], (c,), block.norm2.weight, block.norm2.bias, block.norm2.eps)
        a["hidden"] = a["n2"] @ mlp.fc1.weight.T + mlp.fc1.bias
        a["gelu"] = F.gelu(a["hidden"])
        a["mlp_out"] = a["gelu"] @ mlp.fc2.weight.T + mlp.fc2.bias
        a["branch2"] = block.ls2(a["mlp_out"])
        acts.append(a)
        x = a["x1"] + a["branch2"]
    pooled = F.layer_norm(x, (x.shape[-1],), model.norm.weight, model.norm.bias, model.norm.eps)[:, 0]

    r = linear_rule(pooled, model.head.weight, model.head.bias, start)  # head
    r = pass_rule(pooled, r)  # head_drop
    r_tokens = torch.zeros_like(x)
    r_tokens[:, 0] = pass_rule(pooled, r)  # class-token pooling
    r = layer_norm_rule(x, model.norm, normalise(r_tokens))
    residuals, attn_rel = [r], []
    for block, a in reversed(list(zip(model.blocks, acts))):
        attn, mlp = block.attn, block.mlp
        r_branch, r_shortcut = add_rule(a["branch2"], a["x1"], r)
        r = layer_scale_rule(block.ls2, a["mlp_out"], r_branch)
        r = pass_rule(a["mlp_out"], r)  # drop2
        r = linear_rule(a["gelu"], mlp.fc2.weight, mlp.fc2.bias, r)
        r = pass_rule(a["gelu"], r)  # drop1
        r = gelu_rule(a["hidden"], r)
        r = linear_rule(a["n2"], mlp.fc1.weight, mlp.fc1.bias, r)
        r = layer_norm_rule(a["x1"], block.norm2, r) + r_shortcut
        r_branch, r_shortcut = add_rule(a["branch1"], a["x"], r)
        r = layer_scale_rule(block.ls1, a["projected"], r_branch)
        r = pass_rule(a["projected"], r)  # proj_drop
        r = linear_rule(a["merged"], attn.proj.weight, attn.proj.bias, r)
        r_mixed = r.reshape(batch, -1, attn.num_heads, attn.head_dim).transpose(1, 2)
        r_probs, r_v = product_rule(a["probs"], a["v"], r_mixed)
        attn_rel.insert(0, r_probs)
        r_scores = softmax_rule(a["scores"], pass_rule(a["probs"], r_probs))  # attn_drop, softmax
        r_q, r_kt = product_rule(a["q"], a["k"].transpose(-1, -2), r_scores)
        r_qkv = torch.stack([r_q, r_kt.transpose(-1, -2), r_v]).permute(1, 3, 0, 2, 4).flatten(2)
        r = linear_rule(a["n1"], attn.qkv.weight, attn.qkv.bias, r_qkv)
        r = layer_norm_rule(a["x"], block.norm1, r) + r_shortcut
        residuals.insert(0, r)
    r_patches = normalise((content + content.abs()) * r / (content + model.pos_embed).abs())[:, 1:]
    z = columns[:, :, None] * conv_weight  # [B, L, C, 3*p*p]
    r_columns = ((z + z.abs()) * (r_patches / patches.abs())[..., None]).sum(2)
    pixels = normalise(F.fold(r_columns.transpose(1, 2), images.shape[-2:], size, stride=size))
    return dict(attn=attn_rel, residuals=residuals, patches=r_patches, pixels=pixels)


def starts(targets, classes=10):
    one_hot = F.one_hot(targets, classes).double()
    return one_hot, (1 - one_hot) / (classes - 1)


@pytest.mark.parametrize("layer_scale", [False, True])
def test_rules_match_a_written_out_abslrp(layer_scale, unstabilised):
    overrides = dict(init_values=0.5) if layer_scale else {}
    model = randomise_affines(make_vit(seed=3, depth=2, **overrides)).double()
    images, targets = images_like(dtype=torch.float64), torch.tensor([2, 7])
    for start, rules in zip(starts(targets), ("abslrp", OTHERS)):
        expected = written_out_abslrp(model, images, start)
        found = relevance(model, images, targets, rules)
        for got, want in zip(found.attn, expected["attn"]):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-13)
        for got, want in zip(found.residuals, expected["residuals"]):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(normalise(found.patches), normalise(expected["patches"]), rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(found.pixels, expected["pixels"], rtol=1e-9, atol=1e-13)


def test_method_is_the_channel_sum_of_target_minus_others(unstabilised):
    model = randomise_affines(make_vit(seed=4, depth=2)).double()
    images, targets = images_like(dtype=torch.float64), torch.tensor([1, 4])
    target_start, others_start = starts(targets)
    target = written_out_abslrp(model, images, target_start)["pixels"]
    others = written_out_abslrp(model, images, others_start)["pixels"]
    torch.testing.assert_close(explain(model, images, "abs_lrp", targets), (target - others).sum(1).float())
    torch.testing.assert_close(explain(model, images, "abs_lrp", targets, contrastive=False), target.sum(1).float())


# -- properties ---------------------------------------------------------------------------------
@pytest.mark.parametrize("rules", ["abslrp", OTHERS])
def test_relevance_is_rescaled_to_unit_magnitude_at_every_layer(rules):
    """The "relative" step: Σ|R| = 1 per image at the pixels, every attention map and the top of the stream."""
    model = randomise_affines(make_vit(depth=3)).double()
    found = relevance(model, images_like(3, dtype=torch.float64), None, rules)
    ones = torch.ones(3, dtype=torch.float64)
    torch.testing.assert_close(found.pixels.abs().sum((1, 2, 3)), ones)
    torch.testing.assert_close(found.residuals[-1].abs().sum((1, 2)), ones)
    for rel in found.attn:
        torch.testing.assert_close(rel.abs().sum((1, 2, 3)), ones)


def test_negative_target_logit_still_gets_positive_relevance():
    """Shares are divided by |y|, not y: a class with a negative logit is explained by its positive contributions."""
    model = randomise_affines(make_vit(seed=6)).double()
    images = images_like(4, dtype=torch.float64)
    targets = model(images).argmin(1)
    found = relevance(model, images, targets, "abslrp")
    assert (found.logits.gather(1, targets[:, None]) < 0).all()
    top = found.residuals[-1]
    assert (top >= 0).all() and (top[:, 1:] == 0).all()  # only the class token is pooled
    torch.testing.assert_close(top.abs().sum((1, 2)), torch.ones(4, dtype=torch.float64))


def test_map_does_not_depend_on_the_magnitude_of_the_target_logit():
    model = randomise_affines(make_vit(seed=7)).double()
    images, targets = images_like(2, dtype=torch.float64), torch.tensor([3, 3])
    before = explain(model, images, "abs_lrp", targets)
    with torch.no_grad():
        model.head.weight[3] *= 5
        model.head.bias[3] *= 5
    torch.testing.assert_close(explain(model, images, "abs_lrp", targets), before, rtol=1e-6, atol=1e-12)
    with torch.no_grad():
        model.head.weight[3] *= -1
        model.head.bias[3] *= -1
    assert not torch.allclose(explain(model, images, "abs_lrp", targets), before, rtol=1e-3, atol=1e-9)


# -- the method ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return make_vit(seed=2)


def test_batch_of_four_equals_one_at_a_time(tiny):
    images, targets = images_like(4), torch.tensor([0, 3, 5, 9])
    together = explain(tiny, images, "abs_lrp", targets)
    alone = torch.cat([explain(tiny, images[i:i + 1], "abs_lrp", targets[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-8)
    assert together.shape == (4, 32, 32) and together.isfinite().all()


def test_maps_depend_on_the_target_class(tiny):
    images = images_like(2)
    first, second = explain(tiny, images, "abs_lrp", 0), explain(tiny, images, "abs_lrp", 1)
    assert not torch.allclose(first, second, rtol=1e-3, atol=1e-8)


@pytest.mark.parametrize("family", [dict(distilled=True), dict(reg_tokens=2), dict(dynamic_img_size=True)])
def test_works_on_other_families(family):
    maps = explain(make_vit(**family), images_like(2), "abs_lrp")
    assert maps.shape == (2, 32, 32) and maps.isfinite().all() and maps.abs().sum() > 0


def model_state(model):
    return [(m, dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks),
             m.__dict__.get("forward"), m.training) for m in model.modules()]


def test_model_is_restored_after_use_and_after_an_exception():
    model = make_vit(init_values=0.5).train()
    images = images_like()
    before, state = model.eval()(images).detach(), model_state(model.train())
    explain(model, images, "abs_lrp")
    assert model_state(model) == state

    def fail(module, args, output):
        raise RuntimeError("injected")

    handle = model.blocks[1].mlp.fc2.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="injected"):
        explain(model, images, "abs_lrp")
    handle.remove()
    assert model_state(model) == state
    assert torch.equal(model.eval()(images), before)


def test_clear_errors(tiny):
    images = images_like(2)
    with pytest.raises(TypeError, match="option contrastive of method .* must be True or False"):
        explain(tiny, images, "abs_lrp", contrastive="yes")
    with pytest.raises(TypeError, match="has no option 'rules'"):
        explain(tiny, images, "abs_lrp", rules="chefer")
    with pytest.raises(ValueError, match="at least two classes"):
        relevance(make_vit(num_classes=1), images, None, OTHERS)
    pooled = explain(make_vit(class_token=False, global_pool="map"), images, "abs_lrp")  # through the pooling head
    assert pooled.shape == (2, 32, 32) and pooled.isfinite().all() and pooled.abs().sum() > 0


def _square_tensors_saved(model, rules: str, recompute: bool = True) -> tuple[int, int, int]:
    """Token-by-token tensors autograd saves under ``rules``: those a forward leaves alive for the backward, those
    saved while relevance is propagated (forward and backward), and the most alive at once."""
    tokens = 1 + model.patch_embed.num_patches  # the class token and the patches
    saved: list[StorageWeakRef] = []
    most = 0

    def pack(tensor):
        nonlocal most
        if tensor.shape[-2:] == (tokens, tokens):
            saved.append(StorageWeakRef(tensor.untyped_storage()))
            most = max(most, sum(not reference.expired() for reference in saved))
        return tensor.detach()  # the tensor itself would tie an output to its own node, which is then never freed

    adapter = adapter_for(model)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with lrp.lrp_rules(adapter, rules, recompute=recompute):
            logits = adapter.forward(images_like())
            kept = sum(not reference.expired() for reference in saved)
        del logits
        before = len(saved)
        relevance(model, images_like(), None, rules, at=("pixels",), recompute=recompute)
    return kept, len(saved) - before, most


@pytest.mark.parametrize("rules", ["abslrp", "chefer"])
def test_no_block_keeps_its_attention_maps_for_the_whole_backward(rules):
    """Memory that does not grow with tokens × blocks (docs/decisions/performance.md): the forward leaves no
    token-by-token tensor for the backward, which computes each block again and holds one block's at a time —
    as many at once with four blocks as with two (before: two per block, all until the backward's end)."""
    two, four = (_square_tensors_saved(make_vit(depth=depth), rules) for depth in (2, 4))
    assert two[0] == four[0] == 0
    assert four[1] == 2 * two[1] > 0  # every block saves them (what the check would catch)
    assert four[2] == two[2] <= two[1] // 2  # at most one block's (its forward's and its backward's), not both


@pytest.mark.parametrize("method, options", [("abs_lrp", {}), ("lrp", {}), ("attnlrp", {}), ("cp_lrp", {}),
                                             ("conservative_lrp", {}), ("attnlrp", {"at": "patches"})])
def test_recompute_switches_memory_for_time_and_keeps_the_maps(method, options):
    """``recompute=False`` keeps every block's graph from the forward (its attention maps alive until the backward)
    instead of computing each block again: the same operations, so the same maps (float64, bitwise)."""
    model = randomise_biases(make_vit(depth=2)).double()
    x = images_like(dtype=torch.float64)
    kept = explain(model, x, method, recompute=False, **options)
    again = explain(model, x, method, recompute=True, **options)
    assert torch.equal(kept, again) and kept.abs().sum() > 0
    assert _square_tensors_saved(make_vit(depth=2), "chefer", recompute=False)[0] > 0
