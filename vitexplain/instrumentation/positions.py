"""Where the tokens of one instrumented forward sit: its :class:`~.geometry.TokenGeometry`, from the family's
facts and what the forward saw (the readout's weights, the blocks' window layouts, the text's token mask)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from .geometry import TokenGeometry
from .inputs import TokenBatch
from .readouts import readout_weights
from .windows import WindowLayout, stage_grids


def token_geometry(adapter: Any, inputs: Any, layouts: Sequence[WindowLayout | None], last_tokens: int,
                   probe_attn: Tensor | None = None, selection: Tensor | None = None) -> TokenGeometry:
    """Where the tokens of one instrumented forward of ``inputs`` through ``adapter`` (a
    :class:`~.adapter.ModelAdapter` or a call of one) sit: its patch grid, its prefix tokens (the family's, or one
    more with test-time registers) and class token, the readout of the last block's ``last_tokens`` tokens (an
    attention-pooling head's attention ``probe_attn`` or a max-pooling head's ``selection`` from the same forward),
    each block's window ``layouts`` and the stages they give; for text, the token mask."""
    grid = adapter.grid_size(inputs)
    return TokenGeometry(
        grid=grid, num_prefix_tokens=adapter.num_prefix_tokens, class_token_index=adapter.class_token_index,
        readout=readout_weights(adapter.family, last_tokens, inputs.shape[0], adapter.device, probe_attn, selection),
        stages=stage_grids(layouts, grid),
        layouts=list(layouts), token_mask=inputs.attention_mask if isinstance(inputs, TokenBatch) else None)
