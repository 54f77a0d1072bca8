"""transformers' DINOv2, with or without register tokens: the encoders ``Dinov2Model`` /
``Dinov2WithRegistersModel`` (no classifier: the output explained is their ``pooler_output``, the normed
[CLS] token, so a target is an embedding direction) and the linear-probe classifiers
``Dinov2ForImageClassification`` / ``Dinov2WithRegistersForImageClassification``, whose head reads the [CLS]
token concatenated with the mean of the patch tokens (readout ``token_avg``, docs/decisions/readouts.md).

Pre-norm layers with LayerScale (``layer_scale1`` / ``layer_scale2``), a GELU MLP or a SwiGLU feed-forward
(``use_swiglu_ffn``, the giant models), eager or SDPA attention; any image whose sides are multiples of the
patch size (the model interpolates its position embeddings). Register tokens follow the [CLS] token.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..attention import Arithmetic
from ..blocks import BlockParts
from .base import (
    EmbeddingParts,
    Family,
    TokenContext,
    layer_scale,
    missing,
    register_family,
)
from .hf_common import (
    attention_reason,
    is_one_of,
    layer_inputs,
    projections_attention,
    replaced_output,
)

LAYER_ATTRIBUTES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj", "norm1", "norm2",
                    "layer_scale1.lambda1", "layer_scale2.lambda1", "mlp")


def _served() -> dict[type, tuple[bool, type]]:
    """model class -> (whether it classifies, the layer class whose forward the written-out block computes)."""
    from transformers import (
        Dinov2ForImageClassification,
        Dinov2Model,
        Dinov2WithRegistersForImageClassification,
        Dinov2WithRegistersModel,
    )
    from transformers.models.dinov2.modeling_dinov2 import Dinov2Layer
    from transformers.models.dinov2_with_registers.modeling_dinov2_with_registers import (
        Dinov2WithRegistersLayer,
    )

    return {Dinov2Model: (False, Dinov2Layer), Dinov2ForImageClassification: (True, Dinov2Layer),
            Dinov2WithRegistersModel: (False, Dinov2WithRegistersLayer),
            Dinov2WithRegistersForImageClassification: (True, Dinov2WithRegistersLayer)}


def swiglu(mlp: nn.Module):
    """``Dinov2SwiGLUFFN``: down(act(gate(h)) ⊙ up(h)), the gating product done by the arithmetic."""
    def branch(h: Tensor, arithmetic: Arithmetic) -> Tensor:
        return mlp.down_proj(arithmetic.gate(mlp.up_proj(h), mlp.act_fn(mlp.gate_proj(h))))

    return branch


@register_family
class TransformersDinov2(Family):
    """Where transformers' DINOv2 models keep their parts."""

    name = "transformers DINOv2"
    listing_order = 24

    def __init__(self, model: nn.Module):
        self.classifies, _ = _served()[type(model)]
        self.base = model.base_model
        super().__init__(model)
        self.readout = "token_avg" if self.classifies else "token"

    @classmethod
    def examples(cls):
        def builder(registers: int, classes: bool):
            def build():
                import transformers

                settings = dict(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                mlp_ratio=2, layerscale_value=0.5)
                torch.manual_seed(0)
                if registers:
                    config = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, num_labels=10,
                                                                    **settings)
                    kind = (transformers.Dinov2WithRegistersForImageClassification if classes
                            else transformers.Dinov2WithRegistersModel)
                else:
                    config = transformers.Dinov2Config(num_labels=10, **settings)
                    kind = transformers.Dinov2ForImageClassification if classes else transformers.Dinov2Model
                return kind(config).eval(), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))

            return build

        return {"transformers DINOv2 (embedding)": builder(0, False),
                "transformers DINOv2 with registers, classifier ([CLS] + mean)": builder(2, True)}

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """A transformers DINOv2 model (with or without registers, encoder or classifier)."""
        return is_one_of(model, _served())

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        classifies, layer_class = _served()[type(model)]
        if classifies and not isinstance(model.classifier, nn.Linear):
            return "its classifier is not a Linear (num_labels=0 gives an Identity; use the Dinov2Model for embeddings)"
        for i, layer in enumerate(model.base_model.encoder.layer):
            if type(layer) is not layer_class:
                return f"layer {i} is a {type(layer).__name__}, not a {layer_class.__name__}"
            absent = missing(layer, LAYER_ATTRIBUTES)
            if absent:
                return f"layer {i}: {absent}"
        return attention_reason(model.base_model)

    def block_modules(self):
        return self.base.encoder.layer

    def block(self, layer: nn.Module) -> BlockParts:
        parts = projections_attention(layer.attention)
        gated = hasattr(layer.mlp, "gate_proj")
        return BlockParts(module=layer, attention=parts, norm1=layer.norm1, norm2=layer.norm2, mlp=layer.mlp,
                          activation=layer.mlp.act_fn if gated else layer.mlp.activation_fn,
                          gated_mlp=swiglu(layer.mlp) if gated else None,
                          gamma1=layer_scale(layer.layer_scale1.lambda1),
                          gamma2=layer_scale(layer.layer_scale2.lambda1), drop1=layer.drop_path, drop2=layer.drop_path,
                          inputs=layer_inputs)

    @property
    def num_prefix_tokens(self) -> int:
        return 1 + getattr(self.base.config, "num_register_tokens", 0)

    @property
    def class_token_index(self) -> int:
        return 0

    @property
    def head_reason(self) -> str | None:
        if self.classes is not None:
            return None if self.classes else "the caller said its outputs are not classes (classes=False)"
        return None if self.classifies else "this model has no classifier head (its output is the pooled embedding)"

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.base.embeddings.patch_embeddings.projection.kernel_size)

    @property
    def in_channels(self) -> int:
        return self.base.embeddings.patch_embeddings.projection.in_channels

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        (height, width), (ph, pw) = images.shape[-2:], self.patch_size
        if height % ph or width % pw:
            raise ValueError(f"this model takes images whose sides are multiples of its {ph}x{pw} patches, "
                             f"got {height}x{width}; resize or crop them")
        return height // ph, width // pw

    def forward(self, images: Tensor) -> Tensor:
        """The classifier's logits, or the encoder's ``pooler_output`` (the normed [CLS] token)."""
        if self.classifies:
            return self.model(pixel_values=images).logits
        return self.model(pixel_values=images).pooler_output

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        return self.base.embeddings(images), TokenContext()

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        """The model's own forward with its embedding output replaced by ``tokens`` [B, N', C]."""
        size = self.base.config.image_size
        placeholder = torch.zeros(tokens.shape[0], self.base.config.num_channels, size, size, device=tokens.device,
                                  dtype=tokens.dtype)
        with replaced_output(self.base.embeddings, tokens):
            return self.forward(placeholder)

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``layernorm``, then the [CLS] token (encoders) or the classifier on the [CLS] token concatenated with
        the patch tokens' mean (classifiers), as the models' ``forward`` computes them."""
        tokens = self.base.layernorm(tokens) if final_norm else tokens
        if not self.classifies:
            return tokens[:, 0]
        return self.model.classifier(torch.cat([tokens[:, 0], tokens[:, self.num_prefix_tokens:].mean(1)], dim=1))

    def embedding(self) -> EmbeddingParts:
        embeddings = self.base.embeddings
        return EmbeddingParts(embeddings.patch_embeddings, embeddings.patch_embeddings.projection, embeddings.dropout)

    def missing_dropouts(self) -> tuple[nn.Module, ...]:
        return tuple(parts.activation for parts in self.blocks)

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        return (self.model.classifier,) if self.classifies else ()

    def lrp_allowed(self) -> tuple[type, ...]:
        from transformers.models.dinov2 import modeling_dinov2 as plain
        from transformers.models.dinov2_with_registers import (
            modeling_dinov2_with_registers as registers,
        )

        return (*_served(), *(getattr(module, f"{prefix}{part}") for module, prefix in
                              ((plain, "Dinov2"), (registers, "Dinov2WithRegisters"))
                              for part in ("Embeddings", "PatchEmbeddings", "Encoder", "Layer", "Attention",
                                           "LayerScale", "MLP", "SwiGLUFFN", "DropPath")))
