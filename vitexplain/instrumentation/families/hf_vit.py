"""transformers' ViT and DeiT image classifiers (``ViTForImageClassification``, ``DeiTForImageClassification``,
``DeiTForImageClassificationWithTeacher``: class and distillation token, logits the average of both heads),
eager or SDPA attention, in the layout of transformers >= 5.12 (``q_proj`` / ``o_proj``, ``model.vit.layers``)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..blocks import BlockParts
from .base import EmbeddingParts, TokenContext, example, missing, register_family
from .hf_common import (
    TransformersClassifier,
    attention_reason,
    is_transformers_model,
    layer_inputs,
    projections_attention,
    replaced_output,
)

LAYER_ATTRIBUTES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
                    "layernorm_before", "layernorm_after", "mlp")


def _served_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(the image classifiers served, the layer classes whose forward the written-out block computes)."""
    from transformers import (
        DeiTForImageClassification,
        DeiTForImageClassificationWithTeacher,
        ViTForImageClassification,
    )
    from transformers.models.deit.modeling_deit import DeiTLayer
    from transformers.models.vit.modeling_vit import ViTLayer

    return (ViTForImageClassification, DeiTForImageClassification,
            DeiTForImageClassificationWithTeacher), (ViTLayer, DeiTLayer)


def tiny_vit(model_class: str, **settings) -> nn.Module:
    """A tiny randomly initialised transformers ViT of class ``model_class`` (the support matrix's examples)."""
    import transformers

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, intermediate_size=96, **settings)
    return getattr(transformers, model_class)(config)


@register_family
class TransformersViT(TransformersClassifier):
    """Where transformers' ViT / DeiT classifiers keep their parts (pre-norm layers like timm's)."""

    name = "transformers ViT/DeiT"
    listing_order = 20

    @classmethod
    def examples(cls):
        return {"transformers ViT": example(lambda: tiny_vit("ViTForImageClassification", num_labels=10))}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """Any transformers ViT or DeiT model but the headless encoders (the ViTModel family's)."""
        if not is_transformers_model(model):
            return False
        from transformers import (
            DeiTModel,
            DeiTPreTrainedModel,
            ViTModel,
            ViTPreTrainedModel,
        )

        return (isinstance(model, (ViTPreTrainedModel, DeiTPreTrainedModel))
                and not isinstance(model, (ViTModel, DeiTModel)))

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        classifiers, layer_classes = _served_classes()
        if not isinstance(model, classifiers):
            return f"{type(model).__name__} is not one of {', '.join(c.__name__ for c in classifiers)}"
        layers = getattr(model.base_model, "layers", None)
        if layers is None:
            return "its encoder has no `layers` (transformers before 5.12 lays ViT out differently; upgrade it)"
        for i, layer in enumerate(layers):
            if type(layer) not in layer_classes:
                return f"layer {i} is a {type(layer).__name__}, not a ViTLayer or DeiTLayer"
            absent = missing(layer, LAYER_ATTRIBUTES)
            if absent:
                return f"layer {i}: {absent}"
        return attention_reason(model)

    def block_modules(self):
        return self.model.base_model.layers

    def block(self, layer: nn.Module) -> BlockParts:
        parts = projections_attention(layer.attention)
        return BlockParts(module=layer, attention=parts, norm1=layer.layernorm_before, norm2=layer.layernorm_after,
                          mlp=layer.mlp, activation=layer.mlp.activation_fn, drop1=layer.dropout, drop2=layer.dropout,
                          inputs=layer_inputs)

    @property
    def num_prefix_tokens(self) -> int:
        return 2 if getattr(self.model.base_model.embeddings, "distillation_token", None) is not None else 1

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.model.base_model.embeddings.patch_embeddings.patch_size)

    @property
    def in_channels(self) -> int:
        return self.model.base_model.embeddings.patch_embeddings.num_channels

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        expected = tuple(self.model.base_model.embeddings.patch_embeddings.image_size)
        given = tuple(images.shape[-2:])
        if given != expected:
            raise ValueError(f"this model takes {expected[0]}x{expected[1]} images, got {given[0]}x{given[1]}; "
                             "resize them")
        return expected[0] // self.patch_size[0], expected[1] // self.patch_size[1]

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

    def lrp_allowed(self) -> tuple[type, ...]:
        from transformers.models.deit import modeling_deit as deit
        from transformers.models.vit import modeling_vit as vit

        return (vit.ViTForImageClassification, vit.ViTModel, vit.ViTEmbeddings, vit.ViTPatchEmbeddings, vit.ViTLayer,
                vit.ViTAttention, vit.ViTMLP, deit.DeiTForImageClassification,
                deit.DeiTForImageClassificationWithTeacher,
                deit.DeiTModel, deit.DeiTEmbeddings, deit.DeiTPatchEmbeddings, deit.DeiTLayer, deit.DeiTAttention,
                deit.DeiTMLP)
