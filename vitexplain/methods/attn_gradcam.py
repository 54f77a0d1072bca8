"""Grad-CAM on the last block's attention, as Chefer et al. (CVPR 2021) evaluate it."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..registry import register_method


@register_method(modalities=("image", "text"),
                 precision_caveats={"bfloat16 weights": 0.986},
                 zero_map_reason="its ReLU (as in the reference code) removed every token's relevance: the "
                                 "gradient-weighted attention, averaged over the heads, was negative on every patch")
def attn_gradcam(adapter: ModelAdapter, inputs: Tensor, target=None) -> Tensor:
    """Gradient-weighted last-block attention ("GradCAM" baseline of Chefer et al., CVPR 2021).

    Per head h, the weight is the gradient of the target logit with respect to the attention,
    averaged over the class token's row (patch columns); the map is ReLU(mean_h w_h · A_h[cls, patches]).
    Follows ``generate_attn_gradcam`` of hila-chefer/Transformer-Explainability. With a pooled readout,
    the readout's rows take the class token's (docs/decisions/readouts.md).
    """
    record = adapter.record(inputs, target, fields=("attn",), blocks=(-1,), grads={"attn": (-1,)})
    block = record.blocks[-1]
    geometry = record.geometry
    prefix = geometry.num_prefix_tokens
    cam = geometry.readout_rows(block.mixing(block.attn))[..., prefix:]  # [B, H, patches]
    weights = geometry.readout_rows(block.mixing(block.grads["attn"]))[..., prefix:].mean(-1, keepdim=True)
    return geometry.patch_grid((cam * weights).mean(1).clamp(min=0))
