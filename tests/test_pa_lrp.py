"""PA-LRP (Bakish et al., NeurIPS 2025): the position embedding's share of the relevance at its add, given back.

The authors' code itself is compared once, outside the suite (docs/decisions/pa-lrp.md); here the share is checked
against the ε-rule at the add written out from the model's own tensors, and the map against AttnLRP's.
"""
from __future__ import annotations

import pytest
import torch

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, lrp

import zoo
from conftest import make_vit
from test_lrp import images_like, model_state, randomise_biases


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    vit = randomise_biases(make_vit(seed=4))
    with torch.no_grad():  # a position embedding as large as the patch embeddings, so its share is not small
        vit.pos_embed.normal_(0, 1.0)
    return vit


def add_output(model, images):
    """y = [class token, patch embeddings] + position embedding, the first block's input (timm's forward)."""
    with torch.no_grad():
        return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))


def per_patch(maps, grid):
    """The sum of each patch's pixels of a map [B, H, W] -> [B, h·w]."""
    b, height, width = maps.shape
    h, w = grid
    return maps.reshape(b, h, height // h, w, width // w).sum((2, 4)).reshape(b, h * w)


def test_position_share_is_the_epsilon_rule_at_the_add(model):
    """R_p = p ⊙ R_y / y per patch token, with R_y the relevance of the first block's input under AttnLRP's rules,
    y and p read from the model; and the patch embeddings' relevance is the rest of R_y."""
    images, targets = images_like(3), torch.tensor([1, 4, 7])
    found = lrp.relevance(adapter_for(model), images, targets, "attnlrp", at=("residuals",))
    y = add_output(model, images).double()
    r_y = found.residuals[0].double()
    p = model.pos_embed.detach().double()[:, 1:]
    expected = (p * r_y[:, 1:] / y[:, 1:]).sum(-1)  # [B, h·w]
    only = explain(model, images, "pa_lrp", targets, at="patches", positions="only", clamp=False)
    assert torch.allclose(per_patch(only, (4, 4)).double(), expected, rtol=1e-4, atol=1e-5 * expected.abs().max())
    added = explain(model, images, "pa_lrp", targets, at="patches", clamp=False)
    assert torch.allclose(per_patch(added, (4, 4)).double(), r_y[:, 1:].sum(-1), rtol=1e-4,
                          atol=1e-5 * r_y.abs().max())
    assert expected.abs().sum() > 0.1 * r_y[:, 1:].sum(-1).abs().sum()  # the share is not negligible here


def test_attnlrp_loses_exactly_the_position_share(model):
    """Without clamping, PA-LRP's map is AttnLRP's plus R_p spread over each patch, at the pixels and the patches;
    summed, the patch tokens' relevance at the add is all there (conservation where AttnLRP drops Σ R_p)."""
    images, targets = images_like(2, seed=6), torch.tensor([0, 5])
    only = explain(model, images, "pa_lrp", targets, positions="only", clamp=False)
    for at in ("pixels", "patches"):
        added = explain(model, images, "pa_lrp", targets, at=at, clamp=False)
        plain = explain(model, images, "attnlrp", targets, at=at)
        assert torch.allclose(added, plain + only, atol=1e-5 * added.abs().max())
    r_y = lrp.relevance(adapter_for(model), images, targets, "attnlrp", at=("residuals",)).residuals[0]
    patches = explain(model, images, "pa_lrp", targets, at="patches", clamp=False).sum((1, 2))
    assert torch.allclose(patches, r_y[:, 1:].sum((1, 2)), rtol=1e-4)
    lost = explain(model, images, "attnlrp", targets, at="patches").sum((1, 2)) - r_y[:, 1:].sum((1, 2))
    assert torch.allclose(lost, -only.sum((1, 2)), rtol=1e-3, atol=1e-5)


def test_clamp_and_positions_only(model):
    images = images_like(2)
    signed = explain(model, images, "pa_lrp", clamp=False)
    assert torch.equal(explain(model, images, "pa_lrp"), signed.clamp(min=0))
    only = explain(model, images, "pa_lrp", positions="only", clamp=False)
    patch = only.reshape(2, 4, 8, 4, 8)  # constant over each patch's pixels
    assert torch.equal(patch, patch[:, :, :1, :, :1].expand_as(patch))


def test_batch_equals_one_at_a_time(model):
    images, targets = images_like(4, seed=2), torch.tensor([0, 3, 5, 9])
    together = explain(model, images, "pa_lrp", targets)
    alone = torch.cat([explain(model, images[i:i + 1], "pa_lrp", targets[i:i + 1]) for i in range(4)])
    assert torch.allclose(together, alone, atol=1e-6 * alone.abs().max())


def test_model_restored_after_an_injected_error():
    vit = make_vit(seed=1)
    images = images_like()
    before, state = explain(vit, images, "pa_lrp"), model_state(vit)

    def fail(module, args, output):
        raise RuntimeError("injected")

    handle = vit.blocks[1].mlp.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="injected"):
        explain(vit, images, "pa_lrp")
    handle.remove()
    assert model_state(vit) == state
    assert torch.equal(explain(vit, images, "pa_lrp"), before)


def test_bfloat16_autocast_close_to_float32(model):
    images = images_like(2, seed=8)
    full = explain(model, images, "pa_lrp", clamp=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = explain(model, images, "pa_lrp", clamp=False)
    assert half.dtype == torch.float32
    for a, b in zip(full.flatten(1), half.flatten(1)):
        assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.999


@pytest.mark.parametrize("name, reason", [("eva02", "rotary"), ("vit_rope", "rotary"), ("relpos", "adds none"),
                                          ("swin", "adds none")])
def test_refused_without_a_reachable_position_embedding(name, reason):
    with pytest.raises(UnsupportedModelError, match=reason):
        explain(zoo.build(name), zoo.images(1), "pa_lrp")
