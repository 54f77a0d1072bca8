"""timm's BEiT and relative-position ViTs (``Beit``, ``VisionTransformerRelPos``): a learnt relative position
bias added to the attention scores (per block, or shared by the blocks), class-token or average readout."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .base import (
    EmbeddingParts,
    TokenContext,
    layer_scale,
    optional,
    register_family,
    timm_example,
)
from .timm_common import TimmSequenceFamily, block_type_reason, gated_mlp


@register_family
class TimmBeit(TimmSequenceFamily):
    """Where timm's ``Beit`` keeps its parts: qkv without bias plus q / v biases, relative position bias
    per block and / or shared, LayerScale gains ``gamma_1`` / ``gamma_2``."""

    name = "timm Beit"
    listing_order = 12
    readouts = ("token", "avg")

    @classmethod
    def examples(cls):
        return {"BEiT (relative position bias)": timm_example("beit_base_patch16_224")}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        from timm.models.beit import Beit

        return isinstance(model, Beit)

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        return block_type_reason(model.blocks, ("Block",), "BEiT's Block") or cls.pooling_reason(model)

    def block(self, module: nn.Module) -> BlockParts:
        attn = module.attn
        bias = None
        if attn.q_bias is not None:
            bias = lambda: torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))  # noqa: E731
        position_bias = attn._get_rel_pos_bias if attn.relative_position_bias_table is not None else None
        attention = AttentionParts(
            module=attn, num_heads=attn.num_heads, head_dim=attn.qkv.out_features // (3 * attn.num_heads),
            scale=attn.scale, proj=attn.proj, qkv=attn.qkv, qkv_bias=bias, position_bias=position_bias,
            attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)
        return BlockParts(
            module=module, attention=attention, norm1=module.norm1, norm2=module.norm2, mlp=module.mlp,
            activation=getattr(module.mlp, "act", None), gated_mlp=gated_mlp(module.mlp),
            gamma1=layer_scale(module.gamma_1), gamma2=layer_scale(module.gamma_2),
            inputs=lambda x, shared_rel_pos_bias=None: (x, AttentionInput(bias=shared_rel_pos_bias)))

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens = model.patch_embed(images)
        tokens = torch.cat((model.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        if model.pos_embed is not None:
            tokens = tokens + model.pos_embed
        return model.pos_drop(tokens), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        model = self.model
        shared = model.rel_pos_bias() if model.rel_pos_bias is not None else None
        for block in model.blocks:
            tokens = block(tokens, shared_rel_pos_bias=shared)
        return self.head(tokens)

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import DropPath, Mlp, PatchEmbed, SwiGLU
        from timm.models.beit import Attention, Beit, Block, RelativePositionBias

        return Beit, Block, Attention, Mlp, SwiGLU, PatchEmbed, DropPath, RelativePositionBias


@register_family
class TimmRelPos(TimmSequenceFamily):
    """Where timm's ``VisionTransformerRelPos`` keeps its parts: a relative position bias (table or MLP)
    per block or shared, LayerScale modules."""

    name = "timm VisionTransformerRelPos"
    listing_order = 13
    readouts = ("token", "avg")

    @classmethod
    def examples(cls):
        return {"relative-position ViT (MLP bias)": timm_example("vit_srelpos_small_patch16_224")}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        from timm.models.vision_transformer_relpos import VisionTransformerRelPos

        return isinstance(model, VisionTransformerRelPos)

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        return block_type_reason(model.blocks, ("RelPosBlock",), "RelPosBlock") or cls.pooling_reason(model)

    def block(self, module: nn.Module) -> BlockParts:
        attn = module.attn
        own = attn.rel_pos.get_bias if attn.rel_pos is not None else None
        attention = AttentionParts(
            module=attn, num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, proj=attn.proj,
            qkv=attn.qkv, q_norm=optional(attn.q_norm), k_norm=optional(attn.k_norm), position_bias=own,
            attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)
        def inputs(x, shared_rel_pos=None):
            """The attention's own bias replaces a shared one (timm's RelPosAttention)."""
            return x, AttentionInput(bias=None if own else shared_rel_pos)

        return BlockParts(
            module=module, attention=attention, norm1=module.norm1, norm2=module.norm2, mlp=module.mlp,
            activation=getattr(module.mlp, "act", None), gamma1=layer_scale(module.ls1), gamma2=layer_scale(module.ls2),
            inputs=inputs)

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens = model.patch_embed(images)
        if model.cls_token is not None:
            tokens = torch.cat((model.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        return tokens, TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        model = self.model
        shared = model.shared_rel_pos.get_bias() if model.shared_rel_pos is not None else None
        for block in model.blocks:
            tokens = block(tokens, shared_rel_pos=shared)
        return self.head(tokens)

    def embedding(self) -> EmbeddingParts:
        return EmbeddingParts(self.model.patch_embed, getattr(self.model.patch_embed, "proj", None), None)

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import (
            DropPath,
            LayerScale,
            Mlp,
            PatchEmbed,
            RelPosBias,
            RelPosMlp,
        )
        from timm.models.vision_transformer_relpos import (
            RelPosAttention,
            RelPosBlock,
            VisionTransformerRelPos,
        )

        # the position-bias MLP computes a constant of the input: its ReLU never carries relevance
        return VisionTransformerRelPos, RelPosBlock, RelPosAttention, Mlp, PatchEmbed, LayerScale, DropPath, \
            RelPosBias, RelPosMlp, nn.ReLU
