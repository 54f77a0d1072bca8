"""timm's ``VisionTransformer``: ViT, DeiT (distilled too), DINOv2, CLIP / SigLIP image towers, DeiT III,
FlexiViT, register tokens, with class-token, average or attention-pool (MAP) readout."""
from __future__ import annotations

from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .base import TokenContext, layer_scale, missing, optional, timm_example
from .timm_common import TimmSequenceFamily, block_type_reason

ATTENTION_ATTRIBUTES = ("qkv", "proj", "num_heads", "head_dim", "scale")
#: timm block classes and the layout their forward computes
BLOCK_LAYOUTS = {"Block": "pre_norm", "ResPostBlock": "res_post_norm"}


def _vit_classes():
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer


def timm_attention(attn: nn.Module, **extra) -> AttentionParts:
    """timm's ``Attention``: a fused qkv Linear (biases inside), optional q/k norms, output norm and gate."""
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, proj=attn.proj,
        qkv=attn.qkv, q_norm=optional(attn.q_norm), k_norm=optional(attn.k_norm),
        output_norm=optional(getattr(attn, "norm", None)), gate=getattr(attn, "gate", None),
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop, **extra)


def _block_inputs(x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> tuple[Tensor, AttentionInput]:
    if is_causal:
        from timm.layers.attention import resolve_self_attn_mask

        attn_mask = resolve_self_attn_mask(x.shape[1], x, attn_mask, is_causal)
    return x, AttentionInput(mask=attn_mask)


class TimmViT(TimmSequenceFamily):
    """Where timm's ``VisionTransformer`` (and subclasses such as ``VisionTransformerDistilled``) keeps its parts."""

    name = "timm VisionTransformer"

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        return isinstance(model, _vit_classes())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        if reason := cls.pooling_reason(model):
            return reason
        if model.global_pool == "map" and getattr(model.attn_pool, "latent_len", 1) != 1:
            return "its attention-pooling head has several latent queries"
        if reason := block_type_reason(model.blocks, BLOCK_LAYOUTS, "timm's Block or ResPostBlock"):
            return reason
        for i, block in enumerate(model.blocks):
            absent = missing(block.attn, ATTENTION_ATTRIBUTES)
            if absent:
                return f"block {i}: {absent}"
        return None

    @classmethod
    def examples(cls):
        return {"ViT (class token)": timm_example("vit_base_patch16_224"),
                "DeiT distilled (class + distillation token)": timm_example("deit_base_distilled_patch16_224"),
                "ViT, average pooling, registers": timm_example("vit_base_patch16_224", reg_tokens=2, global_pool="avg"),
                "SigLIP-style ViT (attention pooling)": timm_example("vit_base_patch16_siglip_224",
                                                                     class_token=False, global_pool="map")}

    def block(self, module: nn.Module) -> BlockParts:
        layout = BLOCK_LAYOUTS[type(module).__name__]
        return BlockParts(
            module=module, attention=timm_attention(module.attn), norm1=module.norm1, norm2=module.norm2,
            mlp=module.mlp, activation=getattr(module.mlp, "act", None), layout=layout, gamma1=layer_scale(getattr(module, "ls1", None)),
            gamma2=layer_scale(getattr(module, "ls2", None)), inputs=_block_inputs)

    @property
    def readout_includes_prefix(self) -> bool:
        return bool(getattr(self.model, "pool_include_prefix", False))

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens = model._pos_embed(model.patch_embed(images))
        return model.norm_pre(model.patch_drop(tokens)), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(self.model.blocks(tokens))

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import AttentionPoolLatent, DropPath, LayerScale, Mlp, PatchDropout, PatchEmbed
        from timm.models.vision_transformer import Block, ResPostBlock

        return (_vit_classes(), Block, ResPostBlock, type(self.blocks[0].attention.module), Mlp, PatchEmbed,
                LayerScale, DropPath, PatchDropout, AttentionPoolLatent)
