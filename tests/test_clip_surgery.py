"""CLIP Surgery: equal to the paper's equations written out here on a tiny model (a v-v attention path beside the
model's blocks, each patch read through ``ln_post`` and the projection, the feature surgery as the mean over the
prompts of the element-wise image-text products subtracted, or one redundant direction subtracted), with classes;
on every two-tower family vitexplain serves, batched as one by one, with texts; the model left as it was;
refusals in one line; the same maps under bfloat16 autocast. The comparison with the authors' code is in
docs/decisions/clip-methods.md."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError
from vitexplain.maps import min_max

from test_grad_eclip import _attend, _two_towers
from test_instrumentation import _assert_same, _snapshot
from zoo import build, images, open_clip_vit, randomise


def _written_out(visual, x, start):
    """open_clip's image tower by hand, with the v-v path from block ``start`` on: (image embedding [B, D], each
    patch of the v-v path through ``ln_post`` and ``proj`` [B, P, D])."""
    tokens = visual.conv1(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([visual.class_embedding.expand(len(x), 1, -1), tokens], 1) + visual.positional_embedding
    tokens, path = visual.ln_pre(tokens), None
    for index, block in enumerate(visual.transformer.resblocks):
        path = tokens if index == start else path
        q, k, v = F.linear(block.ln_1(tokens), block.attn.in_proj_weight, block.attn.in_proj_bias).chunk(3, -1)
        if index >= start:  # q and k replaced by v, no feed-forward
            path = path + block.ls_1(block.attn.out_proj(_attend(v, v, v, block.attn.num_heads)))
        tokens = tokens + block.ls_1(block.attn.out_proj(_attend(q, k, v, block.attn.num_heads)))
        tokens = tokens + block.ls_2(block.mlp(block.ln_2(tokens)))
    return visual.ln_post(tokens[:, 0]) @ visual.proj, visual.ln_post(path[:, 1:]) @ visual.proj


def _grid(similarity):
    return min_max(similarity.reshape(len(similarity), 4, 4), constant=0.0)


@pytest.fixture(scope="module")
def tower():
    """A 3-block open_clip tower (LayerScale drawn), 2 images, 4 prompts, and the written-out features from block 1."""
    visual, x = randomise(open_clip_vit(layers=3)), images(2)
    prompts = F.normalize(torch.randn(4, 16, generator=torch.Generator().manual_seed(7)), dim=-1)
    with torch.no_grad():
        image, patches = _written_out(visual, x, start=1)
    return visual, x, prompts, F.normalize(image, dim=-1), F.normalize(patches, dim=-1)


def test_architecture_surgery_is_the_v_v_path(tower):
    visual, x, prompts, _, patches = tower
    expected = _grid(torch.einsum("bpd,bd->bp", patches, prompts[:2]))
    torch.testing.assert_close(explain(visual, x, "clip_surgery", prompts[:2], start_layer=1), expected,
                               rtol=1e-4, atol=1e-5)


def test_feature_surgery_removes_the_mean_of_the_weighted_products_over_the_prompts(tower):
    visual, x, prompts, image, patches = tower
    probability = (2 * image @ prompts.t()).softmax(-1)  # [B, T]
    weights = probability / probability.mean(-1, keepdim=True)
    features = patches[:, :, None] * prompts[None, None] * weights[:, None, :, None]  # [B, P, T, C]
    similarity = (features - features.mean(2, keepdim=True)).sum(-1)  # [B, P, T]
    pairs, directions = x.repeat_interleave(4, 0), prompts.repeat(2, 1)
    found = explain(visual, pairs, "clip_surgery", directions, prompts=prompts, start_layer=1).reshape(2, 4, 4, 4)
    for t in range(4):
        torch.testing.assert_close(found[:, t], _grid(similarity[..., t]), rtol=1e-4, atol=1e-5)
    # a target none of the prompts is added to them: the same set, the same maps
    torch.testing.assert_close(explain(visual, x, "clip_surgery", prompts[0], prompts=prompts[1:], start_layer=1),
                               found[:, 0], rtol=1e-5, atol=1e-6)


def test_one_redundant_direction_is_subtracted(tower):
    visual, x, prompts, _, patches = tower
    expected = _grid(torch.einsum("bpd,d->bp", patches, prompts[0] - prompts[3]))
    torch.testing.assert_close(explain(visual, x, "clip_surgery", prompts[0], redundant=prompts[3], start_layer=1),
                               expected, rtol=1e-4, atol=1e-5)
    raw = explain(visual, x, "clip_surgery", prompts[0], redundant=prompts[3], start_layer=1, normalise=False)
    torch.testing.assert_close(raw.flatten(1), torch.einsum("bpd,d->bp", patches, prompts[0] - prompts[3]),
                               rtol=1e-4, atol=1e-6)


def test_a_class_is_scored_on_each_patch_of_the_v_v_path_and_the_default_is_the_last_six_blocks():
    model, x = build("vit", depth=3), images(2)
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    path = tokens
    for block in model.blocks:  # fewer than six blocks: the path covers them all
        q, k, v = F.linear(block.norm1(tokens), block.attn.qkv.weight, block.attn.qkv.bias).chunk(3, -1)
        path = path + block.ls1(block.attn.proj(_attend(v, v, v, block.attn.num_heads)))
        tokens = tokens + block.ls1(block.attn.proj(_attend(q, k, v, block.attn.num_heads)))
        tokens = tokens + block.ls2(block.mlp(block.norm2(tokens)))
    logits = model.head(model.norm(path[:, 1:])).detach()  # each patch read as the class token
    classes = torch.tensor([3, 8])
    expected = _grid(logits.gather(2, classes[:, None, None].expand(-1, 16, 1))[..., 0])
    torch.testing.assert_close(explain(model, x, "clip_surgery", classes), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(explain(model, x, "clip_surgery", classes, start_layer=0), expected)


def test_every_two_tower_family_batched_as_one_by_one_and_left_as_it_was():
    x = images(2)
    for name, (model, width) in _two_towers().items():
        generator = torch.Generator().manual_seed(1)
        direction, prompts = torch.randn(2, width, generator=generator), torch.randn(3, width, generator=generator)
        before = _snapshot(model)
        maps = explain(model, x, "clip_surgery", direction, prompts=prompts)
        assert maps.shape == (2, 4, 4) and maps.isfinite().all() and maps.amax() == 1, name
        alone = torch.cat([explain(model, x[i:i + 1], "clip_surgery", direction[i:i + 1], prompts=prompts)
                           for i in range(2)])
        torch.testing.assert_close(maps, alone, rtol=1e-4, atol=1e-6)
        for options in ({}, {"redundant": prompts[0]}):
            assert explain(model, x, "clip_surgery", direction, **options).isfinite().all(), (name, options)
        _assert_same(before, _snapshot(model))


def test_texts_as_target_and_prompts(tmp_path):
    from test_two_tower import TEXTS, two_tower

    model, tok = two_tower("clip")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = type(model).from_pretrained(tmp_path).eval()
    x = images(2)
    directions = vitexplain.text_embeddings(model, TEXTS)
    maps = vitexplain.explain_texts(model, x, TEXTS, "clip_surgery", prompts=TEXTS)
    for t in range(len(TEXTS)):
        torch.testing.assert_close(maps[:, t], explain(model, x, "clip_surgery", directions[t], prompts=directions),
                                   rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(explain(model, x, "clip_surgery", TEXTS[1], prompts=TEXTS), maps[:, 1],
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(explain(model, x, "clip_surgery", TEXTS[1], redundant=""),
                               explain(model, x, "clip_surgery", directions[1],
                                       redundant=vitexplain.text_embeddings(model, "")[0]), rtol=1e-4, atol=1e-5)


def test_the_model_is_left_as_it_was_after_an_error():
    visual, x = randomise(open_clip_vit()), images(2)
    before = _snapshot(visual)

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = visual.transformer.resblocks[-1].mlp.register_forward_hook(explode)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            explain(visual, x, "clip_surgery", torch.randn(16), prompts=torch.randn(3, 16))
    finally:
        handle.remove()
    _assert_same(before, _snapshot(visual))


def test_refusals_in_one_line():
    for name, why in (("swin", "attends within windows"), ("swinv2_cr", "attends within windows")):
        with pytest.raises(UnsupportedModelError, match=why) as refusal:
            explain(build(name), images(1), "clip_surgery", 0)
        assert "\n" not in str(refusal.value)
    visual, x = randomise(open_clip_vit()), images(1)
    model = build("vit")
    direction, three = torch.randn(16), torch.randn(3, 16)
    for options, why in ((dict(model=model, target=0, prompts=torch.randn(3, 10)), "compares embedding directions"),
                         (dict(model=visual, target=direction, prompts=three, redundant=direction), "not both"),
                         (dict(model=visual, target=torch.ones(16), prompts=torch.ones(1, 16)), "at least two prompts"),
                         (dict(model=visual, target=direction, prompts=three[:, :8]), r"directions \[T, 16\]")):
        with pytest.raises(ValueError, match=why) as refusal:
            explain(options.pop("model"), x, "clip_surgery", options.pop("target"), **options)
        assert "\n" not in str(refusal.value)


def test_bfloat16_autocast_gives_the_float32_map(tower):
    visual, x, prompts, _, _ = tower
    reference = explain(visual, x, "clip_surgery", prompts[0], prompts=prompts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = explain(visual, x, "clip_surgery", prompts[0], prompts=prompts)
    torch.testing.assert_close(autocast, reference, rtol=1e-5, atol=1e-7)
