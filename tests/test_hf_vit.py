"""Hugging Face transformers ViT / DeiT: the same weights as a timm ViT give the same recording and maps."""
import pytest
import torch
from transformers import (
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    ViTConfig,
    ViTForImageClassification,
    ViTForMaskedImageModeling,
)

import vitexplain
from vitexplain.instrumentation import (
    BLOCK_FIELDS,
    UnsupportedModelError,
    adapter_for,
    family_of,
    lrp,
)
from vitexplain.instrumentation.families.hf_vit import TransformersViT
from vitexplain.instrumentation.lrp import RULE_SETS

from conftest import make_vit
from quick import method_options
from test_instrumentation import _assert_same, _snapshot

HF_TINY = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
               intermediate_size=96, num_labels=10, layer_norm_eps=1e-6, qkv_bias=True)
#: (timm distilled?, transformers attention): ViT with eager attention, DeiT with teacher with SDPA.
VARIANTS = [(False, "eager"), (True, "sdpa")]


def hf_from_timm(timm_model, attention: str):
    """The transformers model holding a timm (distilled) ViT's weights, written out layer by layer."""
    distilled = getattr(timm_model, "dist_token", None) is not None
    if distilled:
        config_class, model_class = DeiTConfig, DeiTForImageClassificationWithTeacher
    else:
        config_class, model_class = ViTConfig, ViTForImageClassification
    model = model_class(config_class(**HF_TINY, attn_implementation=attention)).eval()
    base = model.base_model
    pairs = [(base.embeddings.patch_embeddings.projection, timm_model.patch_embed.proj),
             (base.layernorm, timm_model.norm)]
    if distilled:
        pairs += [(model.cls_classifier, timm_model.head), (model.distillation_classifier, timm_model.head_dist)]
    else:
        pairs.append((model.classifier, timm_model.head))
    with torch.no_grad():
        base.embeddings.cls_token.copy_(timm_model.cls_token)
        base.embeddings.position_embeddings.copy_(timm_model.pos_embed)
        if distilled:
            base.embeddings.distillation_token.copy_(timm_model.dist_token)
        for layer, block in zip(base.layers, timm_model.blocks):
            attention_module = layer.attention
            for linear, weight, bias in zip((attention_module.q_proj, attention_module.k_proj, attention_module.v_proj),
                                            block.attn.qkv.weight.chunk(3), block.attn.qkv.bias.chunk(3)):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
            pairs += [(attention_module.o_proj, block.attn.proj), (layer.layernorm_before, block.norm1),
                      (layer.layernorm_after, block.norm2), (layer.mlp.fc1, block.mlp.fc1),
                      (layer.mlp.fc2, block.mlp.fc2)]
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)
    return model


@pytest.fixture(scope="module")
def twins():
    """(timm model, the same weights in transformers) per variant."""
    models = {}
    for distilled, attention in VARIANTS:
        timm_model = make_vit(distilled=distilled)
        models[distilled, attention] = timm_model, hf_from_timm(timm_model, attention)
    return models


def _images(batch=2, seed=1):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _close(got, expected, tolerance=1e-4):
    scale = expected.abs().max().clamp_min(1e-12)
    assert ((got - expected).abs().max() / scale) < tolerance


@pytest.mark.parametrize("variant", VARIANTS)
def test_recording_equals_the_timm_twins(twins, variant):
    timm_model, hf_model = twins[variant]
    images = _images()
    grads = BLOCK_FIELDS + ("input",)
    expected = adapter_for(timm_model).record(images, grads=grads)
    adapter = adapter_for(hf_model)
    assert isinstance(adapter.family, TransformersViT)
    got = adapter.record(images, grads=grads)
    assert got.geometry.grid == expected.geometry.grid == (4, 4)
    assert got.geometry.num_prefix_tokens == expected.geometry.num_prefix_tokens == 1 + variant[0]
    _close(got.logits, expected.logits, 1e-5)
    _close(got.input_grad, expected.input_grad)
    for mine, theirs in zip(got.blocks, expected.blocks, strict=True):
        for name in BLOCK_FIELDS:
            _close(getattr(mine, name), getattr(theirs, name), 1e-5)
            _close(mine.grads[name], theirs.grads[name])
        _close(mine.head_projection, theirs.head_projection, 1e-6)
        _close(mine.output, theirs.output, 1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("method", vitexplain.available_methods())
def test_every_method_gives_the_maps_of_the_timm_twin(twins, variant, method):
    """Every method runs unchanged, the LRP family (rules placed from the family description) included."""
    timm_model, hf_model = twins[variant]
    images = _images()
    target = torch.tensor([3, 7])
    options = method_options(method)
    got = vitexplain.explain(hf_model, images, method, target=target, **options)
    expected = vitexplain.explain(timm_model, images, method, target=target, **options)
    assert got.shape == expected.shape
    _close(got, expected)


@pytest.mark.parametrize("rules", sorted(RULE_SETS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_lrp_relevance_at_every_stage_equals_the_timm_twins(twins, variant, rules):
    """Not just the pixels: the relevance of every attention map, block boundary and patch embedding."""
    timm_model, hf_model = twins[variant]
    images = _images()
    targets = torch.tensor([3, 7])
    expected, got = (lrp.relevance(adapter_for(model), images, targets, rules=rules)
                     for model in (timm_model, hf_model))
    _close(got.logits, expected.logits, 1e-5)
    for mine, theirs in zip([*got.attn, *got.residuals, got.patches, got.pixels],
                            [*expected.attn, *expected.residuals, expected.patches, expected.pixels], strict=True):
        _close(mine, theirs)


def test_abs_lrp_on_deit_without_teacher_and_model_left_as_found():
    torch.manual_seed(0)
    model = DeiTForImageClassification(DeiTConfig(**HF_TINY)).eval()
    before = _snapshot(model)
    maps = vitexplain.explain(model, _images(), "abs_lrp")
    assert maps.shape == (2, 32, 32) and torch.isfinite(maps).all() and maps.abs().sum() > 0
    _assert_same(before, _snapshot(model))


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_on_token_subsets_equal_the_timm_twins(twins, variant):
    timm_model, hf_model = twins[variant]
    images = _images()
    keep = torch.tensor([[[0, 5, 7], [15, 2, 3]], [[1, 1, 4], [9, 10, 11]]])
    expected = adapter_for(timm_model).logits_on_tokens(images, keep, batch_size=3)
    adapter = adapter_for(hf_model)
    _close(adapter.logits_on_tokens(images, keep, batch_size=3), expected, 1e-5)
    everything = torch.arange(16).expand(2, 1, 16)
    _close(adapter.logits_on_tokens(images, everything)[:, 0], hf_model(pixel_values=images).logits, 1e-5)


def test_deit_without_teacher_has_two_prefix_tokens_and_explains_its_class_head():
    torch.manual_seed(0)
    model = DeiTForImageClassification(DeiTConfig(**HF_TINY)).eval()
    record = adapter_for(model).record(_images(), grads=("attn",))
    assert record.geometry.num_prefix_tokens == 2 and record.blocks[0].attn.shape[-1] == 18
    torch.testing.assert_close(record.logits, model(pixel_values=_images()).logits)
    assert vitexplain.explain(model, _images(), "gae").shape == (2, 4, 4)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_model_left_as_found_and_outputs_unchanged(twins, attention):
    model = hf_from_timm(make_vit(), attention).train()
    images = _images()
    before = _snapshot(model)
    with torch.no_grad():
        expected = model.eval()(pixel_values=images).logits
    model.train()
    for method in ("gae", "tokentm", "tis", "integrated_gradients", "abs_lrp", "transformer_attribution"):
        vitexplain.explain(model, images, method, **method_options(method))
    _assert_same(before, _snapshot(model))
    assert model.config._attn_implementation == attention

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model.base_model.layers[1].mlp.register_forward_hook(explode)
    before["hooks"] = _snapshot(model)["hooks"]
    for method in ("agcam", "abs_lrp"):
        with pytest.raises(RuntimeError, match="injected"):
            vitexplain.explain(model, images, method)
        _assert_same(before, _snapshot(model))
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(pixel_values=images).logits, expected)


def test_what_cannot_be_served_gets_a_reason():
    torch.manual_seed(0)
    with pytest.raises(UnsupportedModelError,
                       match="ViTForMaskedImageModeling is not one of ViTForImageClassification"):
        family_of(ViTForMaskedImageModeling(ViTConfig(**HF_TINY)))
    flex = ViTForImageClassification(ViTConfig(**HF_TINY))
    flex.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedModelError, match="attention implementation is 'flex_attention'"):
        family_of(flex)
    with pytest.raises(ValueError, match="takes 32x32 images, got 48x48"):
        vitexplain.explain(ViTForImageClassification(ViTConfig(**HF_TINY)), torch.randn(1, 3, 48, 48), "gae")


def test_lrp_names_the_module_it_has_no_rule_for():
    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(**HF_TINY)).eval()
    model.base_model.layernorm = torch.nn.Sequential(torch.nn.LayerNorm(HF_TINY["hidden_size"]), torch.nn.Hardtanh())
    before = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match=r"its module vit.layernorm.1 \(Hardtanh\) has no LRP rule"):
        vitexplain.explain(model, _images(), "abs_lrp")
    _assert_same(before, _snapshot(model))
