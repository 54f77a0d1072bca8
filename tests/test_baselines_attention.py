"""attcat, agcam, tam, bt_token, bt_head and gradcam against written-out, one-image-at-a-time computations.

The references below never touch vitexplain: they run their own forward of the timm model (one head
at a time, every intermediate kept in the autograd graph) and take gradients with torch.autograd.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

import vitexplain

from conftest import FAMILIES, make_vit

METHODS = ("attcat", "agcam", "tam", "bt_token", "bt_head", "gradcam")
TARGETS = torch.tensor([3, 7, 1, 0])
STEPS = 5  # integration steps in the reference checks (the methods default to the authors' 20)


# -- an independent forward ------------------------------------------------------------------------
def manual_forward(model, image, detach_attention_input=False):
    """Logits [1, classes] and, per block, the tensors the methods read, all in the autograd graph.

    Attention is computed head by head: ``scores[h]`` = q_h k_h^T / sqrt(D), ``attn[h]`` its softmax.
    With ``detach_attention_input`` each attention sublayer reads a detached copy of its input.
    """
    x = model.norm_pre(model._pos_embed(model.patch_embed(image)))
    blocks = []
    for block in model.blocks:
        attn = block.attn
        heads, dim, width = attn.num_heads, attn.head_dim, x.shape[-1]
        normed = block.norm1(x)
        qkv = attn.qkv(normed.detach() if detach_attention_input else normed)[0]  # [N, 3C]
        scores, probs, values, mixed = [], [], [], []
        for h in range(heads):
            q = qkv[:, h * dim:(h + 1) * dim]
            k = qkv[:, width + h * dim:width + (h + 1) * dim]
            v = qkv[:, 2 * width + h * dim:2 * width + (h + 1) * dim]
            s = q @ k.T / dim ** 0.5
            p = torch.softmax(s, dim=-1)
            scores.append(s)
            probs.append(p)
            values.append(v)
            mixed.append(p @ v)
        entry = {"input": x, "normed": normed, "scores": scores, "attn": probs, "v": torch.cat(values, -1)}
        x = x + block.ls1(attn.proj(torch.cat(mixed, -1))[None])
        x = x + block.ls2(block.mlp(block.norm2(x)))
        entry["output"] = x
        blocks.append(entry)
    return model.forward_head(model.norm(x)), blocks


def mean_heads(maps):
    return sum(maps) / len(maps)


def to_grid(model, row):
    prefix = model.num_prefix_tokens
    side = int((row.shape[0] - prefix) ** 0.5)
    return row[prefix:].reshape(side, side)


def integrated_weights(model, image, target, steps):
    """mean_h of the positive mean over a in linspace(0, 1, steps) of d logit / d A_last,h at a * image  [N, N]."""
    total = None
    for alpha in np.linspace(0, 1, steps):
        logits, blocks = manual_forward(model, image * float(alpha))
        grads = torch.autograd.grad(logits[0, target], blocks[-1]["attn"])
        grad = torch.stack(grads)
        total = grad if total is None else total + grad
    return (total / steps).clamp(min=0).mean(0)


# -- the methods, written out ----------------------------------------------------------------------
def attcat_reference(model, image, target, attention_row="mean", tokens="input"):
    logits, blocks = manual_forward(model, image)
    features = [block[{"attn_input": "normed"}.get(tokens, tokens)] for block in blocks]
    grads = torch.autograd.grad(logits[0, target], features)
    total = 0
    for block, feature, grad in zip(blocks, features, grads):
        cat = (grad[0] * feature[0]).sum(-1)
        attention = mean_heads(block["attn"])
        weight = attention.mean(0) if attention_row == "mean" else attention[0]
        total = total + weight * cat
    return to_grid(model, total)


def agcam_reference(model, image, target, gradient_of="attn", head_fusion="sum", layer_fusion="sum",
                    detach_attention_input=True):
    logits, blocks = manual_forward(model, image, detach_attention_input)
    key = {"attn": "attn", "attn_logits": "scores"}[gradient_of]
    wrt = [m for block in blocks for m in block[key]]
    grads = iter(torch.autograd.grad(logits[0, target], wrt))
    per_block = []
    for block in blocks:
        per_head = [next(grads)[0].clamp(min=0) * torch.sigmoid(s[0]) for s in block["scores"]]
        stacked = torch.stack(per_head)
        per_block.append(stacked.sum(0) if head_fusion == "sum" else stacked.amax(0))
    stacked = torch.stack(per_block)
    return to_grid(model, stacked.sum(0) if layer_fusion == "sum" else stacked.amax(0))


def tam_reference(model, image, target, start_layer, n_steps, integrated=True):
    logits, blocks = manual_forward(model, image)
    state = mean_heads(blocks[-1]["attn"])[0]
    eye = torch.eye(state.shape[0])
    for layer in range(len(blocks) - 2, start_layer - 1, -1):
        state = state @ (mean_heads(blocks[layer]["attn"]) + eye)
    if integrated:
        weights = integrated_weights(model, image, target, n_steps)[0]
    else:
        grads = torch.autograd.grad(logits[0, target], blocks[-1]["attn"])
        weights = torch.stack(grads)[:, 0].clamp(min=0).mean(0)
    return to_grid(model, state * weights)


def bt_head_reference(model, image, target, start_layer, n_steps):
    logits, blocks = manual_forward(model, image)
    grads = torch.autograd.grad(logits[0, target], [p for block in blocks for p in block["attn"]])
    heads = len(blocks[0]["attn"])
    n = blocks[0]["attn"][0].shape[0]
    relevance = torch.eye(n)
    for layer in range(start_layer, len(blocks)):
        attn = blocks[layer]["attn"]
        importance = torch.stack([(attn[h].T @ grads[layer * heads + h]).abs().mean() for h in range(heads)])
        importance = importance / importance.sum()
        fused = sum(importance[h] * attn[h] for h in range(heads))
        relevance = relevance + fused @ relevance
    weights = integrated_weights(model, image, target, n_steps)
    return to_grid(model, (weights * relevance)[0])


def bt_token_reference(model, image, target, start_layer, n_steps):
    _, blocks = manual_forward(model, image)
    n = blocks[0]["attn"][0].shape[0]
    relevance = torch.eye(n)
    for layer in range(start_layer, len(blocks)):
        block, module = blocks[layer], model.blocks[layer]
        projected = module.ls1(block["v"] @ module.attn.proj.weight.T)  # values through W_O, no bias
        ratio = torch.stack([projected[j].norm() / block["input"][0, j].norm() for j in range(n)])
        scaled = mean_heads(block["attn"]) @ torch.diag(ratio)
        relevance = relevance + scaled @ relevance
    weights = integrated_weights(model, image, target, n_steps)
    return to_grid(model, (weights * relevance.abs())[0])


def gradcam_reference(model, image, target, layer=-1):
    logits, blocks = manual_forward(model, image)
    normed = blocks[layer]["normed"]
    grad = torch.autograd.grad(logits[0, target], normed)[0][0]
    prefix = model.num_prefix_tokens
    features, grad = normed[0, prefix:], grad[prefix:]
    weights = grad.mean(0)
    cam = torch.stack([(features[j] * weights).sum() for j in range(features.shape[0])]).clamp(min=0)
    side = int(features.shape[0] ** 0.5)
    return cam.reshape(side, side)


REFERENCES = {
    "attcat": (attcat_reference, [{}, {"attention_row": "class"}, {"tokens": "output"},
                                  {"attention_row": "class", "tokens": "output"}, {"tokens": "attn_input"}]),
    "agcam": (agcam_reference, [{}, {"gradient_of": "attn_logits"}, {"head_fusion": "max", "layer_fusion": "max"},
                                {"detach_attention_input": False}]),
    "tam": (tam_reference, [{"start_layer": 1, "n_steps": STEPS}, {"start_layer": 0, "n_steps": STEPS},
                            {"start_layer": 2, "n_steps": STEPS, "integrated": False}]),
    "bt_head": (bt_head_reference, [{"start_layer": 0, "n_steps": STEPS}, {"start_layer": 1, "n_steps": STEPS}]),
    "bt_token": (bt_token_reference, [{"start_layer": 0, "n_steps": STEPS}, {"start_layer": 2, "n_steps": STEPS}]),
    "gradcam": (gradcam_reference, [{}, {"layer": 0}]),
}
CASES = [(method, options) for method, (_, variants) in REFERENCES.items() for options in variants]
CASE_IDS = [f"{method}-{'-'.join(map(str, options.values())) or 'default'}" for method, options in CASES]


def one_at_a_time(reference, model, images, **options):
    return torch.stack([reference(model, images[i:i + 1], int(TARGETS[i]), **options) for i in range(len(images))])


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "layerscale_qkvbias"])
@pytest.mark.parametrize("method,options", CASES, ids=CASE_IDS)
def test_matches_written_out_computation(method, options, family, images):
    model = make_vit(**FAMILIES[family])
    maps = vitexplain.explain(model, images, method, TARGETS, **options)
    expected = one_at_a_time(REFERENCES[method][0], model, images, **options)
    assert maps.shape == expected.shape
    torch.testing.assert_close(maps, expected.detach(), rtol=1e-4, atol=1e-6)


# -- batching, class specificity, families ---------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_batch_of_four_equals_one_at_a_time(method, tiny_vit, images):
    batched = vitexplain.explain(tiny_vit, images, method, TARGETS)
    single = torch.cat([vitexplain.explain(tiny_vit, images[i:i + 1], method, TARGETS[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_maps_depend_on_the_target_class(method, tiny_vit, images):
    first = vitexplain.explain(tiny_vit, images, method, 2)
    second = vitexplain.explain(tiny_vit, images, method, 5)
    differs = (first - second).flatten(1).abs().amax(1) > 1e-6 * first.flatten(1).abs().amax(1)
    assert differs.all()


def test_integration_batch_size_only_bounds_memory(tiny_vit, images):
    for method in ("tam", "bt_head", "bt_token"):
        whole = vitexplain.explain(tiny_vit, images, method, TARGETS, n_steps=6, batch_size=1000)
        pieces = vitexplain.explain(tiny_vit, images, method, TARGETS, n_steps=6, batch_size=5)
        torch.testing.assert_close(whole, pieces, rtol=1e-5, atol=1e-7)


def test_default_start_layers_are_the_authors_on_a_twelve_block_vit(images):
    model = make_vit(depth=12)
    for method, authors in (("tam", 4), ("bt_head", 3), ("bt_token", 6)):
        default = vitexplain.explain(model, images[:2], method, n_steps=3)
        explicit = vitexplain.explain(model, images[:2], method, start_layer=authors, n_steps=3)
        other = vitexplain.explain(model, images[:2], method, start_layer=authors + 1, n_steps=3)
        torch.testing.assert_close(default, explicit)
        assert not torch.allclose(default, other)


def test_models_without_class_token(images):
    model = make_vit(class_token=False, global_pool="avg")
    for method, options in (("agcam", {}), ("tam", {}), ("bt_token", {}), ("bt_head", {}),
                            ("attcat", {"attention_row": "class"})):  # read through the pooled readout
        maps = vitexplain.explain(model, images, method, **options)
        assert maps.shape == (4, 4, 4) and maps.isfinite().all()
    for method in ("gradcam", "attcat"):
        maps = vitexplain.explain(model, images, method, TARGETS)
        expected = one_at_a_time(gradcam_reference if method == "gradcam" else attcat_reference, model, images)
        torch.testing.assert_close(maps, expected.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method,options,message", [
    ("attcat", {"attention_row": "cls"}, "attention_row"),
    ("attcat", {"tokens": "hidden"}, "tokens"),
    ("agcam", {"head_fusion": "prod"}, "head_fusion"),
    ("agcam", {"layer_fusion": "median"}, "layer_fusion"),
    ("agcam", {"gradient_of": "q"}, "gradient_of"),
    ("tam", {"n_steps": 1}, "n_steps"),
    ("tam", {"n_steps": 2.5}, "n_steps"),
    ("tam", {"batch_size": 0}, "batch_size"),
    ("tam", {"start_layer": 3}, "start_layer"),
    ("tam", {"start_layer": 1.0}, "start_layer"),
    ("tam", {"integrated": "yes"}, "integrated"),
    ("bt_head", {"start_layer": -4}, "start_layer"),
    ("bt_head", {"n_steps": 0}, "n_steps"),
    ("bt_token", {"start_layer": 7}, "start_layer"),
    ("bt_token", {"batch_size": -1}, "batch_size"),
    ("gradcam", {"layer": 3}, "layer"),
    ("gradcam", {"layer": True}, "layer"),
])
def test_bad_options_are_refused_by_name(method, options, message, tiny_vit, images):
    with pytest.raises(ValueError, match=message):
        vitexplain.explain(tiny_vit, images, method, **options)


# -- Grad-CAM against the reference library ---------------------------------------------------------
def min_max(maps):
    low, high = maps.amin((1, 2), keepdim=True), maps.amax((1, 2), keepdim=True)
    return (maps - low) / (high - low + 1e-7)


@pytest.mark.parametrize("family", ["vit", "deit_distilled"])
def test_gradcam_agrees_with_pytorch_grad_cam(family, images):
    model = make_vit(**FAMILIES[family])
    prefix = model.num_prefix_tokens

    def tokens_to_grid(tokens):
        patches = tokens[:, prefix:]
        return patches.reshape(patches.shape[0], 4, 4, patches.shape[-1]).permute(0, 3, 1, 2)

    with GradCAM(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=tokens_to_grid) as cam:
        theirs = cam(input_tensor=images, targets=[ClassifierOutputTarget(int(t)) for t in TARGETS])
    ours = vitexplain.explain(model, images, "gradcam", TARGETS)
    # the library's post-processing: min-max per image, bilinear resize to the image, min-max again
    resized = F.interpolate(min_max(ours)[:, None], size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
    torch.testing.assert_close(min_max(resized), torch.from_numpy(theirs), rtol=0, atol=1e-4)
