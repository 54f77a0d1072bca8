"""Attention rollout (Abnar & Zuidema, ACL 2020)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.test_time_registers import Registers, test_time_registers
from ..options import OpenShare, block_index
from ..registry import register_method
from ._fusion import HeadFusion, fuse
from ._products import readout_map


def discard_lowest(attn: Tensor, ratio: float, keep_index: int) -> Tensor:
    """Zero the ``ratio`` fraction of smallest entries of each [N, N] map (or of all a windowed map's
    [windows, T, T] weights), except entry (keep, keep) (keep < 0: none protected).

    This is the ``discard_ratio`` of the widely used vit-explain implementation of rollout
    (J. Gildenblat), which the paper does not have; it sharpens maps of deep models.
    """
    if ratio <= 0:
        return attn
    batch, n = attn.shape[0], attn.shape[-1]
    flat = attn.reshape(batch, -1).clone()
    count = int(flat.shape[1] * ratio)
    ranked = flat.clone()
    if keep_index >= 0:
        ranked[:, keep_index * n + keep_index] = float("inf")
    drop = ranked.topk(count, dim=1, largest=False).indices
    flat.scatter_(1, drop, 0.0)
    return flat.reshape(attn.shape)


@register_method(class_specific=False, modalities=("image", "text"), cost=1,
                 reference="latec",
                 departures="LATEC's `attentionrollout` runs Chefer et al.'s `method=\"rollout\"`, which rolls out the "
                            "positive LRP relevance of each block's attention (the identity added, rows not "
                            "renormalised), not the attention itself. Ours is Abnar & Zuidema's rollout of the "
                            "attention, rows renormalised, as the paper.")
def rollout(adapter: ModelAdapter, inputs: Tensor, target=None, *, start_layer: int = 0,
            head_fusion: HeadFusion = "mean", discard_ratio: OpenShare = 0.0,
            registers: Registers | None = None) -> Tensor:
    """Attention rollout: the product of residual-augmented, row-normalised attention over blocks.

    Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, Sec. 3:
    Ã_l = (fuse_h A_l + I) / rowsum, R = Ã_L ... Ã_start; the class token's row over the patches (the
    readout's row for pooled readouts, docs/decisions/readouts.md; through a hierarchical model's
    windows and patch merges, docs/decisions/families.md).

    Options:
        start_layer: first block included (Chefer et al.'s segmentation test uses 1).
        head_fusion: how heads are combined, ``mean`` (the paper) | ``max`` | ``min``.
        discard_ratio: share of the smallest fused attention weights set to zero in every block
            before the identity is added (vit-explain's option; 0 = the paper).
        registers: register neurons, (block, unit) pairs (``find_register_neurons``): the map is read with
            test-time registers (Jiang et al. 2025, docs/decisions/test-time-registers.md); None: the model as is.
    """
    start = block_index("start_layer", start_layer, adapter.num_blocks)
    with test_time_registers(adapter, registers):
        record = adapter.record(inputs, target, fields=("attn",), blocks=range(start, adapter.num_blocks))
    keep = adapter.class_token_index if adapter.class_token_index is not None else -1
    layers = [block.mixing(discard_lowest(fuse(block.attn, 1, head_fusion), discard_ratio, keep))
              for block in record.blocks[start:]]
    return readout_map(record.geometry, layers, normalise=True)
