"""Grad-ECLIP: equal to the paper's equations written out here on a tiny model (the last attention's output
gradient, the min-max cosine of the class token's query with each patch key, their product with the values, a
ReLU), at a class token and at an attention pool, with the model's heads and as one head; on every two-tower family
vitexplain serves, batched as one by one, texts and classes; the model left as it was; refusals in one line; the
same maps under bfloat16 autocast. The comparison with the authors' code is in docs/decisions/clip-methods.md."""
from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

import vitexplain
from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError

from reference import manual_blocks
from test_instrumentation import _assert_same, _snapshot
from zoo import build, images, open_clip_vit, randomise


def _min_max(values):
    low, high = values.amin(-1, keepdim=True), values.amax(-1, keepdim=True)
    return (values - low) / (high - low)


def _attend(q, k, v, heads):
    """softmax(q kᵀ / √d) v with ``heads`` heads over [B, N, C] -> [B, N, C]."""
    split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    return (torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v).transpose(1, 2).flatten(2)


def _paper_map(score, o, q, k, v, patches):
    """The paper's map: w = ∂S/∂o at the query (row 0), λ = min-max over the patches of cos(q, k_i),
    ReLU(λ_i w · v_i)."""
    (gradient,) = torch.autograd.grad(score.sum(), o)
    w = gradient[:, 0]
    spatial = _min_max(F.cosine_similarity(q[:, :1], k[:, patches], dim=-1))
    return (spatial * (v[:, patches] * w[:, None]).sum(-1)).clamp(min=0).reshape(len(o), 4, 4)


def _written_out_open_clip(visual, x, direction, one_head):
    """open_clip's image tower by hand, its last attention as one head over all channels when ``one_head``."""
    tokens = visual.conv1(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([visual.class_embedding.expand(len(x), 1, -1), tokens], 1) + visual.positional_embedding
    tokens = visual.ln_pre(tokens)
    blocks = visual.transformer.resblocks
    for index, block in enumerate(blocks):
        q, k, v = F.linear(block.ln_1(tokens), block.attn.in_proj_weight, block.attn.in_proj_bias).chunk(3, -1)
        o = _attend(q, k, v, 1 if one_head and index == len(blocks) - 1 else block.attn.num_heads)
        tokens = tokens + block.ls_1(block.attn.out_proj(o))
        tokens = tokens + block.ls_2(block.mlp(block.ln_2(tokens)))
    score = F.cosine_similarity(visual.ln_post(tokens[:, 0]) @ visual.proj, direction, dim=-1)
    return _paper_map(score, o, q, k, v, slice(1, None))


@pytest.mark.parametrize("heads", ["model", "one"])
def test_grad_eclip_is_the_papers_equations_at_a_class_token(heads):
    visual, x = randomise(open_clip_vit(layers=3)), images(3)
    direction = torch.randn(3, 16, generator=torch.Generator().manual_seed(5))
    expected = _written_out_open_clip(visual, x, direction, heads == "one")
    torch.testing.assert_close(explain(visual, x, "grad_eclip", direction, heads=heads), expected.detach(),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("heads", ["model", "one"])
def test_grad_eclip_is_the_papers_equations_at_an_attention_pool(heads):
    """A SigLIP-style tower: the last attention is the pooling head's, its learnt query in the class token's place."""
    model, x = build("vit_map", num_classes=0), images(3)
    direction = torch.randn(3, 48, generator=torch.Generator().manual_seed(5))
    pool = model.attn_pool
    tokens = model.norm(manual_blocks(model, x)[1][-1])
    q = pool.q(pool.latent).expand(len(x), -1, -1)
    k, v = pool.kv(tokens + (pool.pos_embed if pool.pos_embed is not None else 0)).chunk(2, -1)
    o = _attend(q, k, v, 1 if heads == "one" else pool.num_heads)
    pooled = pool.proj(o)
    pooled = (pooled + pool.mlp(pool.norm(pooled)))[:, 0]
    score = F.cosine_similarity(model.head(model.fc_norm(pooled)), direction, dim=-1)
    expected = _paper_map(score, o, q, k, v, slice(None)).detach()
    torch.testing.assert_close(explain(model, x, "grad_eclip", direction, heads=heads), expected, rtol=1e-4, atol=1e-6)


def _two_towers():
    """Every two-tower family vitexplain serves, tiny and random: name -> (model, output width)."""
    from test_two_tower import two_tower

    clip_tower = randomise(timm.create_model("vit_base_patch16_clip_224", pretrained=False, img_size=32, patch_size=8,
                                             embed_dim=48, depth=2, num_heads=3, num_classes=16))
    return {"transformers CLIPModel": (two_tower("clip")[0], 24),
            "transformers SiglipModel": (two_tower("siglip")[0], 48),
            "open_clip VisionTransformer": (randomise(open_clip_vit()), 16), "timm CLIP tower": (clip_tower, 16),
            "timm SigLIP tower": (build("vit_map", num_classes=0), 48)}


def test_every_two_tower_family_batched_as_one_by_one_and_left_as_it_was():
    x = images(2)
    for name, (model, width) in _two_towers().items():
        direction = torch.randn(2, width, generator=torch.Generator().manual_seed(1))
        before = _snapshot(model)
        for heads in ("model", "one"):
            maps = explain(model, x, "grad_eclip", direction, heads=heads)
            assert maps.shape == (2, 4, 4) and maps.isfinite().all() and (maps >= 0).all() and maps.amax() > 0, name
            alone = torch.cat([explain(model, x[i:i + 1], "grad_eclip", direction[i:i + 1], heads=heads)
                               for i in range(2)])
            torch.testing.assert_close(maps, alone, rtol=1e-4, atol=1e-6)
        _assert_same(before, _snapshot(model))


def test_texts_and_classes(tmp_path):
    """Each text of ``explain_texts`` is its text embedding as the direction; classes score their logit."""
    from test_two_tower import TEXTS, two_tower

    model, tok = two_tower("clip")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = type(model).from_pretrained(tmp_path).eval()
    x = images(2)
    maps = vitexplain.explain_texts(model, x, TEXTS, "grad_eclip")
    directions = vitexplain.text_embeddings(model, TEXTS)
    for t in range(len(TEXTS)):
        torch.testing.assert_close(maps[:, t], explain(model, x, "grad_eclip", directions[t]), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(maps[:, 0], explain(model, x, "grad_eclip", TEXTS[0]), rtol=1e-4, atol=1e-6)
    classifier, x = build("vit"), images(2)
    first, second = explain(classifier, x, "grad_eclip", 1), explain(classifier, x, "grad_eclip", 2)
    assert first.isfinite().all() and not torch.allclose(first, second)


def test_the_model_is_left_as_it_was_after_an_error():
    visual, x = randomise(open_clip_vit()), images(2)
    before = _snapshot(visual)

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = visual.transformer.resblocks[-1].mlp.register_forward_hook(explode)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            explain(visual, x, "grad_eclip", torch.randn(16), heads="one")
    finally:
        handle.remove()
    _assert_same(before, _snapshot(visual))


@pytest.mark.parametrize("name, why", [("beit_shared", "per-head bias"), ("srelpos", "per-head bias"),
                                       ("swinv2", "cosine scores")])
def test_one_head_is_refused_in_one_line_where_heads_differ_by_more_than_q_and_k(name, why):
    model, x = build(name), images(1)
    with pytest.raises(UnsupportedModelError, match=why) as refusal:
        explain(model, x, "grad_eclip", 0, heads="one")
    assert "\n" not in str(refusal.value) and "heads='model'" in str(refusal.value)
    assert explain(model, x, "grad_eclip", 0).isfinite().all()  # the model's own heads: defined


def test_bfloat16_autocast_gives_the_float32_map():
    visual, x = randomise(open_clip_vit()), images(2)
    direction = torch.randn(16, generator=torch.Generator().manual_seed(3))
    reference = explain(visual, x, "grad_eclip", direction)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = explain(visual, x, "grad_eclip", direction)
    torch.testing.assert_close(autocast, reference, rtol=1e-5, atol=1e-7)
