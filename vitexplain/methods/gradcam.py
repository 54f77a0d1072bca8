"""Grad-CAM on a ViT block's normalised tokens (Selvaraju et al., ICCV 2017), as pytorch-grad-cam applies it."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..registry import register_method
from ._cam import feature_map


@register_method(modalities=("image", "text"), reads="tokens",
                 zero_map_reason="Grad-CAM's ReLU removed every token's relevance: the gradient-weighted "
                                 "features were negative on every patch",
                 reference="latec",
                 departures="None in arithmetic: pytorch-grad-cam's Grad-CAM on the last block's `norm1` tokens, as "
                            "LATEC's copy runs it on a ViT. LATEC resizes each map to the image; ours stays on the "
                            "patch grid (the protocols upsample it bilinearly).")
def gradcam(adapter: ModelAdapter, inputs: Tensor, target=None, *, layer: int = -1) -> Tensor:
    """Grad-CAM with the patch tokens of a block's first LayerNorm output as the feature map.

    Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks via Gradient-based
    Localization", ICCV 2017, Eq. (1)-(2): channel weights α_c = 1/Z Σ_ij ∂y_c/∂A^c_ij (the
    gradient of the target logit averaged over the grid) and L = ReLU(Σ_c α_c A^c).

    Applied to ViTs as pytorch-grad-cam (jacobgil/pytorch-grad-cam, its ViT tutorial) does: the
    target layer is ``blocks[-1].norm1``, i.e. the tokens the last attention sublayer reads; the
    prefix tokens (class, distillation, register) are dropped and the patch tokens reshaped to the
    grid, channels = embedding dimensions (``_cam.py``, shared with Grad-CAM++ and Score-CAM). The
    map stays on the patch grid and unnormalised; the library's min-max scaling and resizing are
    left to visualisation.

    Options:
        layer: the block whose ``norm1`` output is the feature map (0-based, negative counts from the end).
    """
    cam = feature_map(adapter, inputs, target, layer, gradients=True)
    return cam.weighted_map(cam.gradients.mean(1, keepdim=True))  # α_c: the gradient's mean over the grid
