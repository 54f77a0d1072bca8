"""torchvision's Swin Transformers (V1 and V2 blocks): the instrumented forward equal to the model's own output,
rollout and GAE equal to dense products through the windows and patch merges, refusals with their reasons, the
model restored.

The window slots of the references come from torchvision's own order of operations applied to token ids (pad to
whole windows, then roll, the shift dropped on a side no longer than the window); the attention probabilities
from the model's own softmax calls, not from vitexplain."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, lrp

from test_instrumentation import _assert_same, _snapshot
from test_swin import assert_rollout_and_gae_are_dense_products
from zoo import randomise

#: (image size, window): an 8×8 then 4×4 grid with 2×2 windows (shifted in both stages); a 10×10 grid with
#: 3×3 windows (padded to 12×12, then a 5×5 grid padded to 6×6)
CONFIGS = {"shifted": (32, 2), "padded": (40, 3)}


def torchvision_swin(version: int, config: str = "shifted"):
    from torchvision.models import swin_transformer as swin

    torch.manual_seed(0)
    v2 = dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2) if version == 2 else {}
    window = CONFIGS[config][1]
    model = swin.SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[2, 4],
                                 window_size=[window, window], num_classes=10, **v2)
    with torch.no_grad():  # biases start at zero or near it, V2's logit scales at one value
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "logit_scale" in name:
                parameter.normal_(0, 0.3)
    return randomise(model)


def images(config: str, batch: int = 2):
    size = CONFIGS[config][0]
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def blocks(model):
    return adapter_for(model).family.block_modules()


def slot_tokens(block, grid):
    """[windows, T] the token in each window slot (-1 at padding), by torchvision's pad, roll and partition."""
    window, shift = list(block.attn.window_size), list(block.attn.shift_size)
    ids = torch.arange(grid[0] * grid[1], dtype=torch.float64).reshape(1, *grid, 1)
    pad_h, pad_w = (-grid[0]) % window[0], (-grid[1]) % window[1]
    ids = F.pad(ids, (0, 0, 0, pad_w, 0, pad_h), value=-1)
    padded = ids.shape[1:3]
    shift = [0 if window[i] >= padded[i] else shift[i] for i in range(2)]
    ids = torch.roll(ids, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    ids = ids.view(padded[0] // window[0], window[0], padded[1] // window[1], window[1]).permute(0, 2, 1, 3)
    return ids.reshape(-1, window[0] * window[1]).long()


def hooked(model, x, target, monkeypatch):
    """Per block: its input grid and its attention probabilities per window (the model's softmax calls, with their
    gradient of the target logit); plus the logits."""
    grids, probabilities = [], []
    handles = [block.register_forward_pre_hook(lambda m, args: grids.append(tuple(args[0].shape[1:3])))
               for block in blocks(model)]
    softmax = F.softmax

    def kept(*args, **kwargs):
        output = softmax(*args, **kwargs)
        output.retain_grad()
        probabilities.append(output)
        return output

    monkeypatch.setattr(F, "softmax", kept)
    logits = model(x)
    monkeypatch.setattr(F, "softmax", softmax)
    logits.gather(1, target[:, None]).sum().backward()
    for handle in handles:
        handle.remove()
    return grids, probabilities, logits


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("config", ["shifted", "padded"])
def test_rollout_and_gae_equal_dense_products_and_the_forward_the_models(version, config, monkeypatch):
    model = torchvision_swin(version, config).double()
    x = images(config).double()
    adapter = adapter_for(model)
    assert adapter.family.name == "torchvision Swin Transformer (V1, V2)" and adapter.readout == "avg"
    with torch.no_grad():
        own = model(x)
    record = adapter.record(x.float(), grads=("attn",))
    assert (record.logits.double() - own).norm() <= 1e-5 * own.norm()
    target = own.argmax(-1)
    grids, probabilities, _ = hooked(model, x, target, monkeypatch)
    assert len(probabilities) == len(grids) == 4
    assert_rollout_and_gae_are_dense_products(model, x, target, blocks(model), grids, probabilities, slot_tokens)


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
@pytest.mark.parametrize("version, config", [(1, "shifted"), (2, "shifted"), (2, "padded")])
def test_lrp_conserves_relevance_across_windows_and_patch_merging(version, config, rules, monkeypatch):
    """Relevance summed over the tokens is the target logit's (1 after the normalisation) at every block's input
    and after the last, through the windows, the shifts and the merges; the pixels hold the patches'. Padding is a
    constant the rules cannot attribute (as for timm's Swin, tests/test_swin.py): the padded model's
    attention biases are zero, and V1, which merges after the norm, is not padded."""
    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    model, x = torchvision_swin(version, config).double(), images(config).double()
    if config == "padded":
        with torch.no_grad():
            for block in blocks(model):
                block.attn.qkv.bias.zero_()
    found = lrp.relevance(adapter_for(model), x, None, rules)
    grid = (CONFIGS[config][0] // 4) ** 2
    assert [relevance.shape[1] for relevance in found.residuals] == [grid, grid, grid // 4, grid // 4, grid // 4]
    for relevance in found.residuals:
        torch.testing.assert_close(relevance.sum((1, 2)), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))


def test_token_subsets_and_head_shares_are_refused_with_their_reasons_and_the_model_left_as_found():
    model = torchvision_swin(2).train()
    x = images("shifted")
    before = _snapshot(model)
    explain(model, x, "transformer_attribution")
    with pytest.raises(UnsupportedModelError, match="windows and patch merging need the whole token grid"):
        explain(model, x, "tis", n_masks=2)
    with pytest.raises(UnsupportedModelError, match="res-post-norm"):
        explain(model, x, "tokentm")
    explain(model, x, "gae")
    _assert_same(before, _snapshot(model))


def test_images_the_patches_do_not_tile_are_refused():
    with pytest.raises(ValueError, match="4x4 patches, which do not tile a 30x32 image"):
        explain(torchvision_swin(1), torch.randn(1, 3, 30, 32), "gae")
