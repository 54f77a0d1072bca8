"""torchvision's ``VisionTransformer`` (every ``vit_*`` builder: B/16, B/32, L/16, L/32, H/14, and models
built from the class with any size): a class token, learnt positions, pre-norm ``EncoderBlock``\\ s attending
through ``nn.MultiheadAttention``, the final ``encoder.ln`` and ``heads`` (one Linear, or pre-logits, tanh
and a Linear) on the class token. A convolutional stem (``conv_stem_configs``) is part of the patch embedding."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import EmbeddingParts, TokenContext, UnsupportedModelError, register_family
from .examples import Example
from .stack import Parts, Stack
from .torch_attention import MultiheadAttentionViT, multihead_attention_check

#: where torchvision keeps the classes described
MODULE = "torchvision.models.vision_transformer"


def tiny_torchvision_vit(**overrides) -> nn.Module:
    """A tiny randomly initialised torchvision ViT, its head and class token drawn too (torchvision starts them at
    zero)."""
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(**{**dict(image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=48,
                                        mlp_dim=96, num_classes=10), **overrides})
    with torch.no_grad():
        model.heads.head.weight.normal_(0, 0.5)
        model.class_token.normal_(0, 0.2)
    return model


def _batch_first(place: str, block: nn.Module) -> str | None:
    if block.self_attention.batch_first:
        return None
    return f"{place}: its attention is not batch-first, as EncoderBlock builds it"


@register_family
class TorchvisionViT(MultiheadAttentionViT):
    """Where torchvision's ``VisionTransformer`` keeps its parts: ``EncoderBlock``\\ s in ``encoder.layers``, then
    ``encoder.ln`` and ``heads`` on the class token."""

    name = "torchvision VisionTransformer"
    listing_order = 30
    model_classes = (f"{MODULE}.VisionTransformer",)
    # the MLP: Linear, GELU, Dropout, Linear, Dropout
    stack = Stack("encoder.layers", {"EncoderBlock": "pre_norm"}, "torchvision's EncoderBlock",
                  checks=(multihead_attention_check("self_attention"), _batch_first),
                  parts=Parts(attention="self_attention", norm1="ln_1", norm2="ln_2", activation="mlp.1",
                              drop1="dropout"))
    refusals = (stack.reason,)
    lrp_modules = (f"{MODULE}.Encoder",)
    example_models = (Example("torchvision ViT", tiny_torchvision_vit),)

    @property
    def patch_size(self) -> tuple[int, int]:
        return self.model.patch_size, self.model.patch_size

    @property
    def in_channels(self) -> int:
        """The first convolution's input channels (``conv_proj``, or the first of a convolutional stem)."""
        return next(module for module in self.model.conv_proj.modules() if isinstance(module, nn.Conv2d)).in_channels

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        """Patch tokens after the class token, positions added and the embedding dropout run, as
        ``VisionTransformer.forward`` and ``Encoder.forward`` compute them before the first block."""
        model = self.model
        patches = model._process_input(images)
        tokens = torch.cat([model.class_token.expand(patches.shape[0], -1, -1), patches], dim=1)
        return model.encoder.dropout(tokens + model.encoder.pos_embedding), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(self.model.encoder.layers(tokens))

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``encoder.ln``, then ``heads`` on the class token."""
        tokens = self.model.encoder.ln(tokens) if final_norm else tokens
        return self.model.heads(tokens[:, 0])

    def embedding(self) -> EmbeddingParts:
        """``conv_proj`` (flattened to tokens by ``_process_input``); ``encoder.dropout`` right after the position
        add. A convolutional stem (``conv_stem_configs``: BatchNorm, ReLU) has no LRP rule and is refused."""
        convolution = self.model.conv_proj
        if not isinstance(convolution, nn.Conv2d):
            raise UnsupportedModelError(f"LRP rules are not placed on this {self.name}: its patch embedding is a "
                                        "convolutional stem (conv_stem_configs: convolutions, BatchNorm, ReLU)")
        return EmbeddingParts(convolution, convolution, self.model.encoder.dropout, channels_first=True)

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        return (self.model.heads,)
