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
from .base import ClassTokenFirst, EmbeddingParts, Family, TokenContext, register_family
from .examples import TINY_TRANSFORMERS, Example
from .hf_common import attention_reason, layer_inputs, projections_attention, replaced_output, served
from .stack import Parts, Stack, needing

LAYER_ATTRIBUTES = ("attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj", "norm1", "norm2",
                    "layer_scale1.lambda1", "layer_scale2.lambda1", "mlp")
#: where transformers keeps DINOv2 without and with registers, and the prefix of their classes
MODULES = {"transformers.models.dinov2.modeling_dinov2": "Dinov2",
           "transformers.models.dinov2_with_registers.modeling_dinov2_with_registers": "Dinov2WithRegisters"}


def swiglu(mlp: nn.Module):
    """``Dinov2SwiGLUFFN``: down(act(gate(h)) ⊙ up(h)), the gating product done by the arithmetic (None for the
    plain MLP)."""
    if not hasattr(mlp, "gate_proj"):
        return None

    def branch(h: Tensor, arithmetic: Arithmetic) -> Tensor:
        return mlp.down_proj(arithmetic.gate(mlp.up_proj(h), mlp.act_fn(mlp.gate_proj(h))))

    return branch


def layers(prefix: str) -> Stack:
    """The pre-norm layers (class ``{prefix}Layer``) of a DINOv2 model: LayerScale on both branches, a GELU MLP or a
    SwiGLU feed-forward."""
    return Stack("base_model.encoder.layer", {f"{prefix}Layer": "pre_norm"}, f"a {prefix}Layer", word="layer",
                 checks=(needing(*LAYER_ATTRIBUTES),),
                 parts=Parts(attention="attention", activation=("mlp.act_fn", "mlp.activation_fn"),
                             gamma1="layer_scale1.lambda1", gamma2="layer_scale2.lambda1", drop1="drop_path",
                             drop2="drop_path", gated_mlp=swiglu, inputs=layer_inputs))


#: model class -> (whether it classifies, its layers)
SERVED = {f"transformers.{prefix}{kind}": (kind == "ForImageClassification", layers(prefix))
          for prefix in MODULES.values() for kind in ("Model", "ForImageClassification")}


def tiny_dinov2(registers: int, classes: bool):
    """A builder of a tiny DINOv2 with ``registers`` register tokens, a linear-probe classifier or the encoder."""
    def make(**overrides) -> nn.Module:
        import transformers

        settings = {**TINY_TRANSFORMERS, "mlp_ratio": 2, "layerscale_value": 0.5, "num_labels": 10, **overrides}
        if registers:
            config = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **settings)
            kind = (transformers.Dinov2WithRegistersForImageClassification if classes
                    else transformers.Dinov2WithRegistersModel)
        else:
            config = transformers.Dinov2Config(**settings)
            kind = transformers.Dinov2ForImageClassification if classes else transformers.Dinov2Model
        return kind(config)

    return make


def _classifier_reason(model: nn.Module) -> str | None:
    classifies, _ = served(model, SERVED)
    if classifies and not isinstance(model.classifier, nn.Linear):
        return "its classifier is not a Linear (num_labels=0 gives an Identity; use the Dinov2Model for embeddings)"
    return None


@register_family
class TransformersDinov2(ClassTokenFirst, Family):
    """Where transformers' DINOv2 models keep their parts."""

    name = "transformers DINOv2"
    listing_order = 24
    model_classes = tuple(SERVED)
    subclasses = False
    refusals = (_classifier_reason, lambda model: served(model, SERVED)[1].reason(model),
                lambda model: attention_reason(model.base_model))
    lrp_modules = tuple(f"{module}.{prefix}{part}" for module, prefix in MODULES.items()
                        for part in ("Embeddings", "PatchEmbeddings", "Encoder", "LayerScale", "MLP", "SwiGLUFFN",
                                     "DropPath"))
    example_models = (Example("transformers DINOv2 (embedding)", tiny_dinov2(0, False)),
                      Example("transformers DINOv2 with registers, classifier ([CLS] + mean)", tiny_dinov2(2, True)))
    patch_convolution = "base.embeddings.patch_embeddings.projection"
    attention = staticmethod(projections_attention)

    def __init__(self, model: nn.Module):
        self.classifies, self.stack = served(model, SERVED)
        self.base = model.base_model
        super().__init__(model)
        self.readout = "token_avg" if self.classifies else "token"
        if not self.classifies:
            self.output_embedding = "this model has no classifier head (its output is the pooled embedding)"

    @property
    def num_prefix_tokens(self) -> int:
        return 1 + getattr(self.base.config, "num_register_tokens", 0)

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
