"""GradToken (Cheng et al., Neural Networks 2024) against a plain re-computation from a hand-written forward."""
from __future__ import annotations

import pytest
import torch

from vitexplain import explain

from conftest import FAMILIES, make_vit
from test_tokentm import (
    TARGETS,
    assert_close_maps,
    assert_maps_differ,
    double_model,
    images_like,
    manual_forward,
    target_score,
)


def reference_gradtoken(model, images, targets, *, aggregation="average", propagation="matmul", heads="relu_mean",
                        start_layer=0, score="logit", transpose=False):
    logits, blocks = manual_forward(model, images)
    (query_grad,) = torch.autograd.grad(target_score(logits, targets, score), [blocks[-1]["q"]])
    with torch.no_grad():
        return gradtoken_maps(model, blocks, query_grad, aggregation, propagation, heads, start_layer, transpose)


def gradtoken_maps(model, blocks, query_grad, aggregation, propagation, heads, start_layer, transpose=False):
    prefix, cls = model.num_prefix_tokens, 0
    num_blocks = len(blocks)
    lower = list(range(start_layer % num_blocks, num_blocks - 1))
    keys = blocks[-1]["k"]
    batch, num_heads, n, _ = keys.shape
    spatial = range(prefix, n)
    maps = []
    for i in range(batch):
        relevance = [torch.stack([torch.dot(keys[i, h, s], query_grad[i, h, cls]) for s in spatial])  # Eq. (8)
                     for h in range(num_heads)]
        fused = {b: sum(blocks[b]["attn"][i, h] for h in range(num_heads)) / num_heads for b in lower}
        if propagation != "none" and lower:
            if aggregation == "average":  # Eq. (14): 1/B, B = the blocks from start_layer to the last
                aggregated = sum(fused[b] for b in lower) / (len(lower) + 1)
            else:
                layers = {b: torch.eye(n, dtype=keys.dtype) + fused[b] for b in lower}  # Eq. (9)
                aggregated = torch.eye(n, dtype=keys.dtype)
                for b in lower:
                    if propagation == "elementwise" or transpose:
                        aggregated = layers[b] @ aggregated   # Eq. (10): L^(B-1) ... L^(1)
                    else:
                        aggregated = aggregated @ layers[b]   # Eq. (12) as printed: L^(1) ... L^(B-1)
            if propagation == "elementwise":  # Eq. (11) / (15)
                relevance = [torch.stack([aggregated[cls, s] * m[s - prefix] for s in spatial]) for m in relevance]
            elif transpose:  # our variant: each token passes its relevance to the tokens it attends to
                relevance = [torch.stack([sum(aggregated[t, s] * m[t - prefix] for t in spatial) for s in spatial])
                             for m in relevance]
            else:  # Eq. (13) / (16) as printed: token s gets the relevance of the tokens t it attends to
                relevance = [torch.stack([sum(aggregated[s, t] * m[t - prefix] for t in spatial) for s in spatial])
                             for m in relevance]
        if heads == "relu_mean":  # Eq. (18)
            relevance = [m.clamp(min=0) for m in relevance]
        maps.append((sum(relevance) / num_heads).reshape(4, 4))  # Eq. (17) after the ReLU, or without it
    return torch.stack(maps)


VARIANTS = [
    {},                                                          # GradToken-4, GradToken-ii
    {"propagation": "none"},                                     # GradToken-0
    {"aggregation": "rollout", "propagation": "elementwise"},    # GradToken-1
    {"aggregation": "rollout", "propagation": "matmul"},         # GradToken-2
    {"aggregation": "average", "propagation": "elementwise"},    # GradToken-3
    {"heads": "mean"},                                           # GradToken-i
    {"start_layer": 1},
    {"start_layer": -2},
    {"start_layer": 2},
    {"aggregation": "rollout", "propagation": "elementwise", "start_layer": 1},
    {"score": "probability"},
    {"transpose": True},
    {"aggregation": "rollout", "propagation": "matmul", "transpose": True},
]


def variant_id(options):
    return ",".join(f"{k}={v}" for k, v in options.items()) or "default"


@pytest.mark.parametrize("options", VARIANTS, ids=variant_id)
def test_equations_match_plain_computation(options):
    model = double_model("layerscale_qkvbias")
    images = images_like(model)
    maps = explain(model, images, "gradtoken", TARGETS, **options).double()
    assert_close_maps(maps, reference_gradtoken(model, images, TARGETS, **options))


@pytest.mark.parametrize("family", ["vit", "deit_distilled", "registers"])
@pytest.mark.parametrize("options", [{}, {"aggregation": "rollout", "propagation": "elementwise"}], ids=variant_id)
def test_prefix_token_families_match_plain_computation(family, options):
    model = double_model(family)
    images = images_like(model, batch=2)
    maps = explain(model, images, "gradtoken", TARGETS[:2], **options).double()
    assert_close_maps(maps, reference_gradtoken(model, images, TARGETS[:2], **options))


@pytest.mark.parametrize("options", VARIANTS[1:7] + VARIANTS[-3:], ids=variant_id)
def test_every_switch_changes_the_map(options):
    model = make_vit(**FAMILIES["layerscale_qkvbias"])
    images = images_like(model)
    default = explain(model, images, "gradtoken", TARGETS)
    assert_maps_differ(default, explain(model, images, "gradtoken", TARGETS, **options))


def test_last_block_as_depth_is_no_propagation():
    model = make_vit()
    images = images_like(model)
    no_propagation = explain(model, images, "gradtoken", propagation="none")
    assert torch.equal(explain(model, images, "gradtoken", start_layer=2), no_propagation)


def test_different_targets_give_different_maps():
    model = make_vit()
    images = images_like(model)
    assert_maps_differ(explain(model, images, "gradtoken", 1), explain(model, images, "gradtoken", 6))


def test_batch_equals_one_image_at_a_time():
    model = make_vit(**FAMILIES["deit_distilled"])
    images = images_like(model)
    together = explain(model, images, "gradtoken", TARGETS)
    alone = torch.cat([explain(model, images[i:i + 1], "gradtoken", TARGETS[i:i + 1]) for i in range(4)])
    assert torch.allclose(together, alone, rtol=1e-5, atol=1e-7 * together.abs().max())


@pytest.mark.parametrize("options, message", [
    ({"aggregation": "max"}, "option aggregation of method .* must be one of"),
    ({"propagation": "add"}, "option propagation of method .* must be one of"),
    ({"heads": "max"}, "option heads of method .* must be one of"),
    ({"score": "log_odds"}, "option score of method .* must be one of"),
    ({"start_layer": 3}, "start_layer must index"),
    ({"start_layer": -4}, "start_layer must index"),
    ({"start_layer": 1.0}, "option start_layer of method .* must be an integer"),
])
def test_bad_options_are_refused(options, message):
    model = make_vit()
    with pytest.raises(ValueError, match=message):
        explain(model, images_like(model, 1), "gradtoken", **options)


def test_pooled_readout_sums_the_query_gradients_the_output_reads():
    """Average pooling reads every patch token's query: M_h = K_h Σ_i ∂y/∂q_i (no propagation: M_h alone)."""
    model = make_vit(class_token=False, global_pool="avg")
    images = images_like(model, 2)
    logits, blocks = manual_forward(model, images)
    (query_grad,) = torch.autograd.grad(target_score(logits, TARGETS[:2], "logit"), [blocks[-1]["q"]])
    keys = blocks[-1]["k"].detach()
    expected = torch.einsum("bhnd,bhd->bhn", keys, query_grad.sum(2)).clamp(min=0).mean(1)
    found = explain(model, images, "gradtoken", TARGETS[:2], propagation="none")
    torch.testing.assert_close(found, expected.reshape(2, 4, 4), rtol=1e-5, atol=1e-7)
