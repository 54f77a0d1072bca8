"""Pooled readouts (average pooling, attention pooling) against plain-loop computations.

The readout weights are rebuilt by hand — uniform over the patch tokens, or the pooling probe's
attention from its own parameters — and the row-propagated methods are compared with products of
the per-block matrices of an independent written-out forward (tests/reference.py), image by image.
"""
from __future__ import annotations

import pytest
import torch

from vitexplain import explain
from vitexplain.instrumentation import adapter_for

from reference import manual_forward
from zoo import build, images


def probe_attention(model, tokens):
    """The attention-pooling head's attention over the last tokens, from its parameters [B, N] (mean over heads)."""
    pool = model.attn_pool
    x = model.norm(tokens)
    heads, width = pool.num_heads, pool.head_dim
    q = pool.q(pool.latent).reshape(1, -1, heads, width).transpose(1, 2)
    k = pool.kv(x).reshape(x.shape[0], x.shape[1], 2, heads, width)[:, :, 0].transpose(1, 2)
    return torch.softmax(q @ k.transpose(-1, -2) * pool.scale, dim=-1)[:, :, 0].mean(1)


def readout_weights(model, tokens):
    if model.global_pool == "map":
        return probe_attention(model, tokens)
    weights = torch.zeros(tokens.shape[:2])
    weights[:, model.num_prefix_tokens:] = 1 / (tokens.shape[1] - model.num_prefix_tokens)
    return weights


@pytest.fixture(params=["vit_avg", "vit_reg_avg", "vit_map"])
def pooled(request):
    model, x = build(request.param), images(2, seed=3)
    with torch.no_grad():
        targets = model(x).argmax(-1)
    return model, x, targets


def test_recorded_readout_weights_equal_the_head(pooled):
    model, x, targets = pooled
    record = adapter_for(model).record(x, targets)
    _, _, residuals = manual_forward(model, x)
    with torch.no_grad():
        last = model.blocks[-1](residuals[-1])
    torch.testing.assert_close(record.geometry.readout.weights, readout_weights(model, last), rtol=1e-5, atol=1e-6)


def test_raw_attention_rollout_and_gae_read_the_readout_row(pooled):
    model, x, targets = pooled
    logits, attentions, residuals = manual_forward(model, x)
    logits.gather(1, targets[:, None]).sum().backward()
    with torch.no_grad():
        weights = readout_weights(model, model.blocks[-1](residuals[-1]))
    prefix = model.num_prefix_tokens
    for image in range(2):
        fused = [a[image].detach().mean(0) for a in attentions]
        cams = [(a.grad[image] * a[image]).clamp(min=0).mean(0).detach() for a in attentions]
        eye = torch.eye(fused[0].shape[0])
        rollout, gae = eye, eye
        for attention, cam in zip(fused, cams):  # first block first: later factors multiply on the left
            step = attention + eye
            rollout = (step / step.sum(-1, keepdim=True)) @ rollout
            gae = gae + cam @ gae
        expected = {"raw_attention": weights[image] @ fused[-1], "rollout": weights[image] @ rollout,
                    "gae": weights[image] @ gae}
        for method, row in expected.items():
            found = explain(model, x[image:image + 1], method, targets[image:image + 1])[0]
            torch.testing.assert_close(found, row[prefix:].reshape(4, 4), rtol=1e-4, atol=1e-6)


def test_a_head_that_returns_every_token_is_refused():
    with pytest.raises(TypeError, match=r"its head returns every token \(global_pool=''\), not one vector"):
        explain(build("vit_avg", global_pool=""), images(1), "gae")
