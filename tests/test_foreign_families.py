"""Families outside timm (torchvision, transformers' headless ViTs and DINOv2, open_clip), and timm's parallel
blocks and avgmax pooling: recognised with their readout, the instrumented forward equal to the model's own output,
and GAE equal to GAE computed from a forward written out by hand from each model's parameters (its own attention
probabilities, in the graph)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitexplain import explain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for

from test_instrumentation import _assert_same, _snapshot
from zoo import FOREIGN, ZOO, build, images, timm_copy_of_open_clip_vit, timm_copy_of_torchvision_vit


def _attention(q, k, v, heads):
    """softmax(q kᵀ/√D) v over ``heads`` heads of [B, N, C] projections; the probabilities keep their gradient."""
    batch, tokens, width = q.shape
    q, k, v = (t.reshape(batch, tokens, heads, -1).transpose(1, 2) for t in (q, k, v))
    attn = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)
    attn.retain_grad()
    return (attn @ v).transpose(1, 2).reshape(batch, tokens, width), attn


def _packed(attention, h):
    """``nn.MultiheadAttention`` on tokens [B, N, C] written out: the packed projection, the heads, ``out_proj``."""
    q, k, v = F.linear(h, attention.in_proj_weight, attention.in_proj_bias).chunk(3, dim=-1)
    mixed, attn = _attention(q, k, v, attention.num_heads)
    return attention.out_proj(mixed), attn


def torchvision_by_hand(model, x):
    """(output, each block's attention probabilities [B, H, N, N], readout weights [B, N])."""
    patches = model.conv_proj(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([model.class_token.expand(x.shape[0], -1, -1), patches], 1) + model.encoder.pos_embedding
    attentions = []
    for block in model.encoder.layers:
        mixed, attn = _packed(block.self_attention, block.ln_1(tokens))
        tokens = tokens + mixed
        tokens = tokens + block.mlp(block.ln_2(tokens))
        attentions.append(attn)
    return model.heads(model.encoder.ln(tokens)[:, 0]), attentions, _class_token_readout(tokens)


def _class_token_readout(tokens):
    readout = torch.zeros(tokens.shape[:2])
    readout[:, 0] = 1
    return readout


def _separate(attention, h, heads):
    """Three projections and an output projection, as transformers' attention modules hold them."""
    mixed, attn = _attention(attention.q_proj(h), attention.k_proj(h), attention.v_proj(h), heads)
    return attention.o_proj(mixed), attn


def transformers_vit_model_by_hand(model, x):
    embeddings = model.embeddings
    patches = embeddings.patch_embeddings.projection(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([embeddings.cls_token.expand(x.shape[0], -1, -1), patches], 1) + embeddings.position_embeddings
    attentions = []
    for layer in model.layers:
        mixed, attn = _separate(layer.attention, layer.layernorm_before(tokens), layer.attention.num_attention_heads)
        tokens = tokens + mixed
        tokens = tokens + layer.mlp(layer.layernorm_after(tokens))
        attentions.append(attn)
    return model.pooler(model.layernorm(tokens)), attentions, _class_token_readout(tokens)


def dinov2_by_hand(model, x):
    """DINOv2: [CLS] and patches with positions, then the registers; LayerScale on both branches; the normed [CLS]
    token, or the classifier on it concatenated with the patch tokens' mean (readout: half each)."""
    base = model.base_model
    embeddings, registers = base.embeddings, getattr(base.config, "num_register_tokens", 0)
    patches = embeddings.patch_embeddings.projection(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([embeddings.cls_token.expand(x.shape[0], -1, -1), patches], 1) + embeddings.position_embeddings
    if registers:
        tokens = torch.cat([tokens[:, :1], embeddings.register_tokens.expand(x.shape[0], -1, -1), tokens[:, 1:]], 1)
    attentions = []
    for layer in base.encoder.layer:
        mixed, attn = _separate(layer.attention, layer.norm1(tokens), layer.attention.num_attention_heads)
        tokens = tokens + layer.layer_scale1.lambda1 * mixed
        h = layer.norm2(tokens)
        mlp = layer.mlp
        branch = (mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)) if hasattr(mlp, "gate_proj")
                  else mlp.fc2(F.gelu(mlp.fc1(h))))
        tokens = tokens + layer.layer_scale2.lambda1 * branch
        attentions.append(attn)
    normed = base.layernorm(tokens)
    readout = _class_token_readout(tokens)
    if not hasattr(model, "classifier"):
        return normed[:, 0], attentions, readout
    patch_tokens = normed[:, 1 + registers:]
    readout = readout / 2
    readout[:, 1 + registers:] = 1 / (2 * patch_tokens.shape[1])
    return model.classifier(torch.cat([normed[:, 0], patch_tokens.mean(1)], 1)), attentions, readout


def parallel_blocks_by_hand(model, x):
    """timm's ViT with ParallelScalingBlocks (ViT-22B): x + γ·(attn_out(attn(h)) + mlp_out(act(h W_mlp + b))),
    h = LN(x), one in_proj giving the MLP's units and q, k, v; average pooling of the patch tokens."""
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    attentions = []
    for block in model.blocks:
        h = block.in_norm(tokens)
        units, q, k, v = block.in_proj(h).split(block.in_split, dim=-1)
        mixed, attn = _attention(q, k, v, block.num_heads)
        branch = block.attn_out_proj(mixed) + block.mlp_out_proj(F.gelu(units + block.mlp_bias))
        tokens = tokens + block.ls.gamma * branch
        attentions.append(attn)
    readout = torch.zeros(tokens.shape[:2])
    readout[:, model.num_prefix_tokens:] = 1 / (tokens.shape[1] - model.num_prefix_tokens)
    return model.forward_head(model.norm(tokens)), attentions, readout


def naflexvit_by_hand(model, x):
    """timm's NaFlexVit on images: cut into patches flattened as (row, column, channel), a Linear, the learnt 16×16
    position table resized to the grid (bicubic, antialiased) added to the patches only, then the register tokens
    put first; LayerScale on both branches; the mean of the patch tokens, ``fc_norm``, the classifier."""
    embeds, (batch, channels, height, width) = model.embeds, x.shape
    ph, pw = embeds.patch_size
    rows, columns = height // ph, width // pw
    patches = x.reshape(batch, channels, rows, ph, columns, pw).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)
    table = F.interpolate(embeds.pos_embed.permute(0, 3, 1, 2), size=(rows, columns), mode="bicubic",
                          antialias=True, align_corners=False)
    tokens = embeds.proj(patches) + table.flatten(2).transpose(1, 2)
    tokens = torch.cat([embeds.reg_token.expand(batch, -1, -1), tokens], 1)
    attentions = []
    for block in model.blocks:
        mixed, attn = _attention(*block.attn.qkv(block.norm1(tokens)).chunk(3, dim=-1), block.attn.num_heads)
        tokens = tokens + block.ls1.gamma * block.attn.proj(mixed)
        tokens = tokens + block.ls2.gamma * block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(tokens))))
        attentions.append(attn)
    prefix = embeds.reg_token.shape[1]
    readout = torch.zeros(tokens.shape[:2])
    readout[:, prefix:] = 1 / (tokens.shape[1] - prefix)
    return model.head(model.fc_norm(tokens[:, prefix:].mean(1))), attentions, readout


def max_pooled_by_hand(model, x):
    """timm's ViT pooling by half the mean plus half the per-channel maximum of the patch tokens (``avgmax``), or by
    the maximum alone (``max``); prefix tokens excluded. The readout row is the pooling's derivative summed over
    channels, divided by their number: for ``avgmax`` 1/(2N) per token plus half the share of channels whose
    maximum the token holds (docs/decisions/readouts.md)."""
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
    attentions = []
    for block in model.blocks:
        q, k, v = block.attn.qkv(block.norm1(tokens)).chunk(3, dim=-1)
        mixed, attn = _attention(q, k, v, block.attn.num_heads)
        tokens = tokens + block.attn.proj(mixed)
        tokens = tokens + block.mlp(block.norm2(tokens))
        attentions.append(attn)
    patches = model.norm(tokens)[:, model.num_prefix_tokens:]

    def pool(t):
        return (t.mean(1) + t.max(1).values) / 2 if model.global_pool == "avgmax" else t.max(1).values

    held = patches.detach().requires_grad_(True)
    per_token = torch.autograd.grad(pool(held).sum(), held)[0].sum(-1) / held.shape[-1]
    readout = F.pad(per_token, (model.num_prefix_tokens, 0))
    return model.head(model.fc_norm(pool(patches))), attentions, readout


def _open_clip_blocks(model, x):
    """open_clip's image tower written out batch first up to each block: [(block output, attention probabilities)]:
    class token, positions, ln_pre, blocks with LayerScale."""
    patches = model.conv1(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([model.class_embedding.expand(x.shape[0], 1, -1), patches], 1) + model.positional_embedding
    tokens = model.ln_pre(tokens)
    outputs = []
    for block in model.transformer.resblocks:
        mixed, attn = _packed(block.attn, block.ln_1(tokens))
        tokens = tokens + block.ls_1.gamma * mixed
        tokens = tokens + block.ls_2.gamma * block.mlp(block.ln_2(tokens))
        outputs.append((tokens, attn))
    return outputs


def _open_clip_head(model, tokens):
    """ln_post before (or after) the class-token or patch-mean pooling, then the projection."""
    if model.pool_type == "avg":
        if model.final_ln_after_pool:
            pooled = model.ln_post(tokens[:, 1:].mean(1))
        else:
            pooled = model.ln_post(tokens)[:, 1:].mean(1)
    else:
        pooled = model.ln_post(tokens)[:, 0]
    return pooled @ model.proj


def open_clip_by_hand(model, x):
    outputs = _open_clip_blocks(model, x)
    tokens = outputs[-1][0]
    readout = torch.zeros(tokens.shape[:2])
    if model.pool_type == "avg":
        readout[:, 1:] = 1 / (tokens.shape[1] - 1)
    else:
        readout[:, 0] = 1
    return _open_clip_head(model, tokens), [attn for _, attn in outputs], readout


BY_HAND = {"vit_pwee": parallel_blocks_by_hand, "naflexvit": naflexvit_by_hand, "torchvision_vit": torchvision_by_hand,
           "hf_vit_model": transformers_vit_model_by_hand,
           "dinov2": dinov2_by_hand, "dinov2_reg_swiglu_classifier": dinov2_by_hand, "vit_avgmax": max_pooled_by_hand,
           "vit_max": max_pooled_by_hand,
           "open_clip_vit": open_clip_by_hand, "open_clip_vit_avg": open_clip_by_hand}


def _target(output, has_classes):
    """Each image's predicted class, or (headless models) a fixed direction in the embedding space."""
    if has_classes:
        return output.argmax(-1)
    return torch.randn(output.shape[-1], generator=torch.Generator().manual_seed(5))


def _score(output, target):
    """The logit of each image's class, or the cosine of the output with a direction (targets.py)."""
    if not target.is_floating_point():
        return output.gather(1, target[:, None]).sum()
    return F.cosine_similarity(output, target[None], dim=1).sum()


@pytest.mark.parametrize("name", list(BY_HAND))
def test_recognised_with_its_readout_and_outputs_equal_the_models(name):
    model, x = build(name), images(2)
    adapter = adapter_for(model)
    assert adapter.readout == {**ZOO, **FOREIGN}[name].readout
    assert adapter.num_blocks == 2 and adapter.grid_size(x) == (4, 4)
    with torch.no_grad():
        own = adapter.forward(x)
    record = adapter.record(x, _target(own, adapter.family.has_classes), grads=("attn",))
    assert (record.logits - own).norm() <= 1e-5 * own.norm()
    with torch.no_grad():
        subsets = adapter.logits_on_tokens(x, torch.arange(16).expand(2, 1, 16))[:, 0]
    assert (subsets - own).norm() <= 1e-5 * own.norm()


@pytest.mark.parametrize("name", list(BY_HAND))
def test_gae_equals_gae_of_the_forward_written_by_hand(name):
    model, x = build(name), images(2, seed=3)
    has_classes = adapter_for(model).family.has_classes
    output, attentions, readout = BY_HAND[name](model, x)
    with torch.no_grad():
        torch.testing.assert_close(output, adapter_for(model).forward(x), rtol=1e-5, atol=1e-6)
    target = _target(output.detach(), has_classes)
    _score(output, target).backward()
    prefix = adapter_for(model).num_prefix_tokens
    found = explain(model, x, "gae", target=target)
    for image in range(2):
        relevance = torch.eye(attentions[0].shape[-1])
        for attn in attentions:  # Chefer et al. 2021b, Eq. 5-6: R += mean_h (∇A ⊙ A)⁺ R
            relevance = relevance + (attn.grad[image] * attn[image]).clamp(min=0).mean(0).detach() @ relevance
        row = readout[image] @ relevance
        torch.testing.assert_close(found[image], row[prefix:].reshape(4, 4), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", list(FOREIGN))
def test_model_left_as_found_also_after_an_exception(name):
    model = build(name).train()
    x = images(2)
    adapter = adapter_for(model)
    with torch.no_grad():
        target = _target(adapter.forward(x), adapter.family.has_classes)
    before = _snapshot(model)
    explain(model, x, "tokentm", target=target)

    def explode(module, args, output):
        raise RuntimeError("injected")

    last = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-2]
    handle = last.register_forward_hook(explode)
    before["hooks"] = _snapshot(model)["hooks"]
    with pytest.raises(RuntimeError, match="injected"):
        explain(model, x, "gae", target=target)
    _assert_same(before, _snapshot(model))
    handle.remove()


#: models whose attention is torch's nn.MultiheadAttention (packed input projection), and the timm ViT holding the
#: same weights
TIMM_COPIES = {"torchvision_vit": timm_copy_of_torchvision_vit, "open_clip_vit": timm_copy_of_open_clip_vit,
               "open_clip_vit_avg": timm_copy_of_open_clip_vit}


@pytest.mark.parametrize("name", list(TIMM_COPIES))
def test_lrp_through_packed_attention_equals_lrp_on_the_timm_copy(name):
    """One network, one relevance: every rule set gives torchvision's and open_clip's ViTs (q, k, v from rows of the
    packed in_proj_weight, open_clip's bare ``@ proj`` as the head, sequence-first blocks) the relevance of the timm
    ViT holding their weights, at every attention map, block boundary, patch embedding and pixel; the forward under
    the rules gives the model's own outputs."""
    from vitexplain.instrumentation import lrp

    model = build(name).double()
    copy, x, targets = TIMM_COPIES[name](model), images(2).double(), torch.tensor([3, 7])
    with torch.no_grad():
        own = model(x)
    for rules in lrp.RULE_SETS:
        found = lrp.relevance(adapter_for(model, classes=True), x, targets, rules)
        expected = lrp.relevance(adapter_for(copy), x, targets, rules)
        torch.testing.assert_close(found.logits, own, rtol=0, atol=1e-12)
        assert all(ours.abs().amax() > 0 for ours in (*found.residuals, found.patches, found.pixels))
        for ours, timms in zip([*found.attn, *found.residuals, found.patches, found.pixels],
                               [*expected.attn, *expected.residuals, expected.patches, expected.pixels]):
            torch.testing.assert_close(ours, timms, rtol=1e-9, atol=1e-12 * timms.abs().amax().item(), msg=rules)


@pytest.mark.parametrize("name", ["torchvision_vit", "open_clip_vit"])
def test_lrp_leaves_packed_attention_models_and_their_description_as_found(name):
    from vitexplain.instrumentation import lrp

    model, x = build(name).train(), images(2)
    adapter = adapter_for(model, classes=True)
    before, described = _snapshot(model), dict(vars(adapter.family))
    for rules in lrp.RULE_SETS:
        lrp.relevance(adapter, x, None, rules)

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model.conv_proj.register_forward_hook(explode) if name == "torchvision_vit" else \
        model.ln_post.register_forward_hook(explode)
    with pytest.raises(RuntimeError, match="injected"):
        lrp.relevance(adapter, x, None, "attnlrp")
    handle.remove()
    _assert_same(before, _snapshot(model))
    assert vars(adapter.family) == described  # the LRP forward put in place of the family's is gone


def test_torchvision_lrp_refuses_a_convolutional_stem_and_a_tanh_head_naming_them():
    from torchvision.models.vision_transformer import ConvStemConfig

    stem = build("torchvision_vit", conv_stem_configs=[ConvStemConfig(out_channels=8, kernel_size=3, stride=2)] * 3)
    assert explain(stem, images(1), "gae").shape == (1, 4, 4)  # the stem is part of the patch embedding
    with pytest.raises(UnsupportedModelError, match="its patch embedding is a convolutional stem"):
        explain(stem, images(1), "attnlrp")
    with pytest.raises(UnsupportedModelError, match=r"heads.act \(Tanh\) has no LRP rule"):
        explain(build("torchvision_vit", representation_size=20), images(1), "lrp")


@pytest.mark.parametrize("rules", ["chefer", "lrp"])
@pytest.mark.parametrize("name", ["dinov2_reg_swiglu_classifier", "vit_pwee", "vit_avgmax", "vit_max",
                                  "torchvision_vit", "open_clip_vit"])
def test_lrp_conserves_relevance_through_every_block(name, rules, monkeypatch):
    """LayerScale, the SwiGLU gate (signal-take-all), the registers, parallel blocks (in_proj read by both
    branches, the MLP bias a constant), avgmax / max pooling (the maximum passes its relevance to the token holding
    it) and nn.MultiheadAttention's packed projection (torchvision, open_clip; its output taken as class scores) keep
    the Chefer-style sets conservative."""
    from vitexplain.instrumentation import lrp

    monkeypatch.setattr(lrp.rules.core, "STABILISER", 1e-300)
    model = build(name)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.normal_(0, 0.3)
    model = model.double()
    found = lrp.relevance(adapter_for(model, classes=True), images(2).double(), None, rules)
    for relevance in found.residuals:
        torch.testing.assert_close(relevance.sum((1, 2)), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(found.pixels.sum((1, 2, 3)), found.patches.sum((1, 2)))


def test_tokentm_refuses_parallel_blocks_with_its_reason():
    with pytest.raises(UnsupportedModelError, match="parallel blocks add the attention and the MLP to the same input"):
        explain(build("vit_pwee"), images(1), "tokentm")


@pytest.mark.parametrize("name", ["open_clip_vit", "open_clip_vit_avg"])
def test_legrad_on_sequence_first_blocks_equals_legrad_by_hand(name):
    """LeGrad (released readout) on open_clip's sequence-first blocks: block l's score is the cosine with the direction
    of the head on a sequence whose every token is the mean of block l's output tokens; its map the mean over heads
    and queries of ReLU(∂s^l/∂A^l), summed over the last two blocks."""
    model, x = build(name), images(2, seed=4)
    assert adapter_for(model).family.sequence_first
    direction = torch.randn(16, generator=torch.Generator().manual_seed(2))
    total = 0
    for tokens, attn in _open_clip_blocks(model, x):
        mean = tokens.mean(1, keepdim=True).expand_as(tokens)
        score = F.cosine_similarity(_open_clip_head(model, mean), direction[None], dim=1).sum()
        total = total + torch.autograd.grad(score, attn)[0].clamp(min=0).mean(1).mean(1)
    found = explain(model, x, "legrad", target=direction, normalise=False)
    torch.testing.assert_close(found, total[:, 1:].reshape(2, 4, 4), rtol=1e-4, atol=1e-7)
