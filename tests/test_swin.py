"""Hierarchical Swin Transformers (timm V1 and V2): the windowed attention written out exactly, recordings
equal to hooks on the real modules, outputs unchanged and the model restored, products through windows
and patch merging against plain dense loops, LRP conserving across the merges, refusals with reasons.

The window slots, dense attention matrices and merge matrices of the references are built here from
timm's own roll, pad and ``window_partition`` of token ids and from plain loops, not from vitexplain.
"""
from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import window_partition

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, lrp
from vitexplain.instrumentation.attention import AttentionInput
from vitexplain.instrumentation.blocks import block_forward

from zoo import build, images, randomise

ARCHITECTURES = {"v1": "swin_tiny_patch4_window7_224", "v2": "swinv2_tiny_window8_256"}
#: 8×8 then 4×4 token grids, 2×2 windows: several windows and a shifted block in both stages
SHIFTED = dict(img_size=32, patch_size=4, embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=2)
#: a 9×7 grid with 3×3 windows (padded to 9×9), merged with padding to 5×4 (windows padded to 6×6)
PADDED = dict(img_size=(36, 28), patch_size=4, embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=3)
CONFIGS = {"shifted": SHIFTED, "padded": PADDED}


def swin(version: str, config: str = "shifted", seed: int = 0, **overrides):
    """A tiny random Swin, every parameter that timm initialises to a constant drawn at random."""
    torch.manual_seed(seed)
    return randomise(timm.create_model(ARCHITECTURES[version], pretrained=False, num_classes=10,
                                       **{**CONFIGS[config], **overrides}))


def inputs(model, batch: int = 2, seed: int = 1):
    size = model.patch_embed.img_size
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def blocks(model):
    return [block for stage in model.layers for block in stage.blocks]


def slot_tokens(block, grid):
    """[windows, T] the token in each window slot (-1 at padding), by timm's own roll, pad and partition."""
    height, width = grid
    ids = torch.arange(height * width, dtype=torch.float64).reshape(1, height, width, 1)
    if any(block.shift_size):
        ids = torch.roll(ids, shifts=(-block.shift_size[0], -block.shift_size[1]), dims=(1, 2))
    pad_h = (block.window_size[0] - height % block.window_size[0]) % block.window_size[0]
    pad_w = (block.window_size[1] - width % block.window_size[1]) % block.window_size[1]
    ids = F.pad(ids, (0, 0, 0, pad_w, 0, pad_h), value=-1)
    windows = window_partition(ids, block.window_size)
    return windows.reshape(windows.shape[0], -1).long()


def dense(per_window, slots, tokens):
    """Per-window matrices [B·windows, H, T, T] -> dense token-by-token [B, H, N, N] (padding slots dropped)."""
    windows, area = slots.shape
    batch = per_window.shape[0] // windows
    out = torch.zeros(batch, per_window.shape[1], tokens, tokens, dtype=per_window.dtype)
    for b in range(batch):
        for w in range(windows):
            for p in range(area):
                for q in range(area):
                    if slots[w, p] >= 0 and slots[w, q] >= 0:
                        out[b, :, slots[w, p], slots[w, q]] = per_window[b * windows + w, :, p, q]
    return out


def merge_matrix(fine):
    """[N_coarse, N_fine]: each merged token shares equally among its real 2×2 inputs (timm's PatchMerging order)."""
    height, width = fine
    coarse = ((height + 1) // 2, (width + 1) // 2)
    matrix = torch.zeros(coarse[0] * coarse[1], height * width, dtype=torch.float64)
    for a in range(coarse[0]):
        for b in range(coarse[1]):
            inputs = [(2 * a + i) * width + 2 * b + j for i in range(2) for j in range(2)
                      if 2 * a + i < height and 2 * b + j < width]
            matrix[a * coarse[1] + b, inputs] = 1 / len(inputs)
    return matrix


def grids(model, x):
    """The token grid of every block, from the block inputs (hooks)."""
    found = []
    handles = [block.register_forward_pre_hook(lambda m, args: found.append(tuple(args[0].shape[1:3])))
               for block in blocks(model)]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return found


def hooked_attention(model, x, target):
    """Per block: the attention probabilities per window (from the module's dropout, unfused) and their
    gradient of the target logit; plus the logits."""
    probabilities, handles = [], []

    def keep(module, args, output):
        output.retain_grad()
        probabilities.append(output)

    for block in blocks(model):
        block.attn.fused_attn = False
        handles.append(block.attn.attn_drop.register_forward_hook(keep))
    logits = model(x)
    logits.gather(1, target[:, None]).sum().backward()
    for handle in handles:
        handle.remove()
    return probabilities, logits


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("config", ["shifted", "padded"])
@pytest.mark.parametrize("fused", [True, False])
def test_written_out_windowed_attention_and_blocks_equal_the_modules(version, config, fused):
    model = swin(version, config)
    family = adapter_for(model).family
    x = inputs(model)
    block_inputs = []
    handles = [block.register_forward_pre_hook(lambda m, args: block_inputs.append(args[0])) for block in blocks(model)]
    for block in blocks(model):
        block.attn.fused_attn = fused
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    assert all(any(any(block.shift_size) for block in stage.blocks) for stage in model.layers)
    for parts, block, given in zip(family.blocks, blocks(model), block_inputs):
        tokens = given.flatten(1, 2)
        extra = AttentionInput(grid=tuple(given.shape[1:3]))
        with torch.no_grad():
            read = block.norm1(given) if version == "v1" else given
            expected = block._attn(read).flatten(1, 2)
            got = parts.windows.attend(parts.attention, read.flatten(1, 2), extra)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(block_forward(parts, tokens, extra), block(given).flatten(1, 2),
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("config", ["shifted", "padded"])
def test_recorded_windows_attention_and_qkv_equal_hooks_on_the_real_modules(version, config):
    model = swin(version, config)
    x = inputs(model)
    probabilities, window_inputs = [], []
    handles = []
    for block in blocks(model):
        block.attn.fused_attn = False
        handles.append(block.attn.attn_drop.register_forward_hook(lambda m, args, out: probabilities.append(out)))
        handles.append(block.attn.register_forward_pre_hook(lambda m, args: window_inputs.append(args[0])))
    with torch.no_grad():
        logits = model(x)
    for handle in handles:
        handle.remove()
    record = adapter_for(model).record(x)
    torch.testing.assert_close(record.logits, logits, rtol=1e-5, atol=1e-5)
    assert record.geometry.stages == tuple(dict.fromkeys(grids(model, x)))
    for index, (block, grid) in enumerate(zip(blocks(model), grids(model, x))):
        found = record.blocks[index]
        slots = slot_tokens(block, grid)
        assert torch.equal(found.windows.slots, slots)
        windows, area = slots.shape
        per_window = found.attn.transpose(1, 2).flatten(0, 1)  # [B·windows, H, T, T]
        torch.testing.assert_close(per_window, probabilities[index], rtol=1e-5, atol=1e-6)
        attn = block.attn
        with torch.no_grad():
            if version == "v1":
                fused = attn.qkv(window_inputs[index])
            else:
                fused = F.linear(window_inputs[index], attn.qkv.weight,
                                 torch.cat((attn.q_bias, attn.k_bias, attn.v_bias)))
        heads = fused.reshape(fused.shape[0], area, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        for name, expected in zip("qkv", heads):
            recorded = getattr(found, name)  # [B, H, N, D] in token order
            for b in range(x.shape[0]):
                for w in range(windows):
                    for p in range(area):
                        if slots[w, p] >= 0:
                            torch.testing.assert_close(recorded[b, :, slots[w, p]], expected[b * windows + w, :, p],
                                                       rtol=1e-5, atol=1e-6)


def test_dynamic_image_sizes_take_the_blocks_own_masks_for_any_grid():
    model = swin("v1", dynamic_img_size=True)
    x = torch.randn(2, 3, 36, 28, generator=torch.Generator().manual_seed(3))  # a 9×7 grid: padded windows and merge
    with torch.no_grad():
        expected = model(x)
    record = adapter_for(model).record(x, fields=("attn",))
    torch.testing.assert_close(record.logits, expected, rtol=1e-5, atol=1e-5)
    assert record.geometry.grid == (9, 7) and record.geometry.stages == ((9, 7), (5, 4))
    assert explain(model, x, "rollout").shape == (2, 9, 7)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("config", ["shifted", "padded"])
def test_rollout_and_gae_equal_dense_products_through_windows_and_merges(version, config):
    """Per block the dense token-by-token matrix of the hooked window attention; between stages the merge
    matrix (each merged token shared equally among its real inputs); the readout (1/N of the last tokens)
    times the product, on the first stage's grid."""
    model = swin(version, config).double()
    x = inputs(model, batch=2).double()
    with torch.no_grad():
        target = model(x).argmax(-1)
    block_grids = grids(model, x)
    probabilities, _ = hooked_attention(model, x, target)
    assert_rollout_and_gae_are_dense_products(model, x, target, blocks(model), block_grids, probabilities, slot_tokens)


def assert_rollout_and_gae_are_dense_products(model, x, target, model_blocks, block_grids, probabilities, slots_of):
    """Rollout and GAE of each image equal to the dense products: per block the dense token-by-token matrix of the
    window attention ``probabilities`` (per window, with their gradients; ``slots_of(block, grid)`` places the
    window slots), the merge matrix between stages, the readout 1/N of the last tokens; on the first stage's grid."""
    for image in range(x.shape[0]):
        rollout = gae = torch.eye(block_grids[0][0] * block_grids[0][1], dtype=torch.float64)
        for index, (block, grid) in enumerate(zip(model_blocks, block_grids)):
            if index and grid != block_grids[index - 1]:
                merge = merge_matrix(block_grids[index - 1])
                rollout, gae = merge @ rollout, merge @ gae
            slots, tokens = slots_of(block, grid), grid[0] * grid[1]
            windows = slots.shape[0]
            rows = slice(image * windows, (image + 1) * windows)
            attention = dense(probabilities[index][rows].detach(), slots, tokens)[0]
            gradient = dense(probabilities[index].grad[rows], slots, tokens)[0]
            step = attention.mean(0) + torch.eye(tokens, dtype=torch.float64)
            rollout = (step / step.sum(-1, keepdim=True)) @ rollout
            gae = gae + (gradient * attention).clamp(min=0).mean(0) @ gae
        readout = torch.full((rollout.shape[0],), 1 / rollout.shape[0], dtype=torch.float64)
        for method, product in {"rollout": rollout, "gae": gae}.items():
            found = explain(model, x[image:image + 1], method, target[image:image + 1])[0]
            expected = (readout @ product).reshape(block_grids[0]).float()
            torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-7 * expected.abs().max().item())


def test_gradtoken_keys_meet_the_gradients_of_the_queries_in_their_window():
    """M_h[s] = k_s · Σ_i ∂y/∂q_i over the queries i whose (masked) window attention includes s, every
    query being read by the average pool; propagation='none' puts it on the first stage's grid, each
    last-stage token shared among its inputs."""
    model = swin("v1").double()
    x = inputs(model, batch=1).double()
    last = blocks(model)[-1]
    kept = []
    def keep(module, args, output):
        output.retain_grad()
        kept.append(output)

    handle = last.attn.qkv.register_forward_hook(keep)
    logits = model(x)
    target = logits.argmax(-1)
    logits[0, target[0]].backward()
    handle.remove()
    qkv, grad = kept[0], kept[0].grad
    heads = last.attn.num_heads
    q_grad = grad.reshape(*grad.shape[:2], 3, heads, -1)[:, :, 0]  # [windows, T, H, D]
    keys = qkv.detach().reshape(*qkv.shape[:2], 3, heads, -1)[:, :, 1]
    grid = grids(model, x)[-1]
    slots = slot_tokens(last, grid)
    connected = torch.ones(slots.shape[0], slots.shape[1], slots.shape[1], dtype=torch.bool) \
        if last.attn_mask is None else last.attn_mask == 0
    relevance = torch.zeros(heads, grid[0] * grid[1], dtype=torch.float64)
    for w in range(slots.shape[0]):
        for key in range(slots.shape[1]):
            if slots[w, key] < 0:
                continue
            summed = sum(q_grad[w, query] for query in range(slots.shape[1])
                         if slots[w, query] >= 0 and connected[w, query, key])
            relevance[:, slots[w, key]] = (keys[w, key] * summed).sum(-1)
    expected = merge_matrix(grids(model, x)[0]).T @ relevance.clamp(min=0).mean(0)
    found = explain(model, x, "gradtoken", target, propagation="none")[0]
    expected = expected.reshape(grids(model, x)[0]).float()
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-7 * expected.abs().max().item())


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
@pytest.mark.parametrize("version, config", [("v1", "shifted"), ("v2", "shifted"), ("v2", "padded")])
def test_lrp_conserves_relevance_across_windows_and_patch_merging(version, rules, config, monkeypatch):
    """Conserving from block to block, through the merges. Padding is a constant the rules cannot
    attribute (docs/decisions/families.md): padded window slots are zero tokens through the q / k / v
    biases, so the padded model's attention biases are zero; V2 merges a padded group before its norm
    (conserving), V1 after it (the padding's normalised channels keep relevance), so V1 is not padded."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    model = swin(version, config).double()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if (name.endswith("bias") and "relative" not in name) or name.endswith(("q_bias", "v_bias")):
                in_attention = ".attn.qkv" in name or name.endswith(("q_bias", "v_bias"))
                parameter.normal_(0, 0 if in_attention and config == "padded" else 0.3)
    found = lrp.relevance(adapter_for(model), inputs(model).double(), None, rules)
    tokens = [64, 64, 16, 16, 16] if config == "shifted" else [63, 63, 20, 20, 20]
    assert [relevance.shape[1] for relevance in found.residuals] == tokens
    for relevance in found.residuals:
        torch.testing.assert_close(relevance.sum((1, 2)), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))


def test_readout_is_the_mean_of_the_last_stage_and_maps_lie_on_the_first_stage_grid():
    model, x = build("swin"), images()
    record = adapter_for(model).record(x, fields=("attn",))
    readout = record.geometry.readout
    assert readout.kind == "avg" and torch.allclose(readout.weights, torch.full((2, 4), 0.25))
    assert record.geometry.stages == ((4, 4), (2, 2)) and record.blocks[-1].attn.shape == (2, 4, 1, 4, 4)
    assert record.blocks[1].windows.shift == (1, 1) and record.blocks[1].attn.shape == (2, 2, 4, 4, 4)
    for method in ("raw_attention", "gradcam", "attn_gradcam"):  # last-stage maps shared among their 2×2 inputs
        found = explain(model, x, method)
        torch.testing.assert_close(found[:, ::2, ::2], found[:, 1::2, 1::2])


@pytest.mark.parametrize("name", ["swin", "swinv2"])
def test_methods_without_a_reading_are_refused_with_the_reason(name):
    model, x = build(name), images(1)
    with pytest.raises(UnsupportedModelError, match="windows and patch merging need the whole token grid"):
        explain(model, x, "tis", n_masks=4)
    assert explain(model, x, "tis", n_masks=4, input_space=True).shape == (1, 4, 4)
    with pytest.raises(UnsupportedModelError, match="stages with different tokens"):
        explain(model, x, "gradtoken")
    assert explain(model, x, "gradtoken", aggregation="rollout").shape == (1, 4, 4)
    assert explain(model, x, "gradtoken", start_layer=2).shape == (1, 4, 4)  # the last stage alone: an average exists
    if name == "swinv2":
        for method in ("tokentm", "bt_token"):
            with pytest.raises(UnsupportedModelError, match="res-post-norm"):
                explain(model, x, method, **({"n_steps": 2} if method == "bt_token" else {}))


def test_a_head_that_pools_by_maximum_is_refused():
    with pytest.raises(UnsupportedModelError, match="global_pool='max'"):
        explain(build("swin", global_pool="max"), images(1), "gae")
