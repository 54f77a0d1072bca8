"""Raw attention: the last block's attention from the class token to the patches."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.test_time_registers import Registers, test_time_registers
from ..registry import register_method


@register_method(class_specific=False, modalities=("image", "text"), cost=1,
                 reference="latec",
                 departures="None in substance: LATEC's `attention` (Chefer et al.'s `last_layer_attn`) is the last "
                            "block's class-token attention averaged over heads, as ours. LATEC upsamples it 16× "
                            "bilinearly and min-max scales it; ours stays on the patch grid, unscaled.")
def raw_attention(adapter: ModelAdapter, inputs: Tensor, target=None, *,
                  registers: Registers | None = None) -> Tensor:
    """Last block's class-token attention over the patches, averaged over heads.

    The "RawAtten" baseline of Chefer et al. (CVPR 2021) and GradToken Eq. (3):
    R = 1/H sum_h A_h[cls, patches] of the final block. Not class-specific. With a pooled readout,
    the readout's row of the last attention (docs/decisions/readouts.md); on a hierarchical model the
    last stage's map comes to the first stage's grid (docs/decisions/families.md).

    Options:
        registers: register neurons, (block, unit) pairs (``find_register_neurons``): the map is read with
            test-time registers (Jiang et al. 2025, docs/decisions/test-time-registers.md); None: the model as is.
    """
    with test_time_registers(adapter, registers):
        record = adapter.record(inputs, target, fields=("attn",), blocks=(-1,))
    last = record.blocks[-1]
    return record.geometry.readout_row(last.mixing(last.attn.mean(1)))
