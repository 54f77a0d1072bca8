"""Generic attention explainability (Chefer et al., ICCV 2021)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import BlockRecord, ModelAdapter, Recording
from ..instrumentation.test_time_registers import Registers, test_time_registers
from ..registry import register_method
from ._products import ReadoutFold


@register_method(modalities=("image", "text"))
def gae(adapter: ModelAdapter, inputs: Tensor, target=None, *, registers: Registers | None = None) -> Tensor:
    """Generic Attention-model Explainability for self-attention encoders.

    Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting Bi-Modal and
    Encoder-Decoder Transformers", ICCV 2021, Eq. (5)-(6): R = I; for every block
    R <- R + mean_h((∇A ⊙ A)^+) · R; the class token's row over the patches (the readout's row for
    pooled readouts, docs/decisions/readouts.md; hierarchical models, docs/decisions/families.md).
    Gradients are of the target logit, as in hila-chefer/Transformer-MM-Explainability. The backward
    reaches the last block first, so the readout's row is pushed through each block's factor as the
    backward passes it (:class:`~._products.ReadoutFold`): one [B, N] row is kept, not a [B, N, N] factor
    per block (docs/decisions/performance.md).

    Options:
        registers: register neurons, (block, unit) pairs (``find_register_neurons``): the map is read with
            test-time registers (Jiang et al. 2025, docs/decisions/test-time-registers.md); None: the model as is.
    """
    fold = ReadoutFold(range(adapter.num_blocks))

    def cam(record: Recording, block: BlockRecord) -> None:
        """Block's mean_h((∇A ⊙ A)^+), folded into the readout's row."""
        fold(record.geometry, block.index, block.mixing((block.grads["attn"] * block.attn).clamp_(min=0).mean(1)))

    with test_time_registers(adapter, registers):
        record = adapter.record(inputs, target, fields=("attn",), grads=("attn",), reduce=cam)
    return fold.map(record.geometry)
