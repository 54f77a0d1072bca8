"""What timm's flat-sequence ViTs share (``VisionTransformer``, ``Eva``, ``Beit``, ``VisionTransformerRelPos``):
blocks in ``model.blocks``, prefix tokens counted by the model with the class token first, pooling named by
``global_pool``, and timm's attention-pool (MAP) head."""
from __future__ import annotations

from collections.abc import Collection
from typing import ClassVar

from torch import Tensor, nn

from ..attention import AttentionParts
from .base import EmbeddingParts, Family, ProbeParts, optional


def attention_pool(pool: nn.Module) -> ProbeParts:
    """timm's ``AttentionPoolLatent``: learnt latent queries, a fused kv Linear, then x + mlp(norm(x))."""
    attention = AttentionParts(
        module=pool, num_heads=pool.num_heads, head_dim=pool.head_dim, scale=pool.scale, proj=pool.proj,
        query=pool.q, kv=pool.kv, latent=pool.latent, q_norm=optional(pool.q_norm), k_norm=optional(pool.k_norm),
        proj_drop=pool.proj_drop)
    position = (lambda: pool.pos_embed[None]) if getattr(pool, "pos_embed", None) is not None else None
    mlp = getattr(pool, "mlp", None)
    return ProbeParts(module=pool, attention=attention, position=position, norm=getattr(pool, "norm", None),
                      mlp=mlp, pool=pool.pool or None, activation=getattr(mlp, "act", None))


def gated_mlp(mlp: nn.Module):
    """timm's ``GluMlp`` / ``SwiGLU`` written out with the gating product done by the arithmetic (None for
    a plain ``Mlp``): EVA, ViT (DINOv2-giant's ``SwiGLUPacked``, AIMv2), BEiT's ``swiglu_mlp``."""
    kind = type(mlp).__name__
    if kind not in ("GluMlp", "SwiGLU"):
        return None

    def branch(h: Tensor, arithmetic) -> Tensor:
        if kind == "SwiGLU":
            gated = arithmetic.gate(mlp.fc1_x(h), mlp.act(mlp.fc1_g(h)))
        else:
            first, second = mlp.fc1(h).chunk(2, dim=mlp.chunk_dim)
            gated = (arithmetic.gate(first, mlp.act(second)) if mlp.gate_last
                     else arithmetic.gate(second, mlp.act(first)))
        return mlp.drop2(mlp.fc2(mlp.norm(mlp.drop1(gated))))

    return branch


def timm_head(model: nn.Module, tokens: Tensor, final_norm: bool) -> Tensor:
    """A timm model's outputs from its last block's output: ``norm`` (the final norm), then ``forward_head``
    (pooling or attention pool, ``fc_norm``, classifier)."""
    return model.forward_head(model.norm(tokens) if final_norm else tokens)


def block_type_reason(blocks: nn.Module, accepted: Collection[str], described: str) -> str | None:
    """Why a model cannot be described: the first block whose class is not one of ``accepted`` (class names)."""
    for i, block in enumerate(blocks):
        if type(block).__name__ not in accepted:
            return f"block {i} is a {type(block).__name__}, not {described}"
    return None


class TimmSequenceFamily(Family):
    """A timm ViT whose blocks see one flat token sequence; its readout is its ``global_pool``."""

    #: the ``global_pool`` values that weight the tokens (``"map"``: timm's attention pool)
    readouts: ClassVar[tuple[str, ...]] = ("token", "avg", "map")

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.readout = model.global_pool
        if self.readout == "map":
            self.probe = attention_pool(model.attn_pool)

    @classmethod
    def pooling_reason(cls, model: nn.Module) -> str | None:
        if model.global_pool in cls.readouts:
            return None
        supported = ", ".join(repr(name) for name in cls.readouts)
        return (f"its head pools with global_pool={model.global_pool!r}, which is not a weighting of the tokens "
                f"(supported: {supported})")

    def block_modules(self):
        return self.model.blocks

    @property
    def num_prefix_tokens(self) -> int:
        return self.model.num_prefix_tokens

    @property
    def class_token_index(self) -> int | None:
        return 0 if getattr(self.model, "cls_token", None) is not None else None

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        return timm_head(self.model, tokens, final_norm)

    def embedding(self) -> EmbeddingParts:
        return EmbeddingParts(self.model.patch_embed, getattr(self.model.patch_embed, "proj", None),
                              getattr(self.model, "pos_drop", None))
