"""timm's ``Eva``: EVA-02 and timm's RoPE ViTs (rotary position embedding, SwiGLU, LayerScale gains,
fused or separate q/k/v with their own biases, grouped-query attention), any global pooling."""
from __future__ import annotations

from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .base import TokenContext, layer_scale, optional, register_family, timm_example
from .timm_common import TimmSequenceFamily, block_type_reason, gated_mlp
from .timm_vit import _block_inputs

BLOCK_LAYOUTS = {"EvaBlock": "pre_norm", "EvaBlockPostNorm": "res_post_norm"}
ATTENTIONS = ("EvaAttention", "AttentionRope")


def eva_attention(attn: nn.Module) -> AttentionParts:
    """``EvaAttention`` / ``AttentionRope``: q/k/v fused (bias added apart in EVA) or separate, RoPE after the
    prefix."""
    fused = getattr(attn, "qkv", None) is not None
    bias = None
    if fused and getattr(attn, "q_bias", None) is not None:
        import torch

        bias = lambda: torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))  # noqa: E731
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, proj=attn.proj,
        qkv=attn.qkv if fused else None, qkv_bias=bias, query=None if fused else attn.q_proj,
        key=None if fused else attn.k_proj, value=None if fused else attn.v_proj,
        kv_heads=getattr(attn, "num_kv_heads", None), q_norm=optional(attn.q_norm), k_norm=optional(attn.k_norm),
        rope_prefix=attn.num_prefix_tokens, rotate_half=bool(getattr(attn, "rotate_half", False)),
        output_norm=optional(attn.norm), gate=getattr(attn, "gate", None), attn_drop=attn.attn_drop,
        proj_drop=attn.proj_drop)


def _eva_inputs(x: Tensor, rope: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> tuple[Tensor, AttentionInput]:
    x, extra = _block_inputs(x, attn_mask, is_causal)
    extra.rope = rope
    return x, extra


def eva_blocks_reason(blocks: nn.Module) -> str | None:
    """Why timm ``EvaBlock`` s cannot be described, or None."""
    if reason := block_type_reason(blocks, BLOCK_LAYOUTS, "an EvaBlock"):
        return reason
    for i, block in enumerate(blocks):
        if type(block.attn).__name__ not in ATTENTIONS:
            return f"block {i}'s attention is a {type(block.attn).__name__}"
    return None


def eva_block(module: nn.Module) -> BlockParts:
    """Where an ``EvaBlock`` / ``EvaBlockPostNorm`` keeps its parts."""
    return BlockParts(
        module=module, attention=eva_attention(module.attn), norm1=module.norm1, norm2=module.norm2,
        mlp=module.mlp, activation=getattr(module.mlp, "act", None), gated_mlp=gated_mlp(module.mlp),
        layout=BLOCK_LAYOUTS[type(module).__name__],
        gamma1=layer_scale(getattr(module, "gamma_1", None)), gamma2=layer_scale(getattr(module, "gamma_2", None)),
        inputs=_eva_inputs)


def run_blocks(blocks: nn.Module, tokens: Tensor, rope: Tensor | None, mixed: bool) -> Tensor:
    """``blocks`` on ``tokens`` with the rotary table ``rope`` of the tokens present (a selected
    :class:`TokenContext`'s; ``mixed``: one table per block, block index second), or without RoPE."""
    for i, block in enumerate(blocks):
        tokens = block(tokens) if rope is None else block(tokens, rope=rope[:, i] if mixed else rope)
    return tokens


@register_family
class TimmEva(TimmSequenceFamily):
    """Where timm's ``Eva`` keeps its parts."""

    name = "timm Eva (EVA-02, RoPE ViT)"
    listing_order = 11

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        from timm.models.eva import Eva

        return isinstance(model, Eva)

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        if reason := cls.pooling_reason(model):
            return reason
        if getattr(model, "patch_drop", None) is not None:
            return "it drops patches at random (patch_drop_rate > 0)"
        return eva_blocks_reason(model.blocks)

    @classmethod
    def examples(cls):
        return {"EVA-02 (RoPE, SwiGLU)": timm_example("eva02_tiny_patch14_224", patch_size=8, ref_feat_shape=(4, 4)),
                "RoPE ViT (mixed)": timm_example("vit_base_patch16_rope_mixed_224")}

    def block(self, module: nn.Module) -> BlockParts:
        return eva_block(module)

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens, rope = model._pos_embed(model.patch_embed(images))
        return model.norm_pre(tokens), TokenContext(rope=rope)

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(run_blocks(self.model.blocks, tokens, context.rope, getattr(self.model, "rope_mixed", False)))

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import (
            AttentionPoolLatent,
            DropPath,
            GluMlp,
            Mlp,
            PatchEmbed,
            SwiGLU,
        )
        from timm.models.eva import Eva, EvaBlock, EvaBlockPostNorm

        return (Eva, EvaBlock, EvaBlockPostNorm, type(self.blocks[0].attention.module), Mlp, GluMlp, SwiGLU,
                PatchEmbed, DropPath, AttentionPoolLatent, type(getattr(self.model, "rope", None) or nn.Identity()))
