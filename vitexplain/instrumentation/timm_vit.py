"""Adapter for timm's VisionTransformer family: ViT, DeiT, DeiT distilled, register-token ViTs.

This is the only module that knows how timm builds these models. While recording, each block's
attention module runs an explicit (unfused) attention that also hands its q, k, v and probabilities
to the recorder; forward hooks collect the residual stream and the two sublayer outputs. Both are
undone when the context exits, so the model comes back exactly as it was.
"""
from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .base import ModelAdapter
from .patching import ModelPatch

try:  # timm >= 1.0.20 resolves boolean / causal masks with these helpers
    from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
except ImportError:  # pragma: no cover - older timm
    maybe_add_mask = resolve_self_attn_mask = None


def _timm_classes():
    from timm.models.vision_transformer import Block, VisionTransformer

    return VisionTransformer, Block


def _recording_attention_forward(self: nn.Module, x: Tensor, attn_mask: Tensor | None = None,
                                 is_causal: bool = False, *, entry: dict, detach_input: bool = False) -> Tensor:
    """timm ``Attention.forward`` written out unfused, handing its internals to ``entry``."""
    if detach_input:
        x = x.detach().requires_grad_(True)
    batch, tokens, _ = x.shape
    gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
    qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    logits = (q * self.scale) @ k.transpose(-2, -1)
    if attn_mask is not None or is_causal:
        if resolve_self_attn_mask is None:
            raise NotImplementedError("attention masks need timm >= 1.0.20 while recording")
        logits = maybe_add_mask(logits, resolve_self_attn_mask(tokens, logits, attn_mask, is_causal))
    attn = self.attn_drop(logits.softmax(dim=-1))
    entry.update(q=q, k=k, v=v, attn_logits=logits, attn=attn)
    out = (attn @ v).transpose(1, 2).reshape(batch, tokens, self.num_heads * self.head_dim)
    out = self.norm(out) if hasattr(self, "norm") else out
    if gate is not None:
        out = out * gate
    return self.proj_drop(self.proj(out))


class TimmViTAdapter(ModelAdapter):
    """Instrumentation for ``timm.models.vision_transformer.VisionTransformer`` and its subclasses."""

    family = "timm VisionTransformer"

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        try:
            VisionTransformer, Block = _timm_classes()
        except ImportError:  # pragma: no cover - timm is a dependency
            return "timm is not installed"
        if not isinstance(model, VisionTransformer):
            return f"{type(model).__name__} is not a timm VisionTransformer"
        for i, block in enumerate(model.blocks):
            if type(block).forward is not Block.forward:
                return f"block {i} is a {type(block).__name__}, not timm's pre-norm Block"
            attn = block.attn
            missing = [name for name in ("qkv", "q_norm", "k_norm", "proj", "num_heads", "head_dim") if not hasattr(attn, name)]
            if missing:
                return f"block {i}'s attention ({type(attn).__name__}) has no {', '.join(missing)}"
        return None

    # -- model facts ----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.model.blocks)

    @property
    def num_heads(self) -> int:
        return self.model.blocks[0].attn.num_heads

    @property
    def num_prefix_tokens(self) -> int:
        return self.model.num_prefix_tokens

    @property
    def class_token_index(self) -> int | None:
        return 0 if getattr(self.model, "cls_token", None) is not None else None

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.model.patch_embed.patch_size)

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        embed = self.model.patch_embed
        size = tuple(images.shape[-2:])
        if getattr(self.model, "dynamic_img_size", False):
            return tuple(embed.dynamic_feat_size(size))
        if getattr(embed, "strict_img_size", True) and size != tuple(embed.img_size):
            raise ValueError(
                f"this model takes {embed.img_size[0]}x{embed.img_size[1]} images, got {size[0]}x{size[1]}; "
                "resize them, or build the model with dynamic_img_size=True")
        return tuple(embed.grid_size)

    # -- recording ------------------------------------------------------------------------------
    @staticmethod
    def _head_projection(block: nn.Module) -> Tensor | None:
        attn = block.attn
        if getattr(attn, "gate", None) is not None or not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
            return None
        weight = attn.proj.weight  # [C, H*D]
        per_head = weight.t().reshape(attn.num_heads, attn.head_dim, weight.shape[0])
        gamma = getattr(block.ls1, "gamma", None)
        return per_head * gamma if gamma is not None else per_head

    @contextlib.contextmanager
    def _recording(self, store: list[dict[str, Tensor]], detach_attention_input: bool = False) -> Iterator[None]:
        with ModelPatch() as patch:
            for block in self.model.blocks:
                with torch.no_grad():
                    entry: dict[str, Tensor] = {"head_projection": self._head_projection(block)}
                store.append(entry)

                def keep(name, entry=entry):
                    def hook(module, args, output):
                        entry[name] = output
                    return hook

                patch.hook(block.register_forward_pre_hook(
                    lambda module, args, entry=entry: entry.__setitem__("residual", args[0])))
                patch.hook(block.norm1.register_forward_hook(keep("attn_input")))
                patch.hook(block.ls1.register_forward_hook(keep("attn_branch")))
                patch.hook(block.norm2.register_forward_hook(keep("mlp_input")))
                patch.hook(block.ls2.register_forward_hook(keep("mlp_branch")))
                patch.replace_forward(block.attn, types.MethodType(
                    lambda module, *args, entry=entry, **kwargs: _recording_attention_forward(
                        module, *args, entry=entry, detach_input=detach_attention_input, **kwargs),
                    block.attn))
            yield

    # -- token subsets --------------------------------------------------------------------------
    def apply_lrp_rules(self, writer) -> None:
        from .lrp_timm import apply_rules

        apply_rules(self, writer)

    def embed(self, images: Tensor) -> Tensor:
        model = self.model
        tokens = model._pos_embed(model.patch_embed(images))
        return model.norm_pre(model.patch_drop(tokens))

    def encode(self, tokens: Tensor) -> Tensor:
        model = self.model
        return model.forward_head(model.norm(model.blocks(tokens)))
