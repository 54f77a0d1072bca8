"""The image towers of transformers' two-tower models: CLIP (``CLIPModel``, ``CLIPVisionModelWithProjection``,
``CLIPVisionModel``) and SigLIP (``SiglipModel``, ``SiglipVisionModel``), eager or SDPA attention.

The output explained is the image embedding the model compares with text embeddings: for CLIP the
[CLS] token after ``post_layernorm`` and ``visual_projection`` (``get_image_features``; ``CLIPVisionModel``
has no projection and gives the normed [CLS] token), for SigLIP the attention-pooling head on the
normed tokens (``pooler_output``). These models have no classifier, so a target is an embedding direction,
e.g. a text embedding (:mod:`vitexplain.instrumentation.two_tower`). CLIP's ``pre_layrnorm`` runs before
the first block and belongs to the token embedding.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import AttentionParts
from ..blocks import BlockParts
from .base import Family, ProbeParts, TokenContext, missing, register_family
from .hf_common import attention_reason, is_one_of, layer_inputs, replaced_output
from .torch_attention import latent_attention

LAYER_ATTRIBUTES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                    "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2", "mlp.activation_fn")


def _served() -> dict[type, tuple[str, type]]:
    """model class -> (kind, the encoder layer class whose forward the written-out block computes)."""
    from transformers import (
        CLIPModel,
        CLIPVisionModel,
        CLIPVisionModelWithProjection,
        SiglipModel,
        SiglipVisionModel,
    )
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer
    from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer

    return {CLIPModel: ("clip", CLIPEncoderLayer), CLIPVisionModelWithProjection: ("clip", CLIPEncoderLayer),
            CLIPVisionModel: ("clip", CLIPEncoderLayer), SiglipModel: ("siglip", SiglipEncoderLayer),
            SiglipVisionModel: ("siglip", SiglipEncoderLayer)}


def vision_tower(model: nn.Module) -> nn.Module:
    """The ``*VisionModel`` of a two-tower model (the model itself when it is one)."""
    return getattr(model, "vision_model", model)


def siglip_probe(head: nn.Module) -> ProbeParts:
    """``SiglipMultiheadAttentionPoolingHead``: one learnt query (``probe``) through ``nn.MultiheadAttention``
    (packed q / kv projections), then x + mlp(layernorm(x)), the first (only) latent read."""
    parts = latent_attention(head.attention, head.probe)
    return ProbeParts(module=head, attention=parts, norm=head.layernorm, mlp=head.mlp, pool="token",
                      activation=head.mlp.activation_fn)


@register_family
class TransformersTwoTower(Family):
    """Where the image towers of transformers' CLIP and SigLIP keep their parts (pre-norm layers)."""

    name = "transformers CLIP/SigLIP image tower"
    listing_order = 21

    def __init__(self, model: nn.Module):
        self.kind, _ = _served()[type(model)]
        self.vision = vision_tower(model)
        self.projection = getattr(model, "visual_projection", None)
        super().__init__(model)
        if self.kind == "siglip":
            self.readout = "map"
            self.probe = siglip_probe(self.vision.head)

    @classmethod
    def examples(cls):
        def builder(kind: str):
            def build():
                import transformers

                vision = dict(image_size=32, patch_size=8, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=3)
                text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, max_position_embeddings=16, bos_token_id=62, eos_token_id=63,
                            pad_token_id=63)
                torch.manual_seed(0)
                if kind == "clip":
                    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                                           projection_dim=24))
                else:
                    config = transformers.SiglipConfig(text_config=dict(text, projection_size=48),
                                                       vision_config=vision)
                    model = transformers.SiglipModel(config)
                return model.eval(), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))

            return build

        return {"transformers CLIP (image–text)": builder("clip"),
                "transformers SigLIP (image–text)": builder("siglip")}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """A transformers CLIP or SigLIP model (two towers, or the image tower alone)."""
        return is_one_of(model, _served())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        kind, layer_class = _served()[type(model)]
        vision = vision_tower(model)
        for i, layer in enumerate(vision.encoder.layers):
            if type(layer) is not layer_class:
                return f"layer {i} is a {type(layer).__name__}, not a {layer_class.__name__}"
            absent = missing(layer, LAYER_ATTRIBUTES)
            if absent:
                return f"layer {i}: {absent}"
        if kind == "siglip":
            head = getattr(vision, "head", None)
            if head is None:
                return ("its vision tower has no attention-pooling head (vision_use_head=False), "
                        "so it outputs no image embedding")
            if not getattr(head.attention, "_qkv_same_embed_dim", False):
                return "its pooling head's attention has keys and values of another width than its queries"
        return attention_reason(vision)

    def block_modules(self):
        return self.vision.encoder.layers

    def block(self, layer: nn.Module) -> BlockParts:
        attention = layer.self_attn
        parts = AttentionParts(
            module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim, scale=attention.scale,
            proj=attention.out_proj, query=attention.q_proj, key=attention.k_proj, value=attention.v_proj)
        return BlockParts(module=layer, attention=parts, norm1=layer.layer_norm1, norm2=layer.layer_norm2,
                          mlp=layer.mlp, activation=layer.mlp.activation_fn, inputs=layer_inputs)

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.kind == "clip" else 0

    @property
    def class_token_index(self) -> int | None:
        return 0 if self.kind == "clip" else None

    @property
    def head_reason(self) -> str | None:
        if self.classes:
            return None
        return "its output is an image embedding, compared with texts (give a text or a direction as the target)"

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.vision.embeddings.patch_embedding.kernel_size)

    @property
    def in_channels(self) -> int:
        return self.vision.embeddings.patch_embedding.in_channels

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        size = self.vision.embeddings.image_size
        given = tuple(images.shape[-2:])
        if given != (size, size):
            raise ValueError(f"this model takes {size}x{size} images, got {given[0]}x{given[1]}; resize them")
        return size // self.patch_size[0], size // self.patch_size[1]

    def forward(self, images: Tensor) -> Tensor:
        """The image embedding: the tower's ``pooler_output``, projected where the model projects it."""
        pooled = self.vision(pixel_values=images).pooler_output
        return pooled if self.projection is None else self.projection(pooled)

    def _first_module(self) -> nn.Module:
        """The module whose output the first block reads (CLIP's pre-layer norm, SigLIP's embeddings)."""
        return self.vision.pre_layrnorm if self.kind == "clip" else self.vision.embeddings

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        tokens = self.vision.embeddings(images)
        return (self.vision.pre_layrnorm(tokens) if self.kind == "clip" else tokens), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        """The tower's own forward with the first block's input replaced by ``tokens`` [B, N', C]."""
        size = self.vision.embeddings.image_size
        placeholder = torch.zeros(tokens.shape[0], self.in_channels, size, size, device=tokens.device,
                                  dtype=tokens.dtype)
        with replaced_output(self._first_module(), tokens):
            return self.forward(placeholder)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """CLIP: ``post_layernorm`` on the [CLS] token, then the projection; SigLIP: ``post_layernorm`` on every
        token, then the attention-pooling head — as the towers' ``forward`` computes them."""
        vision = self.vision
        if self.kind == "siglip":
            return vision.head(vision.post_layernorm(tokens) if final_norm else tokens)
        pooled = vision.post_layernorm(tokens[:, 0]) if final_norm else tokens[:, 0]
        return pooled if self.projection is None else self.projection(pooled)
