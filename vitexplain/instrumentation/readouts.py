"""What a model's output takes from each of its last block's tokens (a :class:`~.geometry.Readout`), by how its head
reads them (``Family.readout``; docs/decisions/readouts.md)."""
from __future__ import annotations

import torch
from torch import Tensor

from .families.base import Family
from .geometry import Readout


def readout_weights(family: Family, tokens: int, batch: int, device: torch.device, probe_attn: Tensor | None = None,
                    selection: Tensor | None = None) -> Readout:
    """What the output of ``family``'s model takes from each of the last block's ``tokens`` tokens; ``probe_attn`` is
    an attention-pooling head's attention [B, H, latents, N'] from the same forward, ``selection`` a max-pooling
    head's selection of the tokens it pools [B, N'] (``Family.observe_pooling``)."""
    kind = family.readout
    if kind == "map":
        attn = probe_attn.detach()
        weights = attn.mean(1)[:, 0]
        if weights.shape[-1] < tokens:  # the head read the patch tokens only
            weights = torch.nn.functional.pad(weights, (tokens - weights.shape[-1], 0))
        return Readout(kind, weights.float())
    weights = torch.zeros(batch, tokens, device=device)
    prefix = family.num_prefix_tokens
    if kind == "token":
        weights[:, family.class_token_index] = 1
    elif kind == "token_avg":  # a head on the class token concatenated with the patch tokens' mean: half each
        weights[:, family.class_token_index] = 1 / 2
        weights[:, prefix:] = 1 / (2 * (tokens - prefix))
    else:
        first = 0 if getattr(family, "readout_includes_prefix", False) else prefix
        weights[:, first:] = 1 / (tokens - first)
        if kind == "avgmax":  # half the mean, half the maximum (its selection averaged over the channels)
            weights[:, first:] = (weights[:, first:] + selection.to(weights)) / 2
        elif kind == "max":
            weights[:, first:] = selection.to(weights)
    return Readout(kind, weights)
