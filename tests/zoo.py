"""Tiny randomly initialised models of every timm family vitexplain describes, built in the tests.

Parameters that their constructors set to zero or one (relative position tables, q / v biases,
LayerScale gains, heads, pooling latents, Swin V2's position-bias MLP) are drawn at random too, and
norm gains set to zero (Swin V2's and SwinV2-CR's res-post norms) are drawn around one, so that a part left out
of a computation shows in its result.

Swin models are hierarchical: 32 px images, 8 px patches (a 4×4 first-stage grid, as every other
model's), two stages of two blocks, 2×2 windows, so the first stage has four windows and its second
block shifts them; tests/test_swin.py builds larger ones (several windows and shifts in every stage,
padding).
"""
from __future__ import annotations

import functools

import timm
import torch

SIZE = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10)
HF_SIZE = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
               intermediate_size=96)
SWIN_SIZE = dict(img_size=32, patch_size=8, embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=2,
                 num_classes=10)

#: family name -> (timm architecture, constructor arguments over SIZE, expected readout)
ZOO = {
    "vit": ("vit_base_patch16_224", dict(), "token"),
    "vit_avg": ("vit_base_patch16_224", dict(class_token=False, global_pool="avg"), "avg"),
    "vit_reg_avg": ("vit_base_patch16_224", dict(reg_tokens=2, global_pool="avg"), "avg"),
    "vit_map": ("vit_base_patch16_siglip_224", dict(class_token=False, global_pool="map"), "map"),
    "eva02": ("eva02_tiny_patch14_224", dict(patch_size=8, ref_feat_shape=(4, 4)), "avg"),
    "vit_rope": ("vit_base_patch16_rope_224", dict(), "token"),
    "vit_rope_mixed": ("vit_base_patch16_rope_mixed_224", dict(), "token"),
    "vit_rope_reg_gap": ("vit_medium_patch16_rope_reg1_gap_256", dict(), "avg"),
    "beit": ("beit_base_patch16_224", dict(use_abs_pos_emb=True), "avg"),
    "beit_shared": ("beit_base_patch16_224", dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True), "avg"),
    "relpos": ("vit_relpos_base_patch16_224", dict(), "avg"),
    "srelpos": ("vit_srelpos_small_patch16_224", dict(), "avg"),
    "vit_pwee": ("vit_pwee_patch16_reg1_gap_256", dict(qkv_bias=False), "avg"),  # a separate MLP bias
    "vit_avgmax": ("vit_base_patch16_224", dict(class_token=False, reg_tokens=1, global_pool="avgmax"), "avgmax"),
    "vit_max": ("vit_base_patch16_224", dict(global_pool="max"), "max"),
    "naflexvit": ("naflexvit_base_patch16_gap", dict(), "avg"),  # linear patches, 4 registers, LayerScale
    "naflexvit_parfac_map": ("naflexvit_base_patch16_parfac_gap", dict(global_pool="map"), "map"),
    "naflexvit_rope_conv": ("naflexvit_base_patch16_gap", dict(embed_proj_type="conv", class_token=True,
                                                               global_pool="token", rope_type="axial"), "token"),
    "swin": ("swin_tiny_patch4_window7_224", dict(), "avg"),
    "swinv2": ("swinv2_tiny_window8_256", dict(), "avg"),
    "swinv2_cr": ("swinv2_cr_tiny_ns_224", dict(), "avg"),  # an extra norm ending each stage
}

#: what a zero-initialised parameter is called, in any family
RANDOMISED = ("relative_position_bias_table", "q_bias", "v_bias", "gamma", "head.", "latent", "rel_pos", "pos_embed",
              "cls_token", "reg_token", "cpb_mlp", "class_token", "register_tokens",
              "lambda1", "mlp_bias", "in_proj_bias", "out_proj.bias")


def torchvision_vit(**overrides) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**dict(image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=48,
                                       mlp_dim=96, num_classes=10), **overrides})


def _timm_holding(source: torch.nn.Module, names: dict[str, str], blocks: dict[str, str],
                  transposed: tuple[str, ...] = (), **settings) -> torch.nn.Module:
    """A timm ViT (``settings``) holding ``source``'s parameters: ``names`` maps their names (or name prefixes) to
    timm's, ``blocks`` those inside block ``{i}`` of each; the ``transposed`` ones are transposed, every one is
    reshaped to timm's shape, and timm's parameters the source lacks (biases) are zero. In ``source``'s dtype, eval
    mode."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(**settings)
    for index in range(settings["depth"]):
        names.update({theirs.format(i=index): ours.format(i=index) for theirs, ours in blocks.items()})
    own = model.state_dict()
    state = {name: torch.zeros_like(value) for name, value in own.items()}
    for key, value in source.state_dict().items():
        prefix = max((p for p in names if key == p or key.startswith(p + ".")), key=len)
        target = names[prefix] + key[len(prefix):]
        state[target] = (value.t() if key in transposed else value).reshape(own[target].shape)
    model.load_state_dict(state)
    return model.to(next(source.parameters()).dtype).eval()


def timm_copy_of_torchvision_vit(source: torch.nn.Module) -> torch.nn.Module:
    """The timm ViT holding torchvision ViT ``source``'s weights (``qkv`` = ``in_proj``, ``proj`` = ``out_proj``)."""
    block = "encoder.layers.encoder_layer_{i}."
    return _timm_holding(
        source, {"conv_proj": "patch_embed.proj", "class_token": "cls_token", "encoder.pos_embedding": "pos_embed",
                 "encoder.ln": "norm", "heads.head": "head"},
        {block + theirs: "blocks.{i}." + ours for theirs, ours in [
            ("ln_1", "norm1"), ("ln_2", "norm2"), ("self_attention.in_proj_weight", "attn.qkv.weight"),
            ("self_attention.in_proj_bias", "attn.qkv.bias"), ("self_attention.out_proj", "attn.proj"),
            ("mlp.0", "mlp.fc1"), ("mlp.3", "mlp.fc2")]},
        img_size=source.image_size, patch_size=source.patch_size, embed_dim=source.hidden_dim,
        depth=len(source.encoder.layers), num_heads=source.encoder.layers[0].self_attention.num_heads,
        mlp_ratio=source.mlp_dim / source.hidden_dim, num_classes=source.num_classes, qkv_bias=True)


def timm_copy_of_open_clip_vit(source: torch.nn.Module) -> torch.nn.Module:
    """The timm ViT holding open_clip image tower ``source``'s weights (LayerScale on both branches, ``ln_pre`` as
    ``norm_pre``, the projection ``proj`` as a head with zero bias; ``ln_post`` after the pooling as ``fc_norm``;
    open_clip's LayerNorm ε)."""
    blocks = source.transformer.resblocks
    after_pool = source.final_ln_after_pool
    return _timm_holding(
        source, {"conv1": "patch_embed.proj", "class_embedding": "cls_token", "positional_embedding": "pos_embed",
                 "ln_pre": "norm_pre", "ln_post": "fc_norm" if after_pool else "norm", "proj": "head.weight"},
        {"transformer.resblocks.{i}." + theirs: "blocks.{i}." + ours for theirs, ours in [
            ("ln_1", "norm1"), ("ln_2", "norm2"), ("attn.in_proj_weight", "attn.qkv.weight"),
            ("attn.in_proj_bias", "attn.qkv.bias"), ("attn.out_proj", "attn.proj"), ("ls_1", "ls1"), ("ls_2", "ls2"),
            ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")]}, transposed=("proj",),
        img_size=source.image_size[0], patch_size=source.patch_size[0], embed_dim=blocks[0].attn.embed_dim,
        depth=len(blocks), num_heads=blocks[0].attn.num_heads,
        mlp_ratio=blocks[0].mlp.c_fc.out_features / blocks[0].attn.embed_dim, num_classes=source.proj.shape[1],
        qkv_bias=True, init_values=1.0, pre_norm=True, global_pool="avg" if source.pool_type == "avg" else "token",
        fc_norm=after_pool, norm_layer=functools.partial(torch.nn.LayerNorm, eps=source.ln_pre.eps))


def transformers_vit_model(**overrides) -> torch.nn.Module:
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(**{**HF_SIZE, **overrides}))


def transformers_dinov2(registers: int = 0, classes: int = 0, **overrides) -> torch.nn.Module:
    """``Dinov2Model`` (``classes=0``) or the classifier, with ``registers`` register tokens."""
    import transformers

    settings = {**HF_SIZE, "mlp_ratio": 2, "num_labels": classes, **overrides}
    if registers:
        config = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **settings)
        kind = (transformers.Dinov2WithRegistersForImageClassification if classes
                else transformers.Dinov2WithRegistersModel)
    else:
        config = transformers.Dinov2Config(**settings)
        kind = transformers.Dinov2ForImageClassification if classes else transformers.Dinov2Model
    return kind(config)


def open_clip_vit(**overrides) -> torch.nn.Module:
    """open_clip's image tower; LayerScale on both branches, drawn at random (``gamma``) by :func:`randomise`."""
    from open_clip.transformer import VisionTransformer

    return VisionTransformer(**{**dict(image_size=32, patch_size=8, width=48, layers=2, heads=3, mlp_ratio=2.0,
                                       output_dim=16, ls_init_value=1.0), **overrides})


#: models outside timm: family name -> (builder of the tiny model with random weights, expected readout)
FOREIGN = {
    "torchvision_vit": (torchvision_vit, "token"),
    "hf_vit_model": (transformers_vit_model, "token"),
    "dinov2": (transformers_dinov2, "token"),
    "dinov2_reg_swiglu_classifier": (lambda **o: transformers_dinov2(2, 10, use_swiglu_ffn=True, **o), "token_avg"),
    "open_clip_vit": (open_clip_vit, "token"),
    "open_clip_vit_avg": (lambda **o: open_clip_vit(pool_type="avg", final_ln_after_pool=True, **o), "avg"),
}


def build(name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """The tiny ``name`` model of :data:`ZOO` in eval mode, all its parameters random."""
    if name in FOREIGN:
        torch.manual_seed(seed)
        return randomise(FOREIGN[name][0](**overrides))
    architecture, arguments, _ = ZOO[name]
    size = SWIN_SIZE if architecture.startswith("swin") else SIZE
    torch.manual_seed(seed)
    return randomise(timm.create_model(architecture, pretrained=False, **{**size, **arguments, **overrides}))


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode with the parameters its constructor sets to constants drawn at random."""
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if any(part in parameter_name for part in RANDOMISED):
                parameter.normal_(0, 0.5 if parameter_name.startswith("head") else 0.2)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm) and not module.weight.any():
                module.weight.normal_(1, 0.2)
    return model.eval()


def images(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, SIZE["img_size"], SIZE["img_size"], generator=torch.Generator().manual_seed(seed))
