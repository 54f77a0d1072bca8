"""Where the LRP rules of :mod:`vitexplain.instrumentation.lrp` go in a timm Vision Transformer."""
from __future__ import annotations

from torch import Tensor, nn

from .base import ModelAdapter, UnsupportedModelError
from .lrp import RuleWriter, absolute_rule, require_rules_for


def _absolute_layer_scale_hook(layer_scale: nn.Module, args: tuple, output: Tensor) -> Tensor:
    """LayerScale x·γ as a diagonal Linear (γ taken in absolute value, like a weight)."""
    return absolute_rule(output, output, args[0].abs() * layer_scale.gamma.detach().abs())


def _attention_forward(attn: nn.Module, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                       *, writer: RuleWriter) -> Tensor:
    """timm ``Attention.forward`` written out, with the softmax and the two products under the rules."""
    if attn_mask is not None or is_causal:
        raise NotImplementedError("LRP through masked or causal attention is not supported")
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    mixed = writer.attend(q * attn.scale, k, v, probability_dropout=attn.attn_drop)
    out = attn.norm(mixed.transpose(1, 2).reshape(batch, tokens, -1))
    return attn.proj_drop(attn.proj(out))


def _block_forward(block: nn.Module, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
                   *, add) -> Tensor:
    """timm ``Block.forward`` with both residual adds done by ``add``."""
    attended = block.attn(block.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
    x = add(x, block.drop_path1(block.ls1(attended)))
    return add(x, block.drop_path2(block.ls2(block.mlp(block.norm2(x)))))


def _covered(model: nn.Module):
    """Whether the rules cover a module: timm's ViT classes and plain layers (no gated attention), the
    MLP activations and the patch convolution."""
    from timm.layers import DropPath, LayerScale, Mlp, PatchDropout, PatchEmbed
    from timm.models.vision_transformer import Attention, Block, VisionTransformer

    exempt = {id(block.mlp.act) for block in model.blocks if type(block.mlp) is Mlp}
    if isinstance(model.patch_embed.proj, nn.Conv2d):
        exempt.add(id(model.patch_embed.proj))
    allowed = (VisionTransformer, Block, Attention, Mlp, PatchEmbed, LayerScale, DropPath, PatchDropout,
               nn.Linear, nn.LayerNorm, nn.Identity, nn.Dropout, nn.Sequential, nn.ModuleList)

    def covered(module: nn.Module) -> bool:
        gated = isinstance(module, Attention) and getattr(module, "gate", None) is not None
        return id(module) in exempt or (isinstance(module, allowed) and not gated)

    return covered


def apply_rules(adapter: ModelAdapter, writer: RuleWriter) -> None:
    """Place ``writer``'s rules on the adapter's timm ViT (see :meth:`ModelAdapter.apply_lrp_rules`)."""
    from timm.layers import LayerScale

    model = adapter.model
    if getattr(model, "attn_pool", None) is not None:
        raise UnsupportedModelError(f"cannot propagate LRP through this {type(model).__name__}: its attention-pooling "
                                    "head (global_pool='map') has no LRP rule here")
    require_rules_for(model, _covered(model))
    position_dropout = getattr(model, "pos_drop", None)
    writer.layers(model, position_dropout, extra={LayerScale: _absolute_layer_scale_hook})
    for block in model.blocks:
        writer.activation(block.mlp.act)
        writer.replace_forward(block.attn, _attention_forward, writer=writer)
        writer.replace_forward(block, _block_forward, add=writer.residual_add())
    writer.blocks(model.blocks)
    writer.embeddings(model.patch_embed, model.patch_embed.proj, position_dropout, model.num_prefix_tokens)
