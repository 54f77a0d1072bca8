"""Test-time registers (instrumentation/test_time_registers.py; Jiang et al. 2025): against a hand-written ViT
forward with the register units moved by hand, the model restored bitwise, a planted register neuron found and
taken out of its token, one image at a time, refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for
from vitexplain.instrumentation import test_time_registers as ttr

from conftest import make_vit

NEURONS = ((1, 3), (1, 40), (2, 7), (0, 11))


def images(count: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def plain_forward(model, image: torch.Tensor, neurons) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One image [3, H, W] through a timm ViT written out, with the authors' test-time register: a zero token appended
    after the patches (after the position embedding, before ``norm_pre``), and in each block holding register units,
    their GELU outputs set at that token to the value of largest magnitude over all tokens and units, and zeroed at
    the patches (tokens 1 … N-2). Returns the logits [classes] and each block's attention [H, N, N]."""
    by_layer = {}
    for layer, unit in neurons:
        by_layer.setdefault(layer, []).append(unit)
    x = model.patch_embed.proj(image[None]).flatten(2).transpose(1, 2)[0]
    x = torch.cat([model.cls_token[0], x]) + model.pos_embed[0]
    x = torch.cat([x, torch.zeros_like(x[:1])])
    x = model.norm_pre(x)
    attentions = []
    for index, block in enumerate(model.blocks):
        heads, width = block.attn.num_heads, x.shape[-1]
        h = F.layer_norm(x, (width,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
        q, k, v = (h @ block.attn.qkv.weight.T + block.attn.qkv.bias).reshape(-1, 3, heads, width // heads).unbind(1)
        scores = torch.einsum("nhd,mhd->hnm", q, k) / (width // heads) ** 0.5
        attention = scores.softmax(-1)
        attentions.append(attention)
        mixed = torch.einsum("hnm,mhd->nhd", attention, v).reshape(-1, width)
        x = x + block.ls1.gamma * (mixed @ block.attn.proj.weight.T + block.attn.proj.bias)
        h = F.layer_norm(x, (width,), block.norm2.weight, block.norm2.bias, block.norm2.eps)
        units = F.gelu(h @ block.mlp.fc1.weight.T + block.mlp.fc1.bias)
        if index in by_layer:
            chosen = units[:, by_layer[index]]
            largest, smallest = chosen.max(), chosen.min()
            units = units.clone()
            units[-1, by_layer[index]] = largest if largest.abs() > smallest.abs() else smallest
            units[1:-1, by_layer[index]] = 0
        x = x + block.ls2.gamma * (units @ block.mlp.fc2.weight.T + block.mlp.fc2.bias)
    x = F.layer_norm(x, (x.shape[-1],), model.norm.weight, model.norm.bias, model.norm.eps)
    return model.head(x[0]), attentions


@pytest.mark.parametrize("settings", [dict(init_values=0.5, qkv_bias=True), dict(pre_norm=True, init_values=0.5)])
def test_equals_a_hand_written_forward_with_the_units_moved_by_hand(settings):
    model = make_vit(**settings)
    batch = images()
    with ttr.test_time_registers(model, NEURONS) as adapter:
        record = adapter.record(batch, None, fields=("attn",))
        maps = vitexplain.explain(adapter, batch, "raw_attention")
    n = record.blocks[0].attn.shape[-1]
    order = torch.tensor([0, n - 1, *range(1, n - 1)])  # ours: class token, register, patches; theirs: register last
    with torch.no_grad():
        for i, image in enumerate(batch):
            logits, attentions = plain_forward(model, image, NEURONS)
            torch.testing.assert_close(record.logits[i], logits, atol=1e-5, rtol=1e-5)
            for block, attention in zip(record.blocks, attentions):
                torch.testing.assert_close(block.attn[i], attention[:, order][:, :, order], atol=1e-6, rtol=1e-5)
            last = attentions[-1][:, 0, 1:-1].mean(0).reshape(4, 4)  # the class token's row over the patches
            torch.testing.assert_close(maps[i], last, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(vitexplain.explain(model, batch, "raw_attention"), maps, atol=1e-3)  # it did something


def everything(model) -> tuple[dict, list]:
    """The model's tensors (copies) and every module's hooks and mode."""
    tensors = {name: tensor.detach().clone() for name, tensor in model.state_dict(keep_vars=True).items()}
    hooks = [(dict(module._forward_hooks), dict(module._forward_pre_hooks), module.training)
             for module in model.modules()]
    return tensors, hooks


def test_the_model_is_restored_bitwise_also_after_an_error():
    model = make_vit(init_values=0.5)
    adapter = adapter_for(model)
    batch = images()
    before_tensors, before_hooks = everything(model)
    with torch.no_grad():
        logits = model(batch)
    plain_map = vitexplain.explain(adapter, batch, "rollout")

    with ttr.test_time_registers(adapter, NEURONS):
        assert adapter.num_prefix_tokens == 2
        with torch.no_grad():
            assert not torch.equal(model(batch), logits)
    with pytest.raises(RuntimeError, match="injected"), ttr.test_time_registers(adapter, NEURONS):
        raise RuntimeError("injected")
    with pytest.raises(ValueError, match="has 96 units"):
        vitexplain.explain(adapter, batch, "gae", registers=[(1, 3), (2, 500)])  # raised inside a hook, mid-forward
    with pytest.raises(ValueError, match="already runs"), ttr.test_time_registers(adapter, NEURONS):
        with ttr.test_time_registers(adapter, NEURONS):
            pass

    after_tensors, after_hooks = everything(model)
    assert before_tensors.keys() == after_tensors.keys()
    assert all(torch.equal(before_tensors[name], after_tensors[name]) for name in before_tensors)
    assert before_hooks == after_hooks and adapter.num_prefix_tokens == 1
    with torch.no_grad():
        assert torch.equal(model(batch), logits)
    assert torch.equal(vitexplain.explain(adapter, batch, "rollout"), plain_map)


def scores_by_hand(model, batch, threshold: float, layer: int) -> torch.Tensor:
    """The authors' statistic written out, one image at a time: mean |GELU output| over the tokens whose block-``layer``
    output norm exceeds ``threshold``, times the sparsity filter (below 0.5 at half the tokens or more), averaged over
    the images that have such tokens."""
    kept, outputs, units = [], {}, {}
    hooks = [model.blocks[layer].register_forward_hook(lambda m, a, out: outputs.__setitem__("x", out))]
    hooks += [block.mlp.act.register_forward_hook(lambda m, a, out, i=i: units.__setitem__(i, out))
              for i, block in enumerate(model.blocks)]
    with torch.no_grad():
        for image in batch:
            model(image[None])
            at = outputs["x"][0].norm(dim=-1) > threshold
            if not at.any():
                continue
            rows = []
            for i in range(len(model.blocks)):
                act = units[i][0].double()
                sparse = (act < 0.5).sum(0) >= 0.5 * act.shape[0]
                rows.append(act[at].abs().mean(0) * sparse)
            kept.append(torch.stack(rows))
    for hook in hooks:
        hook.remove()
    return torch.stack(kept).mean(0)


def planted(unit: int = 17, patch: int = 5):
    """A tiny ViT whose block-0 MLP unit ``unit`` fires at patch ``patch`` alone (a channel of its position embedding
    it reads) and writes a large vector into it: the high-norm outlier token that register neurons make."""
    model = make_vit(depth=3)
    with torch.no_grad():
        model.pos_embed[0, 1 + patch, 0] += 60.0
        fc1, fc2 = model.blocks[0].mlp.fc1, model.blocks[0].mlp.fc2
        fc1.weight[unit] = 0
        fc1.weight[unit, 0] = 4.0
        fc1.bias[unit] = -2.0
        fc2.weight[:, unit] = torch.randn(fc2.out_features, generator=torch.Generator().manual_seed(3)) * 4
    return model


def test_a_planted_register_neuron_is_found_and_moving_it_removes_the_outlier():
    unit, patch = 17, 5
    model = planted(unit, patch)
    batch = images(6)
    with torch.no_grad():
        tokens = model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(batch))))
        norms = tokens.norm(dim=-1)  # [B, 1 + 16]
    outlier = norms[:, 1 + patch]
    others = torch.cat([norms[:, :1 + patch], norms[:, 2 + patch:]], 1)
    assert (outlier > 3 * others.max(1).values).all()  # the planted token stands out
    threshold = float((outlier.min() + others.max()) / 2)

    scores = ttr.neuron_scores(model, batch, outlier_norm=threshold)
    torch.testing.assert_close(scores, scores_by_hand(model, batch, threshold, -1), atol=1e-9, rtol=1e-7)
    found = ttr.find_register_neurons(model, batch, outlier_norm=threshold, top_k=3, batch_size=4)
    assert found[0] == (0, unit) and len(found) == 3
    assert ttr.find_register_neurons(model, batch, outlier_norm=threshold, top_k=2, lowest_layer=1)[0][0] >= 1

    with ttr.test_time_registers(model, found[:1]) as adapter:
        record = adapter.record(batch, None, fields={"block_output": [-1]})
    moved = record.blocks[-1].block_output.norm(dim=-1)  # [B, 2 + 16]: class token, register, patches
    assert (moved[:, 2:].max(1).values < threshold).all()  # no patch is an outlier any more
    assert (moved[:, 1] > threshold).all()  # the register holds it
    with pytest.raises(ValueError, match="lower outlier_norm"):
        ttr.find_register_neurons(model, batch, outlier_norm=1e6)


@pytest.mark.parametrize("method", ["raw_attention", "rollout", "gae", "tokentm", "legrad"])
def test_each_image_on_its_own(method):
    model = make_vit(init_values=0.5)
    batch = images(3)
    together = vitexplain.explain(model, batch, method, registers=NEURONS)
    alone = torch.cat([vitexplain.explain(model, image[None], method, registers=NEURONS) for image in batch])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)
    plain = vitexplain.explain(model, batch, method)
    assert (together - plain).abs().max() > 1e-2 * plain.abs().max()  # the option changed the maps


def test_refusals_in_one_line():
    batch = images(1)
    with pytest.raises(UnsupportedModelError, match="avg pooling") as refused:
        vitexplain.explain(make_vit(global_pool="avg", class_token=False), batch, "rollout", registers=NEURONS)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="block 5 is not one of the model's 3 blocks"):
        vitexplain.explain(make_vit(), batch, "raw_attention", registers=[(5, 1)])
    with pytest.raises(ValueError, match="a list of a list of an integer >= 0"):
        vitexplain.explain(make_vit(), batch, "raw_attention", registers=[(1, -2)])


def test_a_sequence_first_model_runs_its_own_forward_as_the_instrumented_one():
    """open_clip's blocks take [N, B, C]: the units are moved along the token axis in the model's own forward too."""
    from vitexplain.instrumentation.families.base import catalogue

    model, batch = catalogue()["open_clip ViT image tower"].build()
    adapter = adapter_for(model)
    assert adapter.sequence_first
    direction = torch.randn(adapter.logits(batch).shape[-1], generator=torch.Generator().manual_seed(0))
    with ttr.test_time_registers(adapter, [(0, 1), (1, 2)]):
        record = adapter.record(batch, direction, fields=("attn",))
        own = adapter.logits(batch)
    torch.testing.assert_close(own, record.logits, atol=1e-5, rtol=1e-5)
    assert record.blocks[0].attn.shape[-1] == 1 + 1 + 16
    assert (own - adapter.logits(batch)).abs().max() > 1e-3
