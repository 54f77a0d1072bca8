"""timm's BEiT and relative-position ViTs (``Beit``, ``VisionTransformerRelPos``): a learnt relative position
bias added to the attention scores (per block, or shared by the blocks), class-token or average readout."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .base import EmbeddingParts, TokenContext, register_family
from .examples import Example, timm_tiny
from .stack import Parts, Stack, optional
from .timm_common import GlobalPool, TimmSequenceFamily, gated_mlp

#: the readouts of BEiT's and the relative-position ViT's heads
CLASS_TOKEN_OR_AVERAGE = GlobalPool(("token", "avg"))


def beit_attention(attn: nn.Module) -> AttentionParts:
    """BEiT's ``Attention``: qkv without bias plus q / v biases, a relative position bias of its own or none."""
    bias = None
    if attn.q_bias is not None:
        bias = lambda: torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))  # noqa: E731
    position_bias = attn._get_rel_pos_bias if attn.relative_position_bias_table is not None else None
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.qkv.out_features // (3 * attn.num_heads),
        scale=attn.scale, proj=attn.proj, qkv=attn.qkv, qkv_bias=bias, position_bias=position_bias,
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)


@register_family
class TimmBeit(TimmSequenceFamily):
    """Where timm's ``Beit`` keeps its parts: qkv without bias plus q / v biases, relative position bias
    per block and / or shared, LayerScale gains ``gamma_1`` / ``gamma_2``."""

    name = "timm Beit"
    listing_order = 12
    model_classes = ("timm.models.beit.Beit",)
    stack = Stack("blocks", {"Block": "pre_norm"}, "BEiT's Block", parts=Parts(
        gamma1="gamma_1", gamma2="gamma_2", gated_mlp=gated_mlp,
        inputs=lambda x, shared_rel_pos_bias=None: (x, AttentionInput(bias=shared_rel_pos_bias))))
    pooling = CLASS_TOKEN_OR_AVERAGE
    refusals = (stack.reason, pooling.reason)
    lrp_modules = (*TimmSequenceFamily.lrp_modules, "timm.models.beit.RelativePositionBias")
    example_models = (Example("BEiT (relative position bias)", timm_tiny("beit_base_patch16_224")),)
    attention = staticmethod(beit_attention)

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


def relpos_attention(attn: nn.Module) -> AttentionParts:
    """timm's ``RelPosAttention``: a fused qkv, q / k norms, a relative position bias of its own (table or MLP) or
    none."""
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, proj=attn.proj,
        qkv=attn.qkv, q_norm=optional(attn.q_norm), k_norm=optional(attn.k_norm), position_bias=_own_bias(attn),
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop)


def _own_bias(attn: nn.Module):
    return attn.rel_pos.get_bias if attn.rel_pos is not None else None


@register_family
class TimmRelPos(TimmSequenceFamily):
    """Where timm's ``VisionTransformerRelPos`` keeps its parts: a relative position bias (table or MLP)
    per block or shared, LayerScale modules."""

    name = "timm VisionTransformerRelPos"
    listing_order = 13
    model_classes = ("timm.models.vision_transformer_relpos.VisionTransformerRelPos",)
    stack = Stack("blocks", {"RelPosBlock": "pre_norm"}, "RelPosBlock", parts=Parts(gamma1="ls1", gamma2="ls2"))
    pooling = CLASS_TOKEN_OR_AVERAGE
    refusals = (stack.reason, pooling.reason)
    # the position-bias MLP computes a constant of the input: its ReLU never carries relevance
    lrp_modules = (*TimmSequenceFamily.lrp_modules, "timm.layers.RelPosBias", "timm.layers.RelPosMlp", nn.ReLU)
    example_models = (Example("relative-position ViT (MLP bias)", timm_tiny("vit_srelpos_small_patch16_224")),)
    attention = staticmethod(relpos_attention)

    def block(self, module: nn.Module) -> BlockParts:
        """The attention's own bias replaces a shared one (timm's ``RelPosAttention``)."""
        own = _own_bias(module.attn)
        return replace(super().block(module),
                       inputs=lambda x, shared_rel_pos=None: (x, AttentionInput(bias=None if own else shared_rel_pos)))

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
