"""timm's ``VisionTransformer``: ViT, DeiT (distilled too), DINOv2, CLIP / SigLIP image towers, DeiT III,
FlexiViT, register tokens, parallel blocks (``ParallelScalingBlock``, ``vit_pwee``), with class-token, average,
average-and-maximum (``avgmax``) or attention-pool (MAP) readout."""
from __future__ import annotations

from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .base import TokenContext, register_family
from .examples import Example, timm_tiny
from .stack import Parts, Stack, layer_scale, needing, optional
from .timm_common import GlobalPool, TimmSequenceFamily, gated_mlp

#: timm block classes and the layout their forward computes
BLOCK_LAYOUTS = {"Block": "pre_norm", "ResPostBlock": "res_post_norm", "ParallelScalingBlock": "parallel"}


def timm_attention(attn: nn.Module, **extra) -> AttentionParts:
    """timm's ``Attention``: a fused qkv Linear (biases inside), optional q/k norms, output norm and gate."""
    return AttentionParts(
        module=attn, num_heads=attn.num_heads, head_dim=attn.head_dim, scale=attn.scale, proj=attn.proj,
        qkv=attn.qkv, q_norm=optional(attn.q_norm), k_norm=optional(attn.k_norm),
        output_norm=optional(getattr(attn, "norm", None)), gate=getattr(attn, "gate", None),
        attn_drop=attn.attn_drop, proj_drop=attn.proj_drop, **extra)


class _Columns(nn.Module):
    """Columns ``start:stop`` of a Linear's output: the Linear runs as a module (its hooks and LRP rules with it),
    the rest of its output is not read."""

    def __init__(self, linear: nn.Linear, start: int, stop: int):
        super().__init__()
        self.columns = slice(start, stop)
        self._linear = [linear]  # not a submodule: the model owns it

    def forward(self, x: Tensor) -> Tensor:
        return self._linear[0](x)[..., self.columns]


def parallel_block(module: nn.Module) -> BlockParts:
    """timm's ``ParallelScalingBlock`` (ViT-22B): one ``in_proj`` gives the MLP's hidden units and q, k, v of the
    normed input; the attention's and the MLP's own output projections, one LayerScale on their sum."""
    hidden = module.in_split[0]
    width = module.attn_out_proj.out_features
    attention = AttentionParts(
        module=module, num_heads=module.num_heads, head_dim=module.head_dim, scale=module.scale,
        proj=module.attn_out_proj, qkv=_Columns(module.in_proj, hidden, hidden + 3 * width),
        q_norm=optional(module.q_norm), k_norm=optional(module.k_norm), attn_drop=module.attn_drop)
    mlp_input = _Columns(module.in_proj, 0, hidden)

    def mlp(h: Tensor, arithmetic) -> Tensor:  # the MLP bias is kept apart from in_proj: a constant offset
        units = mlp_input(h)
        units = units if module.mlp_bias is None else arithmetic.offset(units, module.mlp_bias)
        return module.mlp_out_proj(module.mlp_drop(module.mlp_act(units)))

    gamma = layer_scale(module.ls)
    return BlockParts(module=module, attention=attention, norm1=module.in_norm, norm2=nn.Identity(), mlp=module.mlp_act,
                      activation=module.mlp_act, gated_mlp=mlp, layout="parallel", gamma1=gamma, gamma2=gamma,
                      inputs=_block_inputs)


def _block_inputs(x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> tuple[Tensor, AttentionInput]:
    if is_causal:
        from timm.layers.attention import resolve_self_attn_mask

        attn_mask = resolve_self_attn_mask(x.shape[1], x, attn_mask, is_causal)
    return x, AttentionInput(mask=attn_mask)


def _parallel_or_attention_reason(place: str, block: nn.Module) -> str | None:
    """A parallel block must have separate output projections; any other block's attention must be timm's."""
    if type(block).__name__ != "ParallelScalingBlock":
        return _attention_reason(place, block)
    if block.out_proj is not None:
        return f"{place}: its attention and MLP share one fused output projection (fuse_out_proj=True)"
    return None


_attention_reason = needing("qkv", "proj", "num_heads", "head_dim", "scale", within="attn")
#: timm's ViT blocks (``Block``, ``ResPostBlock``, ``ParallelScalingBlock``), as a stack at ``model.blocks``
VIT_BLOCKS = Stack("blocks", BLOCK_LAYOUTS, "timm's Block or ResPostBlock", checks=(_parallel_or_attention_reason,),
                   parts=Parts(gamma1="ls1", gamma2="ls2", gated_mlp=gated_mlp, inputs=_block_inputs))


def vit_block(module: nn.Module) -> BlockParts:
    """Where a timm ViT block (one of :data:`BLOCK_LAYOUTS`) keeps its parts."""
    if type(module).__name__ == "ParallelScalingBlock":
        return parallel_block(module)
    return VIT_BLOCKS.block(module, timm_attention)


@register_family
class TimmViT(TimmSequenceFamily):
    """Where timm's ``VisionTransformer`` (and subclasses such as ``VisionTransformerDistilled``) keeps its parts."""

    name = "timm VisionTransformer"
    listing_order = 10
    model_classes = ("timm.models.vision_transformer.VisionTransformer",)
    stack = VIT_BLOCKS
    pooling = GlobalPool()
    refusals = (pooling.reason, stack.reason)
    lrp_modules = (*TimmSequenceFamily.lrp_modules, "timm.layers.PatchDropout")
    example_models = (
        Example("ViT (class token)", timm_tiny("vit_base_patch16_224")),
        Example("DeiT distilled (class + distillation token)", timm_tiny("deit_base_distilled_patch16_224")),
        Example("ViT, average pooling, registers", timm_tiny("vit_base_patch16_224", reg_tokens=2, global_pool="avg")),
        Example("ViT, avgmax pooling", timm_tiny("vit_base_patch16_224", class_token=False, global_pool="avgmax")),
        Example("SigLIP-style ViT (attention pooling)",
                timm_tiny("vit_base_patch16_siglip_224", class_token=False, global_pool="map")),
        Example("ViT with parallel blocks (vit_pwee)", timm_tiny("vit_pwee_patch16_reg1_gap_256")))

    def block(self, module: nn.Module) -> BlockParts:
        return vit_block(module)

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        model = self.model
        tokens = model._pos_embed(model.patch_embed(images))
        return model.norm_pre(model.patch_drop(tokens)), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(self.model.blocks(tokens))
