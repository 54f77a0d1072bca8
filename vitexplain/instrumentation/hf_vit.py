"""Adapter for Hugging Face transformers' ViT and DeiT image classifiers.

Serves ``ViTForImageClassification``, ``DeiTForImageClassification`` and
``DeiTForImageClassificationWithTeacher`` (class and distillation token, so two prefix tokens; the
logits are the average of both heads, as the model returns them), with the eager or SDPA attention.
Their layers are pre-norm like timm's, so the recording reads the same: ``attn_input`` is
``layernorm_before``'s output, ``attn_branch`` the attention's ``o_proj`` output, ``mlp_input``
``layernorm_after``'s output, ``mlp_branch`` the MLP output. The layout is that of transformers >= 5.12
(``q_proj`` / ``o_proj`` attention, ``model.vit.layers``); older ones are refused with that reason.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .hf_common import LayerParts, TransformersAdapter, attention_reason, missing_attributes, transformers_reason

LAYER_ATTRIBUTES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
                    "layernorm_before", "layernorm_after", "mlp")


def _served_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(the image classifiers served, the layer classes whose forward the recording knows)."""
    from transformers import DeiTForImageClassification, DeiTForImageClassificationWithTeacher, ViTForImageClassification
    from transformers.models.deit.modeling_deit import DeiTLayer
    from transformers.models.vit.modeling_vit import ViTLayer

    return (ViTForImageClassification, DeiTForImageClassification, DeiTForImageClassificationWithTeacher), (ViTLayer, DeiTLayer)


class TransformersViTAdapter(TransformersAdapter):
    """Instrumentation for transformers' ViT / DeiT image classifiers."""

    family = "transformers ViT/DeiT"

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        reason = transformers_reason(model)
        if reason is not None:
            return reason
        classifiers, layer_classes = _served_classes()
        if not isinstance(model, classifiers):
            return f"{type(model).__name__} is not one of {', '.join(c.__name__ for c in classifiers)}"
        layers = getattr(model.base_model, "layers", None)
        if layers is None:
            return "its encoder has no `layers` (transformers before 5.12 lays ViT out differently; upgrade it)"
        known = [layer_class.forward for layer_class in layer_classes]
        for i, layer in enumerate(layers):
            if type(layer).forward not in known:
                return f"layer {i} is a {type(layer).__name__}, not a ViTLayer or DeiTLayer"
            missing = missing_attributes(layer, LAYER_ATTRIBUTES)
            if missing:
                return f"layer {i}: {missing}"
        return attention_reason(model)

    # -- model facts ----------------------------------------------------------------------------
    @property
    def num_prefix_tokens(self) -> int:
        return 2 if getattr(self.model.base_model.embeddings, "distillation_token", None) is not None else 1

    @property
    def class_token_index(self) -> int:
        return 0

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.model.base_model.embeddings.patch_embeddings.patch_size)

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        expected = tuple(self.model.base_model.embeddings.patch_embeddings.image_size)
        size = tuple(images.shape[-2:])
        if size != expected:
            raise ValueError(f"this model takes {expected[0]}x{expected[1]} images, got {size[0]}x{size[1]}; resize them")
        return expected[0] // self.patch_size[0], expected[1] // self.patch_size[1]

    # -- layers and inputs ----------------------------------------------------------------------
    def _layers(self) -> Sequence[nn.Module]:
        return self.model.base_model.layers

    def _layer_parts(self, layer: nn.Module) -> LayerParts:
        attention = layer.attention
        return LayerParts(
            layer=layer, attention=attention, query=attention.q_proj, key=attention.k_proj, value=attention.v_proj,
            projection=attention.o_proj, projects_inside=True, attn_norm=layer.layernorm_before,
            mlp_norm=layer.layernorm_after, mlp=layer.mlp, num_heads=attention.num_attention_heads,
            head_dim=attention.head_dim, scaling=attention.scaling)

    def _model_inputs(self, images: Tensor) -> dict[str, Tensor]:
        return {"pixel_values": images}

    def _placeholder(self, batch: int, length: int) -> Tensor:
        channels = self.model.base_model.embeddings.patch_embeddings.num_channels
        height, width = self.model.base_model.embeddings.patch_embeddings.image_size
        return torch.zeros(batch, channels, height, width, device=self.device, dtype=self.dtype)

    def apply_lrp_rules(self, writer) -> None:
        from .lrp_hf import apply_rules

        apply_rules(self, writer)

    def embed(self, images: Tensor) -> Tensor:
        return self.model.base_model.embeddings(images)
