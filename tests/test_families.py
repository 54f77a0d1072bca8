"""Every timm family vitexplain describes: recognised, outputs unchanged, restored, attention written out
exactly, recordings equal to hooks on the real modules, token subsets follow positions, LRP conserves.
(Hierarchical Swin, whose blocks live in stages and attend in windows: tests/test_swin.py.)"""
from __future__ import annotations

import copy

import pytest
import torch

from vitexplain import explain
from vitexplain.instrumentation import adapter_for, lrp
from vitexplain.instrumentation.attention import AttentionInput, attend

from test_instrumentation import _assert_same, _snapshot
from test_lrp import assert_conserves
from zoo import ZOO, build, images

NEW = ["vit_avg", "vit_map", "eva02", "vit_rope", "vit_rope_mixed", "beit", "beit_shared", "relpos", "srelpos",
       "naflexvit", "naflexvit_parfac_map", "naflexvit_rope_conv"]


def _attention_modules(model):
    return [block.attn for block in model.blocks]


def _capture_attention_calls(model, x):
    """(args, kwargs) of every attention module call during a plain forward."""
    calls = []
    handles = [attn.register_forward_pre_hook(lambda module, args, kwargs: calls.append((args, kwargs)),
                                              with_kwargs=True) for attn in _attention_modules(model)]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return calls


def _extra(attn, kwargs):
    """What the attention module's call gives besides its input, as the written-out attention takes it."""
    rope = kwargs.get("rope")
    shared = kwargs.get("shared_rel_pos_bias", kwargs.get("shared_rel_pos"))
    if getattr(attn, "rel_pos", None) is not None:  # timm's RelPosAttention ignores a shared bias
        shared = None
    return AttentionInput(rope=rope, bias=shared, mask=kwargs.get("attn_mask"))


@pytest.mark.parametrize("name", list(ZOO))
def test_family_and_readout_are_recognised(name):
    adapter = adapter_for(build(name))
    assert adapter.readout == ZOO[name].readout
    assert adapter.num_blocks == (4 if name.startswith("swin") else 2) and adapter.grid_size(images()) == (4, 4)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("fused", [True, False])
def test_written_out_attention_equals_the_module(name, fused):
    model, x = build(name), images()
    family = adapter_for(model).family
    for attn in _attention_modules(model):
        attn.fused_attn = fused
    calls = _capture_attention_calls(model, x)
    for parts, attn, (args, kwargs) in zip(family.blocks, _attention_modules(model), calls):
        with torch.no_grad():
            expected = attn(*args, **kwargs)
            got = attend(parts.attention, args[0], _extra(attn, kwargs))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NEW)
def test_recorded_attention_and_values_equal_hooks_on_the_real_modules(name):
    """The probabilities entering the module's own dropout, and the heads entering its output projection,
    with the modules computing unfused; q and k reproduce those probabilities with the module's bias."""
    model, x = build(name), images()
    for attn in _attention_modules(model):
        attn.fused_attn = False
    probabilities, mixed = [], []
    handles = []
    for attn in _attention_modules(model):
        handles.append(attn.attn_drop.register_forward_hook(lambda m, args, out: probabilities.append(args[0])))
        handles.append(attn.proj.register_forward_pre_hook(lambda m, args: mixed.append(args[0])))
    calls = _capture_attention_calls(model, x)
    for handle in handles:
        handle.remove()
    record = adapter_for(model).record(x)
    for index, (block, attn) in enumerate(zip(record.blocks, _attention_modules(model))):
        torch.testing.assert_close(block.attn, probabilities[index], rtol=1e-5, atol=1e-6)
        heads = (block.attn @ block.v).transpose(1, 2).reshape(x.shape[0], -1, block.v.shape[1] * block.v.shape[-1])
        if getattr(attn, "norm", None) is not None:
            heads = attn.norm(heads)
        torch.testing.assert_close(heads, mixed[index], rtol=1e-5, atol=1e-6)
        extra = _extra(attn, calls[index][1])
        bias = 0
        parts = adapter_for(model).family.blocks[index].attention
        for term in (parts.position_bias and parts.position_bias(), extra.bias):
            bias = bias + (0 if term is None else term)
        again = (block.q * attn.scale @ block.k.transpose(-2, -1) + bias).softmax(-1)
        torch.testing.assert_close(again, probabilities[index], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NEW + ["swin", "swinv2", "swinv2_cr"])
def test_outputs_unchanged_and_model_restored_also_after_an_exception(name):
    model, x = build(name).train(), images()
    before = _snapshot(model)
    with torch.no_grad():
        expected = model.eval()(x)
    model.train()
    for method in ("gae", "lrp", "tis"):  # (Swin cannot drop tokens: TIS masks the image)
        explain(model, x, method, **({"n_masks": 4, "input_space": name.startswith("swin")} if method == "tis" else {}))
    _assert_same(before, _snapshot(model))

    def explode(module, args, output):
        raise RuntimeError("injected")

    last = [module for module_name, module in model.named_modules() if module_name.endswith("mlp.fc2")][-1]
    handle = last.register_forward_hook(explode)
    before["hooks"] = _snapshot(model)["hooks"]
    for method in ("gae", "transformer_attribution"):
        with pytest.raises(RuntimeError, match="injected"):
            explain(model, x, method)
        _assert_same(before, _snapshot(model))
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), expected)


@pytest.mark.parametrize("name", list(ZOO))
def test_the_head_reads_any_blocks_output_as_the_model_would_if_it_ended_there(name):
    """On the last block's output (as the real block module returns it) the head gives the model's output; on an
    earlier block's, the output of the model cut after that block (the last stage's blocks for Swin); without
    the final norm, the head on the normed tokens."""
    model, x = build(name), images()
    family = adapter_for(model).family
    outputs = []
    handles = [parts.module.register_forward_hook(lambda module, args, out: outputs.append(out))
               for parts in family.blocks]
    with torch.no_grad():
        expected = model(x)
        for handle in handles:
            handle.remove()
        torch.testing.assert_close(family.head(outputs[-1]), expected)
        final_norm = getattr(model, "norm", torch.nn.Identity())  # SwinV2-CR: none after the blocks
        torch.testing.assert_close(family.head(final_norm(outputs[-1]), final_norm=False), expected)
        cut = copy.deepcopy(model)
        if name.startswith("swin"):
            stage = (cut.stages if name == "swinv2_cr" else cut.layers)[-1]
            stage.blocks, earlier = stage.blocks[:1], outputs[-2]
        else:
            cut.blocks, earlier = cut.blocks[:1], outputs[0]
        torch.testing.assert_close(family.head(earlier), cut(x))


@pytest.mark.parametrize("name", NEW)
def test_token_subsets_follow_their_positions(name):
    """All patches in order give the model's output; a subset gives the same output whatever order its
    tokens come in, because RoPE and the relative position bias follow the tokens, not the slots."""
    model, x = build(name), images()
    adapter = adapter_for(model)
    all_patches = torch.arange(16).expand(2, 1, 16)
    with torch.no_grad():
        torch.testing.assert_close(adapter.logits_on_tokens(x, all_patches)[:, 0], model(x), rtol=1e-5, atol=1e-5)
    subset = torch.tensor([0, 3, 5, 6, 9, 12, 15])
    shuffled = subset[torch.tensor([4, 0, 6, 2, 1, 5, 3])]
    keep = torch.stack([subset, shuffled]).expand(2, 2, 7)
    found = adapter.logits_on_tokens(x, keep, batch_size=3)
    torch.testing.assert_close(found[:, 0], found[:, 1], rtol=1e-4, atol=1e-5)
    missing = adapter.logits_on_tokens(x, subset[None, None, :6].expand(2, 1, 6))
    assert not torch.allclose(missing[:, 0], found[:, 0], atol=1e-4)


def test_eva_token_subsets_equal_timms_own_patch_dropout():
    """timm's Eva drops patches itself (with their rotary rows) when it has patch dropout: keep the same ones."""
    model, x = build("eva02", patch_drop_rate=0.5), images()
    kept = torch.tensor([[1, 4, 6, 7, 10, 13, 14, 15], [0, 2, 3, 5, 8, 9, 11, 12]])

    def choose(tokens):
        return torch.cat([tokens[:, :1], tokens[torch.arange(2)[:, None], kept + 1]], 1), kept

    model.patch_drop.forward = choose
    model.train()
    for module in model.modules():  # eval everywhere but the patch dropout, which timm runs in training only
        if module is not model.patch_drop and module is not model:
            module.eval()
    with torch.no_grad():
        expected = model(x)
    model.patch_drop = None
    found = adapter_for(model.eval()).logits_on_tokens(x, kept[:, None])[:, 0]
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)


def _randomise_biases(model):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") and "relative" not in name:
                parameter.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("rules", ["chefer", "lrp"])
def test_lrp_conserves_relevance_through_every_block(name, rules, monkeypatch):
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    assert_conserves(_randomise_biases(build(name)).double(), images(2).double(), rules)


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("rules", sorted(lrp.RULE_SETS))
def test_plain_gradient_beside_the_relevance_equals_the_recorded_gradient(name, rules):
    """One forward under the rules gives the attention's plain gradient too, as a recording's backward does,
    and the same relevance as a forward that keeps the rules' graph alone."""
    model = build(name).double()
    adapter, x, targets = adapter_for(model), images(2).double(), torch.tensor([3, 8])
    both = lrp.relevance(adapter, x, targets, rules, at=("attn",), blocks=(1,), gradients=True)
    alone = lrp.relevance(adapter, x, targets, rules, at=("attn",), blocks=(1,))
    recorded = adapter.record(x, targets, fields=(), grads={"attn": (1,)})
    assert both.attn_grads[0] is None and recorded.blocks[1].grads["attn"].abs().sum() > 0
    torch.testing.assert_close(both.attn_grads[1], recorded.blocks[1].grads["attn"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(both.attn[1], alone.attn[1], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["vit", "eva02", "beit", "swin", "swinv2", "swinv2_cr", "naflexvit"])
def test_the_block_outputs_gradient_is_the_gradient_at_each_blocks_own_output(name):
    """``block_output`` and its gradient (AttCAT's ``tokens="output"``) against hooks on the blocks themselves,
    whatever ends the block: a sum of branches, a res-post-norm, SwinV2-CR's extra norm of the stream."""
    model, batch, target = build(name).double(), images(2).double(), 3
    adapter = adapter_for(model)
    record = adapter.record(batch, target, fields=("block_output",), grads=("block_output",))
    outputs = []
    hooks = [parts.module.register_forward_hook(lambda module, args, output: outputs.append(output))
             for parts in adapter.family.blocks]
    try:
        logits = model(batch)
    finally:
        for hook in hooks:
            hook.remove()
    gradients = torch.autograd.grad(logits[:, target].sum(), outputs)
    assert len(outputs) == len(record.blocks) > 1
    for block, output, gradient in zip(record.blocks, outputs, gradients):
        as_tokens = lambda t: t.reshape(t.shape[0], -1, t.shape[-1])  # noqa: E731 (Swin's blocks: [B, H, W, C])
        torch.testing.assert_close(block.block_output, as_tokens(output), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(block.grads["block_output"], as_tokens(gradient), rtol=1e-10, atol=1e-12)
        assert block.grads["block_output"].abs().sum() > 0
