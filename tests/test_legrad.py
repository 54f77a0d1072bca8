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


def random_open_clip(*, image_size=32, patch_size=8, width=48, layers=4, heads=3, embed_dim=32):
    """A random open_clip ``CLIP`` (GELU, open_clip's default), its image tower's LayerNorms drawn off (1, 0) so a
    left-out norm shows."""
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(0)
    vision = CLIPVisionCfg(layers=layers, width=width, head_width=width // heads, patch_size=patch_size,
                           image_size=image_size)
    clip = CLIP(embed_dim, vision, CLIPTextCfg(context_length=8, vocab_size=50, width=32, heads=2, layers=1)).eval()
    with torch.no_grad():
        for name, parameter in clip.visual.named_parameters():
            if "ln" in name:
                parameter.normal_(1 if name.endswith("weight") else 0, 0.2)
    return clip


def timm_clip_twin(clip):
    """timm's CLIP ViT holding ``clip``'s image tower, converted by timm's own open_clip converter."""
    from timm.models.vision_transformer import _convert_openai_clip

    visual = clip.visual
    width = visual.conv1.out_channels
    twin = timm.create_model("vit_base_patch16_clip_224", pretrained=False, img_size=visual.image_size[0],
                             patch_size=visual.patch_size[0], embed_dim=width, depth=len(visual.transformer.resblocks),
                             num_heads=visual.transformer.resblocks[0].attn.num_heads,
                             num_classes=visual.proj.shape[1]).eval()
    twin.load_state_dict(_convert_openai_clip(clip.state_dict(), twin))
    return twin


def _transformers_vision_weights(visual) -> dict:
    """open_clip's ``VisionTransformer`` weights under the names of transformers' ``CLIPVisionTransformer``."""
    weights = {"embeddings.patch_embedding.weight": visual.conv1.weight,
               "embeddings.class_embedding": visual.class_embedding,
               "embeddings.position_embedding.weight": visual.positional_embedding}
    renamed = {"ln_pre": "pre_layrnorm", "ln_post": "post_layernorm"}  # open_clip module -> transformers module
    for i, block in enumerate(visual.transformer.resblocks):
        layer = f"encoder.layers.{i}."
        packed = zip(("q_proj", "k_proj", "v_proj"), block.attn.in_proj_weight.chunk(3),
                     block.attn.in_proj_bias.chunk(3))
        for name, weight, bias in packed:
            weights.update({f"{layer}self_attn.{name}.weight": weight, f"{layer}self_attn.{name}.bias": bias})
        in_block = {"attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
                    "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
        renamed.update({f"transformer.resblocks.{i}.{ours}": layer + theirs for ours, theirs in in_block.items()})
    for source, target in renamed.items():
        module = visual.get_submodule(source)
        weights.update({f"{target}.weight": module.weight, f"{target}.bias": module.bias})
    return weights


def transformers_clip_twin(clip, kind: str):
    """transformers' ``kind`` (``CLIPVisionModelWithProjection``, ``CLIPModel`` or ``CLIPVisionModel``) holding
    ``clip``'s image tower (its text tower, where it has one, stays random)."""
    import transformers

    visual = clip.visual
    width, patch = visual.conv1.out_channels, visual.patch_size[0]
    blocks = visual.transformer.resblocks
    vision = dict(image_size=visual.image_size[0], patch_size=patch, hidden_size=width,
                  intermediate_size=blocks[0].mlp.c_fc.out_features, num_hidden_layers=len(blocks),
                  num_attention_heads=blocks[0].attn.num_heads, hidden_act="gelu", layer_norm_eps=visual.ln_pre.eps)
    dim = visual.proj.shape[1]
    if kind == "CLIPModel":
        text = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    max_position_embeddings=8, bos_token_id=48, eos_token_id=49, pad_token_id=49)
        twin = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                              projection_dim=dim))
    else:
        twin = getattr(transformers, kind)(transformers.CLIPVisionConfig(**vision, projection_dim=dim))
    getattr(twin, "vision_model", twin).load_state_dict(_transformers_vision_weights(visual))  # CLIPVisionModel: itself
    if kind != "CLIPVisionModel":
        twin.visual_projection.load_state_dict({"weight": visual.proj.T})
    return twin.eval()


@pytest.fixture(scope="module")
def open_clip_pair():
    """legrad-torch, a tiny random open_clip CLIP and timm's CLIP ViT holding its image tower (legrad-torch is a
    test extra)."""
    legrad = pytest.importorskip("legrad")
    clip = random_open_clip()
    return legrad, clip, timm_clip_twin(clip)


def legrad_torch_clip_maps(legrad, clip, x, text):
    """``compute_legrad_clip`` one image per call (it repeats an image once per prompt): [B, H, W]."""
    wrapped = legrad.LeWrapper(copy.deepcopy(clip))
    return torch.cat([wrapped.compute_legrad_clip(text[i:i + 1], x[i:i + 1])[0] for i in range(len(x))]).detach()


def at_pixels(maps, patch: int):
    """Our patch maps upsampled as legrad-torch upsamples (bilinear, ×patch) and min-maxed there, as its CLIP path."""
    return min_max(F.interpolate(maps[:, None], scale_factor=patch, mode="bilinear")[:, 0], constant=0.0)


def test_legrad_equals_legrad_torch_on_a_clip_vit(open_clip_pair):
    """compute_legrad_clip: the mean token through ln_post and the projection, the attention's gradient."""
    legrad, clip, twin = open_clip_pair
    x = images(3)
    text = F.normalize(torch.randn(3, 32, generator=torch.Generator().manual_seed(2)), dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), clip.encode_image(x), rtol=1e-5, atol=1e-5)
    ours = at_pixels(explain(twin, x, "legrad", text), 8)
    theirs = legrad_torch_clip_maps(legrad, clip, x, text)
    assert (_pearson(ours, theirs) > 0.99999).all()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["CLIPVisionModelWithProjection", "CLIPModel", "CLIPVisionModel"])
def test_legrad_equals_legrad_torch_on_a_transformers_clip_tower(open_clip_pair, kind):
    """transformers' CLIP image tower (``pre_layrnorm`` before the first layer) against compute_legrad_clip on the
    open_clip model it was copied from; ``CLIPVisionModel`` outputs the normed [CLS] token unprojected, so open_clip's
    projection is the identity there."""
    legrad, clip, _ = open_clip_pair
    if kind == "CLIPVisionModel":
        clip = copy.deepcopy(clip)
        clip.visual.proj = torch.nn.Parameter(torch.eye(clip.visual.proj.shape[0]))
    twin, x = transformers_clip_twin(clip, kind), images(3)
    text = F.normalize(torch.randn(3, clip.visual.proj.shape[1], generator=torch.Generator().manual_seed(2)), dim=-1)
    with torch.no_grad():
        embedded = {"CLIPVisionModelWithProjection": lambda: twin(pixel_values=x).image_embeds,
                    "CLIPModel": lambda: twin.get_image_features(pixel_values=x).pooler_output,
                    "CLIPVisionModel": lambda: twin(pixel_values=x).pooler_output}[kind]()
        torch.testing.assert_close(embedded, clip.encode_image(x), rtol=1e-5, atol=1e-5)
    ours = at_pixels(explain(twin, x, "legrad", text), 8)
    theirs = legrad_torch_clip_maps(legrad, clip, x, text)
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
