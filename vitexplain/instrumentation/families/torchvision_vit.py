"""torchvision's ``VisionTransformer`` (every ``vit_*`` builder: B/16, B/32, L/16, L/32, H/14, and models
built from the class with any size): a class token, learnt positions, pre-norm ``EncoderBlock``\\ s attending
through ``nn.MultiheadAttention``, the final ``encoder.ln`` and ``heads`` (one Linear, or pre-logits, tanh
and a Linear) on the class token. A convolutional stem (``conv_stem_configs``) is part of the patch embedding."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..blocks import BlockParts
from .base import (
    ClassTokenFirst,
    EmbeddingParts,
    Family,
    TokenContext,
    UnsupportedModelError,
    example,
    loaded_class,
    register_family,
)
from .torch_attention import multihead_attention, multihead_attention_reason

#: where torchvision keeps the classes described
MODULE = "torchvision.models.vision_transformer"


@register_family
class TorchvisionViT(ClassTokenFirst, Family):
    """Where torchvision's ``VisionTransformer`` keeps its parts."""

    name = "torchvision VisionTransformer"
    listing_order = 30

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """A torchvision VisionTransformer (without importing torchvision for any other model)."""
        return isinstance(model, loaded_class(MODULE, "VisionTransformer") or ())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        for i, block in enumerate(model.encoder.layers):
            if type(block) is not loaded_class(MODULE, "EncoderBlock"):
                return f"block {i} is a {type(block).__name__}, not torchvision's EncoderBlock"
            if reason := multihead_attention_reason(block.self_attention):
                return f"block {i}: {reason}"
            if not block.self_attention.batch_first:
                return f"block {i}: its attention is not batch-first, as EncoderBlock builds it"
        return None

    @classmethod
    def examples(cls):
        def make() -> nn.Module:
            from torchvision.models.vision_transformer import VisionTransformer

            model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=48, mlp_dim=96,
                                      num_classes=10)
            with torch.no_grad():  # torchvision starts the head and class token at zero
                model.heads.head.weight.normal_(0, 0.5)
                model.class_token.normal_(0, 0.2)
            return model

        return {"torchvision ViT": example(make)}

    def block_modules(self):
        return list(self.model.encoder.layers)

    def block(self, module: nn.Module) -> BlockParts:
        mlp = module.mlp  # Linear, GELU, Dropout, Linear, Dropout
        return BlockParts(module=module, attention=multihead_attention(module.self_attention), norm1=module.ln_1,
                          norm2=module.ln_2, mlp=mlp, activation=mlp[1], drop1=module.dropout)

    @property
    def patch_size(self) -> tuple[int, int]:
        return self.model.patch_size, self.model.patch_size

    @property
    def in_channels(self) -> int:
        """The first convolution's input channels (``conv_proj``, or the first of a convolutional stem)."""
        return next(module for module in self.model.conv_proj.modules() if isinstance(module, nn.Conv2d)).in_channels

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        size, given = self.model.image_size, tuple(images.shape[-2:])
        if given != (size, size):
            raise ValueError(f"this model takes {size}x{size} images, got {given[0]}x{given[1]}; resize them")
        return size // self.model.patch_size, size // self.model.patch_size

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

    def lrp_allowed(self) -> tuple[type, ...]:
        return (loaded_class(MODULE, "VisionTransformer"), loaded_class(MODULE, "Encoder"),
                loaded_class(MODULE, "EncoderBlock"), nn.MultiheadAttention)
