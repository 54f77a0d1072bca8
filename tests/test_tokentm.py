"""TokenTM (Wu et al., CVPR 2024) against a plain re-computation from a hand-written forward pass."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vitexplain import explain

from conftest import FAMILIES, make_vit

TARGETS = torch.tensor([0, 3, 5, 7])


def manual_forward(model, images):
    """A timm ViT's forward written out from its weights: logits and, per block, its tensors.

    Nothing here goes through vitexplain; q (before the 1/sqrt(D) scale) and the attention
    probabilities stay in the autograd graph so tests can differentiate with respect to them.
    """
    x = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    blocks = []
    for block in model.blocks:
        attn = block.attn
        normed = block.norm1(x)
        qkv = F.linear(normed, attn.qkv.weight, attn.qkv.bias).unflatten(-1, (3, attn.num_heads, attn.head_dim))
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        probs = ((q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)).softmax(-1)
        branch = block.ls1(attn.proj((probs @ v).transpose(1, 2).flatten(2)))
        middle = x + branch
        mlp_normed = block.norm2(middle)
        mlp_branch = block.ls2(block.mlp(mlp_normed))
        blocks.append(dict(residual=x, normed=normed, q=q, k=k, v=v, attn=probs, middle=middle,
                           mlp_normed=mlp_normed, mlp_branch=mlp_branch))
        x = middle + mlp_branch
    return model.forward_head(model.norm(x)), blocks


def target_score(logits, targets, score):
    values = logits.softmax(-1) if score == "probability" else logits
    return values[torch.arange(len(targets)), targets].sum()


def double_model(family):
    return make_vit(**FAMILIES[family]).double()


def images_like(model, batch=4):
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, 32, 32, generator=g).to(next(model.parameters()).dtype)


def transform_weights(originals, transformed, use_length, use_necc):
    """W's diagonal from lists of original and transformed token vectors (Eq. 11-13), token by token."""
    cosines = [torch.dot(e, t) / (e.norm() * t.norm()) for e, t in zip(originals, transformed)]
    total = sum(math.exp(c) for c in cosines)
    weights = []
    for e, t, c in zip(originals, transformed, cosines):
        w = 1.0
        if use_length:
            w *= float(t.norm() / e.norm())
        if use_necc:
            w *= math.exp(c) / total
        weights.append(w)
    return torch.tensor(weights, dtype=originals[0].dtype)


def reference_tokentm(model, images, targets, *, use_length=True, use_necc=True, aggregate=True, end_layer=None,
                      reference="residual", per_head=True, score="probability"):
    logits, blocks = manual_forward(model, images)
    attn_grads = torch.autograd.grad(target_score(logits, targets, score), [b["attn"] for b in blocks])
    with torch.no_grad():
        return tokentm_maps(model, images, blocks, attn_grads, use_length, use_necc, aggregate, end_layer, reference,
                            per_head)


def tokentm_maps(model, images, blocks, attn_grads, use_length, use_necc, aggregate, end_layer, reference, per_head):
    prefix, cls = model.num_prefix_tokens, 0
    maps = []
    for i in range(images.shape[0]):
        n = blocks[0]["residual"].shape[1]
        eye = torch.eye(n, dtype=images.dtype)
        initial = blocks[0]["residual"][i]
        contribution = torch.diag(torch.stack([initial[j].norm() for j in range(n)])) if use_length else eye
        used = blocks[:1] if not aggregate else blocks if end_layer is None else blocks[:end_layer % len(blocks) + 1]
        for index, (block, module) in enumerate(zip(used, model.blocks)):
            attn = module.attn
            heads, dim = attn.num_heads, attn.head_dim
            gamma = module.ls1.gamma if hasattr(module.ls1, "gamma") else torch.ones(1, dtype=images.dtype)
            originals = block["normed" if reference == "normalised" else "residual"][i]
            output_projection = [attn.proj.weight[:, h * dim:(h + 1) * dim] for h in range(heads)]  # W^H_h
            per_head_tokens = [[gamma * (output_projection[h] @ block["v"][i, h, j]) for j in range(n)]
                               for h in range(heads)]
            if per_head:
                head_weights = [transform_weights(list(originals), per_head_tokens[h], use_length, use_necc)
                                for h in range(heads)]
            else:
                summed = [sum(per_head_tokens[h][j] for h in range(heads)) for j in range(n)]
                head_weights = [transform_weights(list(originals), summed, use_length, use_necc)] * heads
            update = eye.clone()
            for h in range(heads):
                transformed_attention = block["attn"][i, h] @ torch.diag(head_weights[h])  # T_h = A_h W_h
                update = update + attn_grads[index][i, h].clamp(min=0) * transformed_attention / heads
            if not aggregate:  # Eq. (8) / (14) of the first MHSA alone
                contribution = update
                break
            contribution = update @ contribution
            mlp_originals = block["mlp_normed" if reference == "normalised" else "middle"][i]
            mlp_weights = transform_weights(list(mlp_originals), list(block["mlp_branch"][i]), use_length, use_necc)
            contribution = (eye + eye @ torch.diag(mlp_weights)) @ contribution
        maps.append(contribution[cls, prefix:].reshape(4, 4))
    return torch.stack(maps)


def assert_close_maps(actual, expected):
    assert expected.abs().max() > 0
    torch.testing.assert_close(actual, expected, rtol=1e-7, atol=1e-9 * expected.abs().max().item())


def assert_maps_differ(first, second):
    """The maps differ by more than a positive factor per image."""
    normalise = lambda m: m / m.abs().flatten(1).amax(1).clamp_min(1e-12)[:, None, None]  # noqa: E731
    assert (normalise(first) - normalise(second)).abs().amax() > 1e-3


def test_manual_forward_reproduces_the_model():
    for family in FAMILIES:
        model = double_model(family)
        images = images_like(model)
        assert torch.allclose(manual_forward(model, images)[0], model(images), atol=1e-10)


ABLATIONS = [
    {},
    {"use_necc": False},                                      # + AF + L
    {"use_length": False, "use_necc": False},                 # + AF
    {"use_length": False},
    {"use_length": False, "use_necc": False, "aggregate": False},  # Baseline
    {"aggregate": False},
    {"end_layer": 0},
    {"end_layer": -2},
    {"reference": "normalised"},
    {"per_head": False},
    {"score": "logit"},
]


@pytest.mark.parametrize("options", ABLATIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_equations_match_plain_computation(options):
    model = double_model("layerscale_qkvbias")
    images = images_like(model)
    maps = explain(model, images, "tokentm", TARGETS, **options).double()
    assert_close_maps(maps, reference_tokentm(model, images, TARGETS, **options))


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "registers"])
def test_prefix_token_families_match_plain_computation(family):
    model = double_model(family)
    images = images_like(model, batch=2)
    maps = explain(model, images, "tokentm", TARGETS[:2]).double()
    assert_close_maps(maps, reference_tokentm(model, images, TARGETS[:2]))


@pytest.mark.parametrize("options", ABLATIONS[1:], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_every_switch_changes_the_map(options):
    model = make_vit(**FAMILIES["layerscale_qkvbias"])
    images = images_like(model)
    default = explain(model, images, "tokentm", TARGETS)
    assert_maps_differ(default, explain(model, images, "tokentm", TARGETS, **options))


def test_every_block_is_the_default():
    model = make_vit()
    images = images_like(model)
    assert torch.equal(explain(model, images, "tokentm", end_layer=2), explain(model, images, "tokentm"))


def test_different_targets_give_different_maps():
    model = make_vit()
    images = images_like(model)
    assert_maps_differ(explain(model, images, "tokentm", 1), explain(model, images, "tokentm", 6))


def test_batch_equals_one_image_at_a_time():
    model = make_vit(**FAMILIES["registers"])
    images = images_like(model)
    together = explain(model, images, "tokentm", TARGETS)
    alone = torch.cat([explain(model, images[i:i + 1], "tokentm", TARGETS[i:i + 1]) for i in range(4)])
    assert torch.allclose(together, alone, rtol=1e-5, atol=1e-7 * together.abs().max())


@pytest.mark.parametrize("options, message", [
    ({"reference": "output"}, "option reference of method .* must be one of"),
    ({"score": "log_odds"}, "option score of method .* must be one of"),
    ({"end_layer": 1.5}, "option end_layer of method .* must be"),
    ({"end_layer": 3}, "end_layer must index"),
    ({"end_layer": -4}, "end_layer must index"),
    ({"end_layer": 1, "aggregate": False}, "needs aggregate=True"),
])
def test_bad_options_are_refused(options, message):
    model = make_vit()
    with pytest.raises(ValueError, match=message):
        explain(model, images_like(model, 1), "tokentm", **options)


def test_model_without_class_token_reads_the_pooled_tokens():
    model = make_vit(class_token=False, global_pool="avg")
    maps = explain(model, images_like(model, 2), "tokentm")
    assert maps.shape == (2, 4, 4) and maps.isfinite().all() and maps.abs().sum() > 0
