"""Generic attention explainability (Chefer et al., ICCV 2021)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter, Recording
from ..registry import register_method
from ._products import readout_map


@register_method("gae", modalities=("image", "text"))
def gae(adapter: ModelAdapter, inputs: Tensor, target=None) -> Tensor:
    """Generic Attention-model Explainability for self-attention encoders.

    Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal and
    Encoder-Decoder Transformers", ICCV 2021, Eq. (5)-(6): R = I; for every block
    R <- R + mean_h((∇A ⊙ A)^+) · R; the class token's row over the patches (the readout's row for
    pooled readouts, docs/decisions/readouts.md; hierarchical models, docs/decisions/families.md).
    Gradients are of the target logit, as in hila-chefer/Transformer-MM-Explainability.
    """
    record = adapter.record(inputs, target, fields=("attn",), grads=("attn",), reduce=_cam)
    return readout_map(record.geometry, [block.reduced for block in record.blocks])


def _cam(record: Recording, block: BlockRecord):
    """mean_h((∇A ⊙ A)^+) of one block, as a product factor."""
    return block.mixing((block.grads["attn"] * block.attn).clamp(min=0).mean(1))
