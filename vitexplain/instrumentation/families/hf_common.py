"""What the transformers families share: recognising a transformers model, its attention implementation, the
attention modules of its vision encoders, running the model's own forward from given token embeddings, and the
[CLS] readout of their classifiers.

``transformers`` stays optional: nothing here imports it until a model's class shows it is loaded.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TypeVar

from torch import Tensor, nn

from ..attention import AttentionInput, AttentionParts
from .base import ClassTokenFirst, Family, loaded_classes

Served = TypeVar("Served")

#: Attention implementations whose masks the written-out attention understands.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face transformers model (without importing transformers for any other)."""
    if "transformers" not in sys.modules:  # a transformers model's class has imported it
        return False
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def served(model: nn.Module, by_class: Mapping[str, Served]) -> Served:
    """What ``by_class`` says of ``model``'s class (keys "package.module.Class"; the model is of one exactly)."""
    return next(value for name, value in by_class.items() if loaded_classes((name,)) == (type(model),))


def projections_attention(attention: nn.Module) -> AttentionParts:
    """A transformers vision attention module with ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` (ViT, DeiT,
    DINOv2)."""
    return AttentionParts(
        module=attention, num_heads=attention.num_attention_heads, head_dim=attention.head_dim,
        scale=attention.scaling, proj=attention.o_proj, query=attention.q_proj, key=attention.k_proj,
        value=attention.v_proj)


def attention_reason(model: nn.Module) -> str | None:
    """None when the model's attention implementation is one whose masks the written-out attention understands."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        return (f"its attention implementation is {implementation!r}; load it with attn_implementation="
                f"{' or '.join(map(repr, ATTENTION_IMPLEMENTATIONS))}")
    return None


def layer_inputs(hidden_states: Tensor, attention_mask: Tensor | None = None, *args,
                 **kwargs) -> tuple[Tensor, AttentionInput]:
    """A transformers encoder layer's call: hidden states and an (additive or boolean) attention mask."""
    return hidden_states, AttentionInput(mask=attention_mask)


@contextlib.contextmanager
def replaced_output(module: nn.Module, value: Tensor) -> Iterator[None]:
    """Within the block, ``module`` returns ``value`` whatever its input (its forward still runs)."""
    handle = module.register_forward_hook(lambda module, args, output: value)
    try:
        yield
    finally:
        handle.remove()


class TransformersClassifier(ClassTokenFirst, Family):
    """A transformers ``*ForSequenceClassification`` / ``*ForImageClassification``: class logits read from
    the [CLS] token, which comes first."""
