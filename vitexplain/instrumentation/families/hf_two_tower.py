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
from .base import Family, ProbeParts, TokenContext, register_family
from .examples import TINY_TRANSFORMERS, Example
from .hf_common import attention_reason, layer_inputs, replaced_output, served
from .stack import Parts, Stack, needing
from .torch_attention import latent_attention

LAYER_ATTRIBUTES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                    "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2", "mlp.activation_fn")


def vision_tower(model: nn.Module) -> nn.Module:
    """The ``*VisionModel`` of a two-tower model (the model itself when it is one)."""
    return getattr(model, "vision_model", model)


def encoder_layers(layer_class: str) -> Stack:
    """The vision tower's pre-norm encoder layers, of class ``layer_class``."""
    return Stack(lambda model: vision_tower(model).encoder.layers, {layer_class: "pre_norm"}, f"a {layer_class}",
                 word="layer", checks=(needing(*LAYER_ATTRIBUTES),),
                 parts=Parts(attention="self_attn", norm1="layer_norm1", norm2="layer_norm2",
                             activation="mlp.activation_fn", inputs=layer_inputs))


#: model class -> (kind, its vision tower's layers)
SERVED = {**{f"transformers.{name}": ("clip", encoder_layers("CLIPEncoderLayer"))
             for name in ("CLIPModel", "CLIPVisionModelWithProjection", "CLIPVisionModel")},
          **{f"transformers.{name}": ("siglip", encoder_layers("SiglipEncoderLayer"))
             for name in ("SiglipModel", "SiglipVisionModel")}}


def encoder_attention(attention: nn.Module) -> AttentionParts:
    """CLIP's and SigLIP's attention: q / k / v projections, ``out_proj``."""
    return AttentionParts(
        module=attention, num_heads=attention.num_heads, head_dim=attention.head_dim, scale=attention.scale,
        proj=attention.out_proj, query=attention.q_proj, key=attention.k_proj, value=attention.v_proj)


def siglip_probe(head: nn.Module) -> ProbeParts:
    """``SiglipMultiheadAttentionPoolingHead``: one learnt query (``probe``) through ``nn.MultiheadAttention``
    (packed q / kv projections), then x + mlp(layernorm(x)), the first (only) latent read."""
    parts = latent_attention(head.attention, head.probe)
    return ProbeParts(module=head, attention=parts, norm=head.layernorm, mlp=head.mlp, pool="token",
                      activation=head.mlp.activation_fn)


def _siglip_head_reason(model: nn.Module) -> str | None:
    """SigLIP's image embedding is its attention-pooling head's output."""
    if served(model, SERVED)[0] != "siglip":
        return None
    head = getattr(vision_tower(model), "head", None)
    if head is None:
        return ("its vision tower has no attention-pooling head (vision_use_head=False), so it outputs no image "
                "embedding")
    if not getattr(head.attention, "_qkv_same_embed_dim", False):
        return "its pooling head's attention has keys and values of another width than its queries"
    return None


def tiny_two_tower(kind: str):
    """A builder of a tiny CLIP or SigLIP (both towers)."""
    def make(**overrides) -> nn.Module:
        import transformers

        vision = dict(TINY_TRANSFORMERS, **overrides)
        text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    max_position_embeddings=16, bos_token_id=62, eos_token_id=63, pad_token_id=63)
        if kind == "clip":
            return transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                                  projection_dim=24))
        return transformers.SiglipModel(transformers.SiglipConfig(text_config=dict(text, projection_size=48),
                                                                  vision_config=vision))

    return make


@register_family
class TransformersTwoTower(Family):
    """Where the image towers of transformers' CLIP and SigLIP keep their parts (pre-norm layers)."""

    name = "transformers CLIP/SigLIP image tower"
    listing_order = 21
    model_classes = tuple(SERVED)
    subclasses = False
    refusals = (lambda model: served(model, SERVED)[1].reason(model), _siglip_head_reason,
                lambda model: attention_reason(vision_tower(model)))
    example_models = (Example("transformers CLIP (image–text)", tiny_two_tower("clip")),
                      Example("transformers SigLIP (image–text)", tiny_two_tower("siglip")))
    patch_convolution = "vision.embeddings.patch_embedding"
    image_size = "vision.embeddings.image_size"
    output_embedding = ("its output is an image embedding, compared with texts (give a text or a direction as the "
                        "target)")
    attention = staticmethod(encoder_attention)

    def __init__(self, model: nn.Module):
        self.kind, self.stack = served(model, SERVED)
        self.vision = vision_tower(model)
        self.projection = getattr(model, "visual_projection", None)
        super().__init__(model)
        if self.kind == "siglip":
            self.readout = "map"
            self.probe = siglip_probe(self.vision.head)

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.kind == "clip" else 0

    @property
    def class_token_index(self) -> int | None:
        return 0 if self.kind == "clip" else None

    @property
    def head_reason(self) -> str | None:
        """The embedding's reason also when the caller says its outputs are not classes."""
        return None if self.classes else self.output_embedding

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
