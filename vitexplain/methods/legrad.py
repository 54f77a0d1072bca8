"""LeGrad (Bousselham, Boggust, Chaybouti, Strobelt & Kuehne, ICCV 2025)."""
from __future__ import annotations

from typing import Literal

from torch import Tensor

from ..instrumentation import LayerScores, ModelAdapter
from ..instrumentation.test_time_registers import Registers, test_time_registers
from ..instrumentation.windows import mix_rows, tokens_in
from ..maps import min_max
from ..options import Score, block_index
from ..registry import register_method


@register_method
def legrad(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int = -2,
           layer_readout: Literal["released", "model"] = "released", normalise: bool = True,
           score: Score = "logit", registers: Registers | None = None) -> Tensor:
    """LeGrad: every layer's sensitivity of the output it would form to its own attention map.

    Bousselham, Boggust, Chaybouti, Strobelt & Kuehne, "LeGrad: An Explainability Method for Vision
    Transformers via Feature Formation Sensitivity", ICCV 2025 (arXiv 2404.03214). For each block l from
    ``start_layer`` to the last, the target is scored on the output the model would form from block l's
    tokens z^l, s^l = score(head(z^l)), and

        E^l = mean_i mean_h ReLU(∂s^l / ∂A^l_h)[i, :]     (A^l: block l's attention, rows i its queries)
        E   = min-max(Σ_l E^l)[patches]

    For an attention-pooling head (SigLIP), A^l is the probe's attention when it reads z^l (its one row).
    Each ∂s^l/∂A^l is the gradient of block l's own score only: every block's graph starts at its input,
    so one backward of Σ_l s^l gives them all (``LayerScores``). Defaults follow the authors' released
    code (WalBouss/LeGrad, ``legrad-torch`` 1.1): the last two blocks (``layer_index=-2``), and
    ``layer_readout="released"``, which reads a class-token or average-pooling model at the mean of all
    of z^l's tokens through the final norm and the head (their ``compute_legrad_clip``), and an
    attention-pooling model through the probe on z^l without the final norm (``compute_legrad_siglip``).
    Their SigLIP correction (zeroing where the map of the prompt "a photo of a" is high) needs the text
    tower and is not offered. Decisions and the measured agreement: docs/decisions/legrad.md.

    Options:
        start_layer: lowest block read (0-based, negative counts from the end).
        layer_readout: ``"released"`` (above) | ``"model"``: the model's own head on z^l (final norm,
            class token / pooling / probe, classifier), what the model would output if it ended at block l.
        normalise: min-max each map to [0, 1] (the authors'); False returns Σ_l E^l.
        score: ``"logit"`` | ``"probability"`` | ``"log_probability"`` for class targets (an embedding
            direction is scored by its cosine similarity, as the authors score text prompts).
        registers: register neurons, (block, unit) pairs (``find_register_neurons``): the map is read with
            test-time registers (Jiang et al. 2025, docs/decisions/test-time-registers.md); None: the model as is.
    """
    lowest = block_index("start_layer", start_layer, adapter.num_blocks)
    layers = range(lowest, adapter.num_blocks)
    probe = adapter.readout == "map"
    field = "probe_attn" if probe else "attn"
    released = layer_readout == "released"
    with test_time_registers(adapter, registers):
        record = adapter.record(images, target, fields=(), grads={field: layers}, score=score,
                                layer_scores=LayerScores(layers, mean_token=released and not probe,
                                                         final_norm=not (released and probe)))
    total = 0
    for block in record.blocks[lowest:]:
        sensitivity = block.grads[field].clamp(min=0).mean(1)  # [B, queries, keys] (per window when windowed)
        if probe:
            total = total + sensitivity[:, 0]  # the probe's one query
        else:
            mixing = block.mixing(sensitivity)
            queries = tokens_in(mixing)
            total = total + mix_rows(sensitivity.new_full((sensitivity.shape[0], queries), 1 / queries), mixing)
    geometry = record.geometry
    patches = geometry.readout.weights.shape[-1] - geometry.num_prefix_tokens  # a probe may read the patches only
    maps = geometry.patch_grid(total[:, -patches:])
    return min_max(maps, constant=0.0) if normalise else maps
