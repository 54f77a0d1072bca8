"""timm's ``Eva``: EVA-02 and timm's RoPE ViTs (rotary position embedding, SwiGLU, LayerScale gains,
fused or separate q/k/v with their own biases, grouped-query attention), any global pooling."""
from __future__ import annotations

from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from .base import TokenContext, register_family
from .examples import Example, timm_tiny
from .stack import Parts, Stack, optional
from .timm_common import GlobalPool, TimmSequenceFamily, gated_mlp
from .timm_vit import _block_inputs

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


def _attention_reason(place: str, block: nn.Module) -> str | None:
    kind = type(block.attn).__name__
    return None if kind in ATTENTIONS else f"{place}'s attention is a {kind}"


#: timm's ``EvaBlock`` / ``EvaBlockPostNorm``, as a stack at ``model.blocks``
EVA_BLOCKS = Stack("blocks", {"EvaBlock": "pre_norm", "EvaBlockPostNorm": "res_post_norm"}, "an EvaBlock",
                   checks=(_attention_reason,),
                   parts=Parts(gamma1="gamma_1", gamma2="gamma_2", gated_mlp=gated_mlp, inputs=_eva_inputs))


def _dropping_patches(model: nn.Module) -> str | None:
    if getattr(model, "patch_drop", None) is not None:
        return "it drops patches at random (patch_drop_rate > 0)"
    return None


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
    model_classes = ("timm.models.eva.Eva",)
    stack = EVA_BLOCKS
    pooling = GlobalPool(latents=True)
    refusals = (pooling.reason, _dropping_patches, stack.reason)
    example_models = (
        Example("EVA-02 (RoPE, SwiGLU)", timm_tiny("eva02_tiny_patch14_224", patch_size=8, ref_feat_shape=(4, 4))),
        Example("RoPE ViT (mixed)", timm_tiny("vit_base_patch16_rope_mixed_224")))
    attention = staticmethod(eva_attention)

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens, rope = model._pos_embed(model.patch_embed(images))
        return model.norm_pre(tokens), TokenContext(rope=rope)

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(run_blocks(self.model.blocks, tokens, context.rope, getattr(self.model, "rope_mixed", False)))
