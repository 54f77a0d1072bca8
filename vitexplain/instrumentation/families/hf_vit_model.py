"""transformers' headless ViT and DeiT encoders (``ViTModel``, ``DeiTModel``): the layers of the classifiers
(:mod:`.hf_vit`) without a classifier. The output explained is the model's ``pooler_output`` (a Linear and tanh
on the normed [CLS] token) or, built with ``add_pooling_layer=False``, the normed [CLS] token itself; either is
an embedding, so a target is a direction in it (targets.py), never a class."""
from __future__ import annotations

from torch import Tensor, nn

from .base import example, missing, register_family
from .hf_common import attention_reason, is_one_of
from .hf_vit import LAYER_ATTRIBUTES, TransformersViT, tiny_vit


def _served() -> tuple[type, ...]:
    from transformers import DeiTModel, ViTModel

    return ViTModel, DeiTModel


@register_family
class TransformersViTModel(TransformersViT):
    """Where transformers' ``ViTModel`` / ``DeiTModel`` keep their parts (those of the classifiers)."""

    name = "transformers ViTModel/DeiTModel (no classifier)"
    listing_order = 23

    @classmethod
    def examples(cls):
        return {"transformers ViTModel (embedding)": example(lambda: tiny_vit("ViTModel"))}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """A headless transformers ViT or DeiT encoder."""
        return is_one_of(model, _served())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        for i, layer in enumerate(model.layers):
            absent = missing(layer, LAYER_ATTRIBUTES)
            if absent:
                return f"layer {i}: {absent}"
        return attention_reason(model)

    @property
    def head_reason(self) -> str | None:
        if self.classes:
            return None
        return "this model has no classifier head (its output is the pooled embedding)"

    def forward(self, images: Tensor) -> Tensor:
        """``pooler_output``, or the normed [CLS] token of a model without a pooler."""
        found = self.model(pixel_values=images)
        return found.last_hidden_state[:, 0] if found.pooler_output is None else found.pooler_output

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """The final layer norm, then the pooler (if any) on the [CLS] token."""
        tokens = self.model.layernorm(tokens) if final_norm else tokens
        return tokens[:, 0] if self.model.pooler is None else self.model.pooler(tokens)

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        return ()
