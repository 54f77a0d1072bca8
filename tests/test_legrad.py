"""LeGrad: equal to a written-out LeGrad (one backward per layer) and to the authors' legrad-torch on the
same weights, held by timm's and transformers' CLIP and SigLIP towers."""
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


def _renamed(root, modules: dict) -> dict:
    """The weight and bias of each of ``root``'s modules (its name -> transformers' name), under transformers' names."""
    weights = {}
    for source, target in modules.items():
        module = root.get_submodule(source)
        weights.update({f"{target}.weight": module.weight, f"{target}.bias": module.bias})
    return weights


def _unpacked_attention(layer: str, weight, bias) -> dict:
    """A packed [q; k; v] projection as transformers' ``q_proj``, ``k_proj`` and ``v_proj`` under ``layer``."""
    parts = zip(("q_proj", "k_proj", "v_proj"), weight.chunk(3), bias.chunk(3))
    return {f"{layer}self_attn.{name}.{kind}": value
            for name, w, b in parts for kind, value in (("weight", w), ("bias", b))}


def _transformers_clip_weights(visual) -> dict:
    """open_clip's ``VisionTransformer`` weights under the names of transformers' CLIP vision transformer."""
    weights = {"embeddings.patch_embedding.weight": visual.conv1.weight,
               "embeddings.class_embedding": visual.class_embedding,
               "embeddings.position_embedding.weight": visual.positional_embedding}
    renamed = {"ln_pre": "pre_layrnorm", "ln_post": "post_layernorm"}  # open_clip module -> transformers module
    for i, block in enumerate(visual.transformer.resblocks):
        layer = f"encoder.layers.{i}."
        weights.update(_unpacked_attention(layer, block.attn.in_proj_weight, block.attn.in_proj_bias))
        in_block = {"attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
                    "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
        renamed.update({f"transformer.resblocks.{i}.{ours}": layer + theirs for ours, theirs in in_block.items()})
    return {**weights, **_renamed(visual, renamed)}


def _transformers_siglip_weights(trunk) -> dict:
    """timm's SigLIP ViT (attention pool) weights under the names of transformers' SigLIP vision transformer (the
    reverse of transformers' big_vision conversion)."""
    pool = trunk.attn_pool
    weights = {"embeddings.position_embedding.weight": trunk.pos_embed[0], "head.probe": pool.latent,
               "head.attention.in_proj_weight": torch.cat([pool.q.weight, pool.kv.weight]),
               "head.attention.in_proj_bias": torch.cat([pool.q.bias, pool.kv.bias])}
    renamed = {"patch_embed.proj": "embeddings.patch_embedding", "norm": "post_layernorm",
               "attn_pool.proj": "head.attention.out_proj", "attn_pool.norm": "head.layernorm",
               "attn_pool.mlp.fc1": "head.mlp.fc1", "attn_pool.mlp.fc2": "head.mlp.fc2"}
    for i, block in enumerate(trunk.blocks):
        layer = f"encoder.layers.{i}."
        weights.update(_unpacked_attention(layer, block.attn.qkv.weight, block.attn.qkv.bias))
        in_block = {"attn.proj": "self_attn.out_proj", "norm1": "layer_norm1", "norm2": "layer_norm2",
                    "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
        renamed.update({f"blocks.{i}.{ours}": layer + theirs for ours, theirs in in_block.items()})
    return {**weights, **_renamed(trunk, renamed)}


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
    getattr(twin, "vision_model", twin).load_state_dict(_transformers_clip_weights(visual))  # CLIPVisionModel: itself
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
    return min_max(upsampled(maps, patch), constant=0.0)


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


def random_siglip_trunk(**overrides):
    """timm's SigLIP ViT (attention pool, no classifier), random, its LayerNorms drawn off (1, 0)."""
    trunk = build("vit_map", **{**dict(depth=4, num_classes=0), **overrides})
    with torch.no_grad():
        for module in trunk.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1, 0.2)
                module.bias.normal_(0, 0.2)
    return trunk


def transformers_siglip_twin(trunk, kind: str):
    """transformers' ``kind`` (``SiglipVisionModel`` or ``SiglipModel``) holding timm's SigLIP ``trunk`` (GELU as
    timm's, not transformers' default tanh approximation; a ``SiglipModel``'s text tower stays random)."""
    import transformers

    blocks = trunk.blocks
    vision = dict(image_size=trunk.patch_embed.img_size[0], patch_size=trunk.patch_embed.patch_size[0],
                  hidden_size=trunk.embed_dim, intermediate_size=blocks[0].mlp.fc1.out_features,
                  num_hidden_layers=len(blocks), num_attention_heads=blocks[0].attn.num_heads, hidden_act="gelu",
                  layer_norm_eps=trunk.norm.eps)
    if kind == "SiglipModel":
        text = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    max_position_embeddings=8, bos_token_id=48, eos_token_id=49, pad_token_id=49,
                    projection_size=trunk.embed_dim)
        twin = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision))
    else:
        twin = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision))
    getattr(twin, "vision_model", twin).load_state_dict(_transformers_siglip_weights(trunk))
    return twin.eval()


def legrad_torch_siglip_maps(legrad, clip, trunk, x, text):
    """``compute_legrad_siglip`` without its text-tower correction, one image per call, on open_clip's timm adapter
    around ``trunk`` (no projection) in place of ``clip``'s image tower: [B, H, W]."""
    from open_clip.timm_model import TimmModel

    tower = TimmModel.__new__(TimmModel)
    torch.nn.Module.__init__(tower)
    tower.trunk, tower.head = copy.deepcopy(trunk), torch.nn.Sequential()
    siglip = copy.deepcopy(clip)
    siglip.visual = tower
    wrapped = legrad.LeWrapper(siglip)
    return torch.cat([wrapped.compute_legrad_siglip(text[i:i + 1], x[i:i + 1], apply_correction=False)[:, 0]
                      for i in range(len(x))]).detach()


def upsampled(maps, patch: int):
    """Our patch maps upsampled as legrad-torch's SigLIP path upsamples its min-maxed maps (bilinear, ×patch)."""
    return F.interpolate(maps[:, None], scale_factor=patch, mode="bilinear")[:, 0]


def test_legrad_equals_legrad_torch_on_a_siglip_tower(open_clip_pair):
    """compute_legrad_siglip (without its text-tower correction): the probe on each layer's tokens."""
    legrad, clip, _ = open_clip_pair
    trunk, x = random_siglip_trunk(), images(3)
    text = F.normalize(torch.randn(3, 48, generator=torch.Generator().manual_seed(3)), dim=-1)
    theirs = legrad_torch_siglip_maps(legrad, clip, trunk, x, text)
    ours = upsampled(explain(trunk, x, "legrad", text), 8)
    assert (_pearson(ours, theirs) > 0.99999).all()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["SiglipVisionModel", "SiglipModel"])
def test_legrad_equals_legrad_torch_on_a_transformers_siglip_tower(open_clip_pair, kind):
    """transformers' SigLIP image tower (``post_layernorm`` then the pooling head) against compute_legrad_siglip on the
    timm trunk it was copied from: the probe reads each layer's tokens without the final norm."""
    legrad, clip, _ = open_clip_pair
    trunk, x = random_siglip_trunk(), images(3)
    twin = transformers_siglip_twin(trunk, kind)
    text = F.normalize(torch.randn(3, 48, generator=torch.Generator().manual_seed(3)), dim=-1)
    with torch.no_grad():
        embedded = (twin.get_image_features(pixel_values=x) if kind == "SiglipModel" else twin(pixel_values=x))
        torch.testing.assert_close(embedded.pooler_output, trunk(x), rtol=1e-5, atol=1e-5)
    ours = upsampled(explain(twin, x, "legrad", text), 8)
    theirs = legrad_torch_siglip_maps(legrad, clip, trunk, x, text)
    assert (_pearson(ours, theirs) > 0.99999).all()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
