"""transformers' headless ViT and DeiT encoders (``ViTModel``, ``DeiTModel``): the layers of the classifiers
(:mod:`.hf_vit`) without a classifier. The output explained is the model's ``pooler_output`` (a Linear and tanh
on the normed [CLS] token) or, built with ``add_pooling_layer=False``, the normed [CLS] token itself; either is
an embedding, so a target is a direction in it (targets.py), never a class."""
from __future__ import annotations

from dataclasses import replace

from torch import Tensor, nn

from .base import register_family
from .examples import Example
from .hf_common import attention_reason
from .hf_vit import ENCODERS, VIT_LAYERS, TransformersViT, tiny_vit


@register_family
class TransformersViTModel(TransformersViT):
    """Where transformers' ``ViTModel`` / ``DeiTModel`` keep their parts (those of the classifiers)."""

    name = "transformers ViTModel/DeiTModel (no classifier)"
    listing_order = 23
    model_classes = ENCODERS
    subclasses = False
    excluded_classes = ()
    stack = replace(VIT_LAYERS, named=None)
    refusals = (stack.reason, attention_reason)
    example_models = (Example("transformers ViTModel (embedding)", tiny_vit("ViTModel")),)
    output_embedding = "this model has no classifier head (its output is the pooled embedding)"

    @property
    def head_reason(self) -> str | None:
        """The embedding's reason also when the caller says its outputs are not classes."""
        return None if self.classes else self.output_embedding

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
