"""LeGrad: equal to a written-out LeGrad (one backward per layer) and to the authors' legrad-torch on the
same weights."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F

from vitexplain import explain
from vitexplain.instrumentation import LayerScores, UnsupportedModelError, adapter_for
from vitexplain.maps import min_max

from reference import manual_blocks
from zoo import build, images


def _written_out_probe(model, tokens):
    """timm's attention pool, fc_norm and head on tokens [B, N, C], by hand: (outputs, probe attention [B, H, 1, N])."""
    pool = model.attn_pool
    batch, count, width = tokens.shape
    heads, head_width = pool.num_heads, pool.head_dim
    tokens = tokens + pool.pos_embed if pool.pos_embed is not None else tokens
    query = pool.q(pool.latent).reshape(1, 1, heads, head_width).transpose(1, 2)
    key, value = pool.kv(tokens).reshape(batch, count, 2, heads, head_width).permute(2, 0, 3, 1, 4)
    attn = torch.softmax(query @ key.transpose(-1, -2) / head_width ** 0.5, dim=-1)
    pooled = pool.proj((attn @ value).transpose(1, 2).reshape(batch, 1, width))
    pooled = (pooled + pool.mlp(pool.norm(pooled)))[:, 0]
    return model.head(model.fc_norm(pooled)), attn


def _written_out_legrad(model, x, score_of, *, start, released):
    """LeGrad layer by layer: each layer's own score, differentiated alone with respect to its own attention."""
    attentions, stream = manual_blocks(model, x)
    probe = model.global_pool == "map"
    total = 0
    for layer in range(start, len(model.blocks)):
        tokens = stream[layer + 1]
        if probe:
            outputs, attn = _written_out_probe(model, tokens if released else model.norm(tokens))
        else:
            attn = attentions[layer]
            read = tokens.mean(1, keepdim=True) if released else tokens[:, :1]
            outputs = model.head(model.norm(read)[:, 0])
        gradient, = torch.autograd.grad(score_of(outputs).sum(), attn, retain_graph=True)
        total = total + gradient.clamp(min=0).mean(1).mean(1)  # heads, then query rows
    return min_max(total[:, model.num_prefix_tokens:].reshape(-1, 4, 4), constant=0.0).detach()


@pytest.mark.parametrize("name", ["vit", "vit_map"])
@pytest.mark.parametrize("released", [True, False])
@pytest.mark.parametrize("target", ["class", "direction"])
def test_legrad_equals_a_written_out_legrad(name, released, target):
    heads = 0 if target == "direction" else 10
    model, x = build(name, depth=3, num_classes=heads), images(3)
    if target == "direction":
        chosen = torch.randn(3, 48, generator=torch.Generator().manual_seed(4))
        score_of = lambda out: F.cosine_similarity(out, chosen, dim=1)  # noqa: E731
    else:
        chosen = torch.tensor([2, 5, 7])
        score_of = lambda out: out.gather(1, chosen[:, None])[:, 0]  # noqa: E731
    expected = _written_out_legrad(model, x, score_of, start=1, released=released)
    found = explain(model, x, "legrad", chosen, start_layer=1, layer_readout="released" if released else "model")
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5)


def test_the_raw_sum_and_the_default_layers():
    model, x = build("vit", depth=4), images(2)
    raw = explain(model, x, "legrad", 3, normalise=False)
    torch.testing.assert_close(min_max(raw, constant=0.0), explain(model, x, "legrad", 3))
    torch.testing.assert_close(min_max(raw, constant=0.0),
                               explain(model, x, "legrad", 3, start_layer=2))  # the last two blocks
    assert (raw >= 0).all() and not torch.allclose(raw, explain(model, x, "legrad", 3, start_layer=0, normalise=False))


def test_layer_scores_need_the_heads_blocks_and_refuse_what_they_cannot_give():
    swin, x = build("swin"), images(2)
    with pytest.raises(UnsupportedModelError, match="block 0 has 16 tokens, the last block 4"):
        explain(swin, x, "legrad", start_layer=0)
    adapter = adapter_for(build("vit"))
    with pytest.raises(ValueError, match="pass layer_scores"):
        adapter.record(x, grads=("probe_attn",))
    with pytest.raises(ValueError, match="needs an attention-pooling head"):
        adapter.record(x, grads=("probe_attn",), layer_scores=LayerScores((1,)))
    with pytest.raises(ValueError, match="no gradient with respect to the images"):
        adapter.record(x, grads=("attn", "input"), layer_scores=LayerScores((1,)))


# -- the authors' package ------------------------------------------------------------------------------
def _pearson(a, b):
    a, b = a.flatten(1) - a.flatten(1).mean(1, keepdim=True), b.flatten(1) - b.flatten(1).mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


@pytest.fixture(scope="module")
def open_clip_pair():
    """legrad-torch, a tiny random open_clip CLIP (LayerNorms off their init) and timm's CLIP ViT holding its
    image tower's weights, converted by timm's own open_clip converter (legrad-torch is a test extra)."""
    legrad = pytest.importorskip("legrad")
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg
    from timm.models.vision_transformer import _convert_openai_clip

    torch.manual_seed(0)
    vision = CLIPVisionCfg(layers=4, width=48, head_width=16, patch_size=8, image_size=32)
    clip = CLIP(32, vision, CLIPTextCfg(context_length=8, vocab_size=50, width=32, heads=2, layers=1)).eval()
    with torch.no_grad():
        for name, parameter in clip.visual.named_parameters():
            if "ln" in name:
                parameter.normal_(1 if name.endswith("weight") else 0, 0.2)
    twin = timm.create_model("vit_base_patch16_clip_224", pretrained=False, img_size=32, patch_size=8, embed_dim=48,
                             depth=4, num_heads=3, num_classes=32).eval()
    twin.load_state_dict(_convert_openai_clip(clip.state_dict(), twin))
    return legrad, clip, twin


def test_legrad_equals_legrad_torch_on_a_clip_vit(open_clip_pair):
    """compute_legrad_clip: the mean token through ln_post and the projection, the attention's gradient."""
    legrad, clip, twin = open_clip_pair
    x = images(3)
    text = F.normalize(torch.randn(3, 32, generator=torch.Generator().manual_seed(2)), dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), clip.encode_image(x), rtol=1e-5, atol=1e-5)
    wrapped = legrad.LeWrapper(copy.deepcopy(clip))
    theirs = torch.cat([wrapped.compute_legrad_clip(text[i:i + 1], x[i:i + 1])[0] for i in range(3)]).detach()
    ours = explain(twin, x, "legrad", text)
    ours = min_max(F.interpolate(ours[:, None], scale_factor=8, mode="bilinear")[:, 0],
                   constant=0.0)  # they min-max at pixels
    assert (_pearson(ours, theirs) > 0.99999).all()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_legrad_equals_legrad_torch_on_a_siglip_tower(open_clip_pair):
    """compute_legrad_siglip (without its text-tower correction): the probe on each layer's tokens."""
    from open_clip.timm_model import TimmModel

    legrad, clip, _ = open_clip_pair
    trunk, x = build("vit_map", depth=4, num_classes=0), images(3)
    tower = TimmModel.__new__(TimmModel)  # open_clip's timm adapter around our trunk, no projection
    torch.nn.Module.__init__(tower)
    tower.trunk, tower.head = copy.deepcopy(trunk), torch.nn.Sequential()
    siglip = copy.deepcopy(clip)
    siglip.visual = tower
    text = F.normalize(torch.randn(3, 48, generator=torch.Generator().manual_seed(3)), dim=-1)
    wrapped = legrad.LeWrapper(siglip)
    theirs = torch.cat([wrapped.compute_legrad_siglip(text[i:i + 1], x[i:i + 1], apply_correction=False)[:, 0]
                        for i in range(3)]).detach()
    ours = F.interpolate(explain(trunk, x, "legrad", text)[:, None], scale_factor=8, mode="bilinear")[:, 0]
    assert (_pearson(ours, theirs) > 0.99999).all()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
