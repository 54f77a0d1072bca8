"""What the class activation map methods share (Grad-CAM, Grad-CAM++, Score-CAM): a block's normalised patch
tokens as the feature map, and the ReLU of their channel-weighted sum.

pytorch-grad-cam (jacobgil/pytorch-grad-cam, its ViT tutorial) applies every CAM method to a ViT with
``target_layers=[model.blocks[-1].norm1]`` and a ``reshape_transform`` that drops the prefix tokens and lays the
patch tokens out on the grid, channels = embedding dimensions; LATEC (Klein et al., NeurIPS 2024,
``utils/hidden_layer_selection.py``) takes the same layer for ViTs. Here that feature map is the recording's
``attn_input`` (the block's first LayerNorm output) of one block, patch tokens only, [B, patches, C]: a
position is a token of the block's own stage (a later stage of a hierarchical model has fewer), and
``geometry.patch_grid`` brings a map over those tokens to the first stage's grid.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.recording import Recording
from ..options import block_index


@dataclass(frozen=True)
class FeatureMap:
    """A block's normalised patch tokens A [B, patches, C] and, when asked, the target score's gradient at them;
    ``record`` is the recording they come from (its geometry, target and logits). Text comes without padding
    (``explain`` runs each length apart), so every position is a token of the input."""

    record: Recording
    features: Tensor
    gradients: Tensor | None

    def weighted_map(self, weights: Tensor) -> Tensor:
        """L = ReLU(Σ_c w_c A^c) on the grid [B, h, w], for channel weights [B, 1, C]."""
        return self.record.geometry.patch_grid((self.features * weights).sum(-1).clamp(min=0))


def feature_map(adapter: ModelAdapter, inputs, target, layer: int, *, gradients: bool) -> FeatureMap:
    """Block ``layer``'s ``norm1`` patch tokens of ``inputs`` (one recorded forward) and, with ``gradients``, the
    gradient of the target's logit at them (one backward, stopping at that block)."""
    chosen_index = block_index("layer", layer, adapter.num_blocks)
    record = adapter.record(inputs, target, fields=("attn_input",), blocks=(chosen_index,),
                            grads={"attn_input": (chosen_index,)} if gradients else ())
    chosen = record.blocks[chosen_index]
    prefix = record.geometry.num_prefix_tokens
    gradient = chosen.grads["attn_input"][:, prefix:] if gradients else None
    return FeatureMap(record, chosen.attn_input[:, prefix:], gradient)  # [B, patches, C] each
