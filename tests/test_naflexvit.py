"""timm's NaFlexVit on image tensors: the patch grid of images of any tiled size (and of padded ones), RoPE variants
reproduced, the z^B rule at a Linear of flattened patches equal to the same rule at the equivalent convolution, and
the NaFlex collator's dictionaries refused. (The zoo-wide tests cover its three tiny models; the GAE against a
forward written by hand is in test_foreign_families.py.)"""
from __future__ import annotations

import pytest
import timm
import torch

from vitexplain import explain
from vitexplain.instrumentation import adapter_for

from test_instrumentation import _assert_same, _snapshot
from zoo import SIZE, build, randomise


def _reproduces(model, x):
    adapter = adapter_for(model)
    with torch.no_grad():
        own = model(x)
    record = adapter.record(x, own.argmax(-1), grads=("attn",))
    assert (record.logits - own).norm() <= 1e-5 * own.norm()
    return adapter


@pytest.mark.parametrize("size, pad, grid", [((32, 48), False, (4, 6)), ((30, 27), True, (4, 4))])
def test_the_grid_is_the_patches_of_the_image_as_given_or_as_padded(size, pad, grid):
    model = build("naflexvit", dynamic_img_pad=pad)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(4))
    adapter = _reproduces(model, x)
    assert adapter.grid_size(x) == grid
    assert explain(model, x, "gae").shape == (2, *grid)
    assert explain(model, x, "lrp").shape == (2, *size)  # the padding's relevance cropped away


def test_an_image_the_patches_do_not_tile_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^this model cuts images into 8x8 patches, which do not tile a 30x32 image"):
        explain(build("naflexvit"), torch.randn(1, 3, 30, 32), "gae")


@pytest.mark.parametrize("rope", [dict(rope_type="mixed"), dict(rope_type="dinov3", rope_rotate_half=True),
                                  dict(rope_type="mrope", rope_mrope_section=(2, 3, 3))])
def test_every_rotary_variant_is_reproduced(rope):
    _reproduces(build("naflexvit", **rope), torch.randn(2, 3, 32, 40, generator=torch.Generator().manual_seed(5)))


@pytest.mark.parametrize("channels_last", [True, False])
def test_pixel_rules_at_a_linear_of_patches_equal_them_at_the_equivalent_convolution(channels_last):
    """The same weights as a Linear of flattened patches and as a patch convolution: every pixel's relevance (the
    z^B rule's bound terms laid back out as pixels included) is the same."""
    linear = build("naflexvit", patchify_channels_last=channels_last).double()
    torch.manual_seed(0)
    conv = randomise(timm.create_model("naflexvit_base_patch16_gap", embed_proj_type="conv", **SIZE)).double()
    state = dict(linear.state_dict())
    weight = state["embeds.proj.weight"]
    shape = (weight.shape[0], 8, 8, 3) if channels_last else (weight.shape[0], 3, 8, 8)
    weight = weight.reshape(shape)
    state["embeds.proj.weight"] = weight.permute(0, 3, 1, 2) if channels_last else weight
    conv.load_state_dict(state)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.testing.assert_close(linear(x), conv(x))
    for method in ("lrp", "abs_lrp", "attnlrp"):
        found, expected = explain(linear, x, method), explain(conv, x, method)
        assert found.abs().sum() > 0
        torch.testing.assert_close(found, expected, rtol=1e-7, atol=1e-12 * expected.abs().max().item())


def test_a_naflex_dictionary_is_refused_in_one_line_and_the_model_left_as_it_was():
    model = build("naflexvit")
    before = _snapshot(model)
    patches = {"patches": torch.randn(1, 16, 192), "patch_coord": torch.zeros(1, 16, 2, dtype=torch.long),
               "patch_valid": torch.ones(1, 16, dtype=torch.bool)}
    with pytest.raises(TypeError, match=r"^vitexplain explains NaFlexVit on image tensors \[B, C, H, W\]; a dict"):
        explain(model, patches, "gae")
    _assert_same(before, _snapshot(model))
