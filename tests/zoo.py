"""The tests' models: variants of the families' example models (the one catalogue,
:mod:`vitexplain.instrumentation.families.examples`), built small, in eval mode, every parameter random.

Parameters that their constructors set to zero or one (relative position tables, q / v biases,
LayerScale gains, heads, pooling latents, Swin V2's position-bias MLP) are drawn at random too, and
norm gains set to zero (Swin V2's and SwinV2-CR's res-post norms) are drawn around one, so that a part left out
of a computation shows in its result.

The variants' Swins take 8 px patches (a 4×4 first-stage grid, as every other model's): two stages of two
blocks, 2×2 windows, so the first stage has four windows and its second block shifts them; tests/test_swin.py
builds larger ones (several windows and shifts in every stage, padding).

:func:`enrolled` is what the family-wide tests (the method contract, precision) run on: one example of every
registered family, so a new family is covered as soon as it declares its examples.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from vitexplain.instrumentation.families.base import Family, catalogue, served_families
from vitexplain.instrumentation.families.examples import TINY, Example, timm_tiny

SIZE = TINY


class Variant(NamedTuple):
    """A test model: its builder (keyword arguments over its settings) and the readout its family must find."""

    make: Callable[..., torch.nn.Module]
    readout: str


def of(label: str, **arguments) -> Callable[..., torch.nn.Module]:
    """A builder of the catalogue's example ``label`` with ``arguments`` (then the caller's) over its settings."""
    make = catalogue()[label].make
    return lambda **overrides: make(**{**arguments, **overrides})


VIT, NAFLEX = "ViT (class token)", "NaFlexViT (linear patches, registers, average pooling)"
#: timm's flat-sequence models and Swins
ZOO = {
    "vit": Variant(of(VIT), "token"),
    "vit_avg": Variant(of(VIT, class_token=False, global_pool="avg"), "avg"),
    "vit_reg_avg": Variant(of("ViT, average pooling, registers"), "avg"),
    "vit_map": Variant(of("SigLIP-style ViT (attention pooling)"), "map"),
    "eva02": Variant(of("EVA-02 (RoPE, SwiGLU)"), "avg"),
    "vit_rope": Variant(timm_tiny("vit_base_patch16_rope_224"), "token"),
    "vit_rope_mixed": Variant(of("RoPE ViT (mixed)"), "token"),
    "vit_rope_reg_gap": Variant(timm_tiny("vit_medium_patch16_rope_reg1_gap_256"), "avg"),
    "beit": Variant(of("BEiT (relative position bias)", use_abs_pos_emb=True), "avg"),
    "beit_shared": Variant(of("BEiT (relative position bias)", use_rel_pos_bias=False, use_shared_rel_pos_bias=True),
                           "avg"),
    "relpos": Variant(timm_tiny("vit_relpos_base_patch16_224"), "avg"),
    "srelpos": Variant(of("relative-position ViT (MLP bias)"), "avg"),
    "vit_pwee": Variant(of("ViT with parallel blocks (vit_pwee)", qkv_bias=False), "avg"),  # a separate MLP bias
    "vit_avgmax": Variant(of("ViT, avgmax pooling", reg_tokens=1), "avgmax"),
    "vit_max": Variant(of(VIT, global_pool="max"), "max"),
    "naflexvit": Variant(of(NAFLEX), "avg"),  # linear patches, 4 registers, LayerScale
    "naflexvit_parfac_map": Variant(of("NaFlexViT, factorised positions, attention pooling"), "map"),
    "naflexvit_rope_conv": Variant(of(NAFLEX, embed_proj_type="conv", class_token=True, global_pool="token",
                                      rope_type="axial"), "token"),
    "swin": Variant(of("Swin (shifted windows, merging)", patch_size=8), "avg"),
    "swinv2": Variant(of("Swin V2 (cosine attention, continuous bias)", patch_size=8), "avg"),
    # an extra norm ending each stage
    "swinv2_cr": Variant(of("SwinV2-CR (post-norm, extra stage norms)", patch_size=8), "avg"),
}

#: open_clip's image tower, LayerScale on both branches (drawn at random, ``gamma``, by :func:`randomise`)
open_clip_vit = of("open_clip ViT image tower", ls_init_value=1.0)
#: models outside timm
FOREIGN = {
    "torchvision_vit": Variant(of("torchvision ViT"), "token"),
    "hf_vit_model": Variant(of("transformers ViTModel (embedding)"), "token"),
    "dinov2": Variant(of("transformers DINOv2 (embedding)"), "token"),
    "dinov2_reg_swiglu_classifier": Variant(of("transformers DINOv2 with registers, classifier ([CLS] + mean)",
                                               use_swiglu_ffn=True), "token_avg"),
    "open_clip_vit": Variant(open_clip_vit, "token"),
    "open_clip_vit_avg": Variant(of("open_clip ViT image tower", ls_init_value=1.0, pool_type="avg",
                                    final_ln_after_pool=True), "avg"),
}

#: what a zero-initialised parameter is called, in any family
RANDOMISED = ("relative_position_bias_table", "q_bias", "v_bias", "gamma", "head.", "latent", "rel_pos", "pos_embed",
              "cls_token", "reg_token", "cpb_mlp", "class_token", "register_tokens",
              "lambda1", "mlp_bias", "in_proj_bias", "out_proj.bias")


def enrolled() -> dict[str, tuple[type[Family], Example]]:
    """The first example of every registered family, by label: what the family-wide tests run."""
    return {family.example_models[0].label: (family, family.example_models[0])
            for family in served_families() if family.example_models}


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


def build(name: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """The tiny ``name`` model of :data:`ZOO` or :data:`FOREIGN` in eval mode, all its parameters random."""
    torch.manual_seed(seed)
    return randomise({**ZOO, **FOREIGN}[name].make(**overrides))


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
