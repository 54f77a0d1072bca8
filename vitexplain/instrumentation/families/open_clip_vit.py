"""open_clip's image tower ``VisionTransformer`` (``model.visual`` of every ``ViT-*`` CLIP, EVA-free): a class token
and learnt (or fixed sin-cos) positions, ``ln_pre``, pre-norm ``ResidualAttentionBlock``\\ s attending through
``nn.MultiheadAttention`` (optional LayerScale), ``ln_post`` before or after the pooling (class token ``'tok'``
or patch mean ``'avg'``), and the image-text projection ``proj``. Its output is an embedding, not class scores.

The blocks take tokens sequence first ([N, B, C]) in open_clip up to 2.23 and batch first where the attention is
built ``batch_first``; the layout is read from each model's attention. Refused: the attentional pooler (CoCa),
``pool_type='none'`` (every token returned), cross-attention blocks."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..attention import AttentionInput
from ..blocks import BlockParts
from .base import (
    EmbeddingParts,
    LinearView,
    TokenContext,
    UnsupportedModelError,
    register_family,
)
from .examples import Example
from .stack import Parts, Stack
from .torch_attention import MultiheadAttentionViT, multihead_attention_check

#: where open_clip keeps the classes described
MODULE = "open_clip.transformer"


def tiny_open_clip_vit(**overrides) -> nn.Module:
    """A tiny randomly initialised open_clip image tower."""
    from open_clip.transformer import VisionTransformer

    return VisionTransformer(**{**dict(image_size=32, patch_size=8, width=48, layers=2, heads=3, mlp_ratio=2.0,
                                       output_dim=16), **overrides})


def _pooling_reason(model: nn.Module) -> str | None:
    """One weighting of the tokens: the class token's or their mean."""
    if model.attn_pool is not None:
        queries = model.attn_pool.query.shape[0]
        return (f"its tokens are read by an attentional pooler (CoCa, attentional_pool, {queries} learnt queries) "
                "whose outputs are pooled again, not one weighting of the tokens")
    if model.pool_type not in ("tok", "avg"):
        return f"its pool_type={model.pool_type!r} returns every token, not one embedding"
    return None


def _cross_attention(place: str, block: nn.Module) -> str | None:
    return f"{place} is a cross-attention block (ln_1_kv)" if hasattr(block, "ln_1_kv") else None


@register_family
class OpenClipViT(MultiheadAttentionViT):
    """Where open_clip's ``VisionTransformer`` keeps its parts."""

    name = "open_clip VisionTransformer"
    listing_order = 35
    model_classes = (f"{MODULE}.VisionTransformer",)
    # the MLP: c_fc, gelu, c_proj
    stack = Stack("transformer.resblocks", {"ResidualAttentionBlock": "pre_norm"}, "open_clip's ResidualAttentionBlock",
                  checks=(_cross_attention, multihead_attention_check("attn")),
                  parts=Parts(norm1="ln_1", norm2="ln_2", activation="mlp.gelu", gamma1="ls_1", gamma2="ls_2"))
    refusals = (_pooling_reason, stack.reason)
    lrp_modules = (f"{MODULE}.Transformer", f"{MODULE}.LayerScale", f"{MODULE}.PatchDropout")
    example_models = (Example("open_clip ViT image tower", tiny_open_clip_vit),)
    patch_convolution = "model.conv1"
    output_embedding = ("its output is open_clip's image-text embedding (give a text embedding or a direction as the "
                        "target)")

    def __init__(self, model: nn.Module):
        #: the blocks take and return tokens [N, B, C] (the attention is not batch-first)
        self.sequence_first = not model.transformer.resblocks[0].attn.batch_first
        super().__init__(model)
        self.readout = "token" if model.pool_type == "tok" else "avg"
        #: the image-text projection ``pooled @ proj`` as a Linear (LRP's head rule is placed on it), or None
        self.projection = None if model.proj is None else LinearView(lambda: model.proj.t(), lambda: None,
                                                                     *model.proj.shape)

    def block(self, module: nn.Module) -> BlockParts:
        """The blocks' tokens converted to and from batch first (:attr:`sequence_first`)."""
        return replace(super().block(module), inputs=self._block_inputs, output=self._block_output)

    def _block_inputs(self, q_x: Tensor, k_x: Tensor | None = None, v_x: Tensor | None = None,
                      attn_mask: Tensor | None = None) -> tuple[Tensor, AttentionInput]:
        if k_x is not None or v_x is not None or attn_mask is not None:
            raise UnsupportedModelError("an open_clip image block was called with keys, values or an attention mask "
                                        "(cross-attention or masked attention), which the description does not cover")
        return self._batch_first(q_x), AttentionInput()

    def _block_output(self, tokens: Tensor, given: Tensor) -> Tensor:
        return self._batch_first(tokens)

    def _batch_first(self, tokens: Tensor) -> Tensor:
        """Tokens as the blocks lay them out <-> batch first (a transpose when the blocks are sequence first)."""
        return tokens.transpose(0, 1) if self.sequence_first else tokens

    def forward(self, inputs: Tensor) -> Tensor:
        """The image embedding (the pooled output, without the tokens ``output_tokens=True`` adds)."""
        output = self.model(inputs)
        return output[0] if self.model.output_tokens else output

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        """Tokens before the first block, batch first: patches after the class token, positions added, ``ln_pre``, as
        ``VisionTransformer.forward`` computes them (patch dropout is the identity in eval mode)."""
        model = self.model
        patches = model.conv1(images).flatten(2).transpose(1, 2)
        first = model.class_embedding.to(patches.dtype).expand(patches.shape[0], 1, -1)
        tokens = torch.cat([first, patches], dim=1) + model.positional_embedding.to(patches.dtype)
        return model.ln_pre(model.patch_dropout(tokens)), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        x = self._batch_first(tokens)
        for block in self.model.transformer.resblocks:
            x = block(x)
        return self.head(x)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``ln_post`` (before the pooling, or after it with ``final_ln_after_pool``), the pooling, ``proj``."""
        model = self.model
        norm = model.ln_post if final_norm else nn.Identity()
        tokens = self._batch_first(tokens)
        if model.final_ln_after_pool:
            pooled = norm(model._global_pool(tokens)[0])
        else:
            pooled = model._global_pool(norm(tokens))[0]
        return pooled if self.projection is None else self.projection(pooled)

    def embedding(self) -> EmbeddingParts:
        """``conv1`` (flattened to tokens by the forward); ``patch_dropout`` right after the position add."""
        return EmbeddingParts(self.model.conv1, self.model.conv1, self.model.patch_dropout, channels_first=True)

    def missing_dropouts(self) -> tuple[nn.Module, ...]:
        """After the MLP activation and after both branches' output projections (timm's ``drop1``, ``proj_drop``,
        ``drop2``)."""
        return tuple(module for parts in self.blocks
                     for module in (parts.activation, parts.attention.proj, parts.module.mlp.c_proj))

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        return () if self.projection is None else (self.projection,)

    def lrp_forward(self):
        """The model's forward as :meth:`embed` and :meth:`encode` write it, the projection through its Linear view
        (the model multiplies by ``proj`` in its forward, where no rule could be placed)."""
        if self.projection is None:
            return None
        return (lambda images: self.encode(*self.embed(images))), (self.projection,)
