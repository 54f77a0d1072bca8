"""transformers' ViT and DeiT image classifiers (``ViTForImageClassification``, ``DeiTForImageClassification``,
``DeiTForImageClassificationWithTeacher``: class and distillation token, logits the average of both heads),
eager or SDPA attention, in the layout of transformers >= 5.12 (``q_proj`` / ``o_proj``, ``model.vit.layers``)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import EmbeddingParts, TokenContext, loaded_classes, register_family
from .examples import TINY_TRANSFORMERS, Example
from .hf_common import (
    TransformersClassifier,
    attention_reason,
    layer_inputs,
    projections_attention,
    replaced_output,
)
from .stack import Parts, Stack, needing

LAYER_ATTRIBUTES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
                    "layernorm_before", "layernorm_after", "mlp")
#: the image classifiers served
CLASSIFIERS = ("transformers.ViTForImageClassification", "transformers.DeiTForImageClassification",
               "transformers.DeiTForImageClassificationWithTeacher")
#: the headless encoders (:mod:`.hf_vit_model`'s)
ENCODERS = ("transformers.ViTModel", "transformers.DeiTModel")
#: transformers' ViT / DeiT layers (pre-norm, like timm's), in ``model.base_model.layers``
VIT_LAYERS = Stack("base_model.layers", {"ViTLayer": "pre_norm", "DeiTLayer": "pre_norm"}, "a ViTLayer or DeiTLayer",
                   word="layer", checks=(needing(*LAYER_ATTRIBUTES),),
                   parts=Parts(attention="attention", norm1="layernorm_before", norm2="layernorm_after",
                               activation="mlp.activation_fn", drop1="dropout", drop2="dropout", inputs=layer_inputs))


def tiny_vit(model_class: str, **settings):
    """A builder of a tiny randomly initialised transformers ViT of class ``model_class`` (the catalogue's)."""
    def make(**overrides) -> nn.Module:
        import transformers

        config = transformers.ViTConfig(**{**TINY_TRANSFORMERS, **settings, **overrides})
        return getattr(transformers, model_class)(config)

    return make


def _classifier_reason(model: nn.Module) -> str | None:
    classifiers = loaded_classes(CLASSIFIERS)
    if isinstance(model, classifiers):
        return None
    return f"{type(model).__name__} is not one of {', '.join(c.__name__ for c in classifiers)}"


def _layers_reason(model: nn.Module) -> str | None:
    if getattr(model.base_model, "layers", None) is None:
        return "its encoder has no `layers` (transformers before 5.12 lays ViT out differently; upgrade it)"
    return None


@register_family
class TransformersViT(TransformersClassifier):
    """Where transformers' ViT / DeiT classifiers keep their parts (pre-norm layers like timm's)."""

    name = "transformers ViT/DeiT"
    listing_order = 20
    model_classes = ("transformers.ViTPreTrainedModel", "transformers.DeiTPreTrainedModel")
    excluded_classes = ENCODERS
    stack = VIT_LAYERS
    refusals = (_classifier_reason, _layers_reason, stack.reason, attention_reason)
    lrp_modules = tuple(f"transformers.models.{name.lower()}.modeling_{name.lower()}.{name}{part}"
                        for name in ("ViT", "DeiT") for part in ("Embeddings", "PatchEmbeddings", "MLP"))
    example_models = (Example("transformers ViT", tiny_vit("ViTForImageClassification", num_labels=10)),)
    patch_convolution = "model.base_model.embeddings.patch_embeddings.projection"
    image_size = "model.base_model.embeddings.patch_embeddings.image_size"
    attention = staticmethod(projections_attention)

    @property
    def num_prefix_tokens(self) -> int:
        return 2 if getattr(self.model.base_model.embeddings, "distillation_token", None) is not None else 1

    def forward(self, images: Tensor) -> Tensor:
        return self.model(pixel_values=images).logits

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        return self.model.base_model.embeddings(images), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        """The model's own forward with its embedding output replaced by ``tokens`` [B, N', C], so the
        head (class token, distillation average) is the model's, not a copy."""
        embeddings = self.model.base_model.embeddings
        channels = embeddings.patch_embeddings.num_channels
        height, width = embeddings.patch_embeddings.image_size
        placeholder = torch.zeros(tokens.shape[0], channels, height, width, device=tokens.device, dtype=tokens.dtype)
        with replaced_output(embeddings, tokens):
            return self.forward(placeholder)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """The final layer norm, then the classifier on the [CLS] token (with a teacher, the mean of the
        [CLS] and distillation classifiers), as the classifiers' ``forward`` computes them."""
        model = self.model
        tokens = model.base_model.layernorm(tokens) if final_norm else tokens
        if hasattr(model, "distillation_classifier"):
            return (model.cls_classifier(tokens[:, 0]) + model.distillation_classifier(tokens[:, 1])) / 2
        return model.classifier(tokens[:, 0])

    def embedding(self) -> EmbeddingParts:
        embeddings = self.model.base_model.embeddings
        return EmbeddingParts(embeddings.patch_embeddings, embeddings.patch_embeddings.projection, embeddings.dropout)

    def missing_dropouts(self) -> tuple[nn.Module, ...]:
        return tuple(layer.mlp.activation_fn for layer in self.block_modules())

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        return tuple(head for head in self.model.children() if isinstance(head, nn.Linear))
