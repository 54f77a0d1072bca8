"""What timm's flat-sequence ViTs share (``VisionTransformer``, ``Eva``, ``Beit``, ``VisionTransformerRelPos``,
``NaFlexVit``):
blocks in ``model.blocks``, prefix tokens counted by the model with the class token first, pooling named by
``global_pool``, and timm's attention-pool (MAP) head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn

from ..attention import AttentionParts
from .base import EmbeddingParts, Family, ProbeParts, max_selection
from .cascade import Cascade
from .stack import optional

#: ``global_pool`` values that take a per-channel maximum over the tokens
MAXIMUM_POOLINGS = ("avgmax", "max")


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


#: timm's layers that the written-out blocks and pooling head compute (feed-forwards, LayerScale, drop path, attention
#: pool) and its patch embedding: allowed under LRP in every timm ViT that holds them
TIMM_LAYERS = ("timm.layers.Mlp", "timm.layers.GluMlp", "timm.layers.SwiGLU", "timm.layers.LayerScale",
               "timm.layers.DropPath", "timm.layers.AttentionPoolLatent", "timm.layers.PatchEmbed")


@dataclass(frozen=True)
class GlobalPool:
    """The ``global_pool`` values of a timm model that a family describes, as its readout.

    Attributes:
        readouts: the values described (``"map"``: timm's attention pool; ``"avgmax"`` and ``"max"``: half the mean plus
            half the per-channel maximum of the tokens, or the maximum alone, read through the maximum's selection,
            docs/decisions/readouts.md).
        method: the model's method that pools the tokens (``forward_head`` calls it; observed for the maximum's
            selection).
        latents: whether an attention pool may have several latent queries.
    """

    readouts: tuple[str, ...] = ("token", "avg", "avgmax", "max", "map")
    method: str = "pool"
    latents: bool = False

    def reason(self, model: nn.Module) -> str | None:
        """Why ``model``'s head is not one the family reads, or None."""
        pooling = model.global_pool
        if (pooling in MAXIMUM_POOLINGS and pooling in self.readouts
                and not callable(getattr(model, self.method, None))):
            return f"its head pools with global_pool={pooling!r} inside forward_head (no pool method to observe)"
        if (pooling == "map" and pooling in self.readouts and not self.latents
                and getattr(model.attn_pool, "latent_len", 1) != 1):
            return "its attention-pooling head has several latent queries"
        if pooling in self.readouts:
            return None
        supported = ", ".join(repr(name) for name in self.readouts)
        if not pooling:
            return f"its head returns every token (global_pool=''), not one vector (supported: {supported})"
        return (f"its head pools with global_pool={pooling!r}, which vitexplain does not describe "
                f"(supported: {supported})")


class TimmSequenceFamily(Family):
    """A timm ViT whose blocks see one flat token sequence (in ``model.blocks``); its readout is its ``global_pool``."""

    #: the ``global_pool`` values described
    pooling: ClassVar[GlobalPool]
    lrp_modules = TIMM_LAYERS
    #: model randomisation: the final norm, the pooling and the classifier heads first, then the blocks (the rest:
    #: patch embedding, prefix tokens, positions, ``norm_pre``, last)
    cascade = Cascade(top=("head", "head_dist", "norm", "fc_norm", "attn_pool"))

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.readout = model.global_pool
        if self.readout == "map":
            self.probe = attention_pool(model.attn_pool)

    @property
    def readout_includes_prefix(self) -> bool:
        """Whether the pooling reads the prefix tokens too (timm's ``pool_include_prefix``)."""
        return bool(getattr(self.model, "pool_include_prefix", False))

    def observe_pooling(self, patch, hand_over) -> None:
        """timm's ``pool`` (``global_pool_nlc``) with the maximum's selection of the pooled tokens handed over."""
        if self.readout not in MAXIMUM_POOLINGS:
            return
        own = getattr(self.model, self.pooling.method)
        first = 0 if self.readout_includes_prefix else self.num_prefix_tokens

        def pool(x: Tensor, pool_type: str | None = None, **rest) -> Tensor:
            if pool_type is None:
                hand_over(max_selection(x[:, first:]))
            return own(x, pool_type, **rest)

        patch.set_attribute(self.model, self.pooling.method, pool)

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

    def lrp_allowed(self) -> tuple[type, ...]:
        """Also the model's rotary embedding, of whatever class (RoPE tables are constants of the input)."""
        return (*super().lrp_allowed(), type(getattr(self.model, "rope", None) or nn.Identity()))
