"""timm's SwinV2-CR (``swinv2_cr_*``): the instrumented forward equals the model's own, recordings equal hooks on
the real modules (per-window attention, q / k / v, block outputs after the extra norm), rollout and GAE equal dense
products of the model's own attention through windows and merges, LRP conserves, refusals with reasons.

The models are built from timm's configs with random weights; each head gets its own logit scale, one above timm's
clamp (log 100), so a scale applied unclamped, or to the wrong head, changes the outputs. The window slots come from
timm's roll, pad and partition of token ids (``test_swin.slot_tokens``: SwinV2-CR shifts, pads and cuts in the
same order as timm's Swin).
"""
from __future__ import annotations

import math

import pytest
import timm
import torch

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, lrp

from test_swin import CONFIGS, assert_rollout_and_gae_are_dense_products, slot_tokens
from zoo import build, images, randomise


def swinv2_cr(config: str = "shifted", seed: int = 0, **overrides):
    """A tiny random SwinV2-CR with an extra norm ending each stage (``swinv2_cr_*_ns``), per-head logit scales
    around and above the clamp."""
    torch.manual_seed(seed)
    model = randomise(timm.create_model("swinv2_cr_tiny_ns_224", pretrained=False, num_classes=10,
                                        **{**CONFIGS[config], **overrides}))
    with torch.no_grad():
        for block in blocks(model):
            heads = block.attn.num_heads
            block.attn.logit_scale.copy_(torch.linspace(0.5, math.log(100) + 0.5, heads))
    return model


def blocks(model):
    return [block for stage in model.stages for block in stage.blocks]


def inputs(model, batch: int = 2, seed: int = 1):
    return torch.randn(batch, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(seed))


def hooked(model, x, target=None):
    """Per block: its input grid, its output (the block module's own), the probabilities per window (entering the
    attention's dropout, gradients of the target logit kept when ``target`` is given) and the attention's input
    windows; plus the logits."""
    found = {"grid": [], "output": [], "attn": [], "windows": []}

    def keep(module, args, output):
        if output.requires_grad:
            output.retain_grad()
        found["attn"].append(output)

    handles = []
    for block in blocks(model):
        handles.append(block.register_forward_pre_hook(lambda m, args: found["grid"].append(tuple(args[0].shape[1:3]))))
        handles.append(block.register_forward_hook(lambda m, args, out: found["output"].append(out)))
        handles.append(block.attn.attn_drop.register_forward_hook(keep))
        handles.append(block.attn.register_forward_pre_hook(lambda m, args: found["windows"].append(args[0])))
    with torch.set_grad_enabled(target is not None):
        logits = model(x)
        if target is not None:
            logits.gather(1, target[:, None]).sum().backward()
    for handle in handles:
        handle.remove()
    return found, logits


@pytest.mark.parametrize("config", ["shifted", "padded"])
@pytest.mark.parametrize("extra_norm_period", [0, 1])
def test_instrumented_forward_and_recordings_equal_the_model_and_hooks_on_its_modules(config, extra_norm_period):
    """The logits in float32 (≤ 1e-5 relative); every recorded field in float64, where rounding cannot hide a
    difference (scores of up to 100 × a cosine magnify float32's)."""
    model = swinv2_cr(config, extra_norm_period=extra_norm_period)
    x = inputs(model)
    with torch.no_grad():
        logits = model(x)
    own = adapter_for(model).record(x).logits
    assert (own - logits).norm() <= 1e-5 * logits.norm()
    model, x = model.double(), x.double()
    found, logits = hooked(model, x)
    assert all(any(any(block.shift_size) for block in stage.blocks) for stage in model.stages)
    assert [not isinstance(block.norm3, torch.nn.Identity) for block in blocks(model)] == \
        ([True] * 4 if extra_norm_period else [False, True, False, True])
    record = adapter_for(model).record(x, fields=("attn", "q", "k", "v", "residual", "attn_branch", "mlp_branch"))
    torch.testing.assert_close(record.logits, logits, rtol=1e-10, atol=1e-12)
    assert record.geometry.stages == tuple(dict.fromkeys(found["grid"]))
    for index, (block, grid) in enumerate(zip(blocks(model), found["grid"])):
        recorded = record.blocks[index]
        slots = slot_tokens(block, grid)
        assert torch.equal(recorded.windows.slots, slots)
        torch.testing.assert_close(recorded.attn.transpose(1, 2).flatten(0, 1), found["attn"][index],
                                   rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(recorded.output, found["output"][index].flatten(1, 2), rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            fused = block.attn.qkv(found["windows"][index])  # [B·windows, T, 3·C]
        heads = fused.unflatten(-1, (3, block.attn.num_heads, -1)).permute(2, 0, 3, 1, 4)  # [3, B·windows, H, T, D]
        real = slots.flatten() >= 0
        for name, expected in zip("qkv", heads):
            per_slot = expected.unflatten(0, (x.shape[0], -1)).transpose(1, 2).flatten(2, 3)  # [B, H, windows·T, D]
            in_token_order = getattr(recorded, name)[:, :, slots.flatten()[real]]
            torch.testing.assert_close(in_token_order, per_slot[:, :, real], rtol=1e-10, atol=1e-12)


def test_dynamic_image_sizes_take_the_blocks_own_masks_for_any_grid():
    model = swinv2_cr(dynamic_img_size=True)
    x = torch.randn(2, 3, 36, 28, generator=torch.Generator().manual_seed(3))  # a 9×7 grid: padded windows and merge
    with torch.no_grad():
        expected = model(x)
    record = adapter_for(model).record(x, fields=("attn",))
    assert (record.logits - expected).norm() <= 1e-5 * expected.norm()
    assert record.geometry.grid == (9, 7) and record.geometry.stages == ((9, 7), (5, 4))


@pytest.mark.parametrize("config", ["shifted", "padded"])
def test_rollout_and_gae_equal_dense_products_of_the_models_own_attention(config):
    model = swinv2_cr(config).double()
    x = inputs(model).double()
    with torch.no_grad():
        target = model(x).argmax(-1)
    found, _ = hooked(model, x, target)
    assert_rollout_and_gae_are_dense_products(model, x, target, blocks(model), found["grid"], found["attn"],
                                              slot_tokens)


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
def test_lrp_conserves_relevance_through_windows_extra_norms_and_patch_merging(rules, monkeypatch):
    """Block to block, through the extra norms and the merges, every bias drawn at random. Unpadded: SwinV2-CR
    normalises a merged 2×2 group after padding it (as Swin V1), so padding channels would keep relevance."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    model = swinv2_cr("shifted", extra_norm_period=1).double()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") and "meta_mlp" not in name:
                parameter.normal_(0, 0.3)
    found = lrp.relevance(adapter_for(model), inputs(model).double(), None, rules)
    assert [relevance.shape[1] for relevance in found.residuals] == [64, 64, 16, 16, 16]
    for relevance in found.residuals:
        torch.testing.assert_close(relevance.sum((1, 2)), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))


def test_methods_without_a_reading_are_refused_with_the_reason():
    model, x = build("swinv2_cr"), images(1)
    with pytest.raises(UnsupportedModelError, match="windows and patch merging need the whole token grid"):
        explain(model, x, "tis", n_masks=4)
    for method in ("tokentm", "bt_token"):
        with pytest.raises(UnsupportedModelError, match="res-post-norm"):
            explain(model, x, method, **({"n_steps": 2} if method == "bt_token" else {}))
    with pytest.raises(UnsupportedModelError, match="stages with different tokens"):
        explain(model, x, "gradtoken")
    assert explain(model, x, "gradtoken", start_layer=2).shape == (1, 4, 4)  # the last stage alone: an average exists
    with pytest.raises(UnsupportedModelError, match="global_pool='max'"):
        explain(build("swinv2_cr", global_pool="max"), x, "gae")
