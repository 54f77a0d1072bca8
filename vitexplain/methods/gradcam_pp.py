"""Grad-CAM++ on a ViT block's normalised tokens (Chattopadhay et al., WACV 2018), as pytorch-grad-cam applies it."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..registry import register_method
from ._cam import feature_map

#: added to α's denominator, as pytorch-grad-cam adds it (1e-6)
EPS = 1e-6


@register_method(reads="tokens",
                 precision_caveats={"bfloat16 weights": -0.548, "float16 weights": 0.048},
                 zero_map_reason="Grad-CAM++'s ReLU removed every token's relevance: the weighted features were "
                                 "negative on every patch",
                 reference="latec",
                 departures="None in arithmetic: pytorch-grad-cam's Grad-CAM++ (the closed-form α, 1e-6 in its "
                            "denominator) on the last block's `norm1` tokens, as LATEC runs it. LATEC resizes each "
                            "map to the image; ours stays on the patch grid.")
def gradcam_pp(adapter: ModelAdapter, inputs: Tensor, target=None, *, layer: int = -1) -> Tensor:
    """Grad-CAM++: Grad-CAM's channel weights with each position's gradient weighted by α, from one backward.

    Chattopadhay, Sarkar, Howlader & Balasubramanian, "Grad-CAM++: Generalized Gradient-based Visual
    Explanations for Deep Convolutional Networks", WACV 2018 (arXiv 1710.11063; equation numbers as
    pytorch-grad-cam cites them): channel weights w_c = Σ_ij α^c_ij ReLU(∂Y/∂A^c_ij) (Eq. 7, the
    ReLU keeping the positive gradients) with α in the closed form of Eq. 19, which holds for an
    exponential of the score, Y = exp(S), and needs only the first gradient g = ∂S/∂A:
    α^c_ij = g² / (2 g² + Σ_ab A^c_ab · g³); then L = ReLU(Σ_c w_c A^c).

    As pytorch-grad-cam (``GradCAMPlusPlus``) computes it, which LATEC ran on ViTs: S is the target's
    logit (for a text direction or a score function, its own score); α gets 1e-6 added to its
    denominator and is 0 where g = 0; the weights use ReLU(g), not the paper's ReLU(∂Y/∂A) =
    exp(S) ReLU(g): a positive factor per image, so the map is the paper's scaled by exp(-S). The
    feature map is a block's ``norm1`` patch tokens, as for ``gradcam`` (``_cam.py``); the map stays on
    the patch grid, unnormalised. Where the paper's features follow a ReLU, LayerNorm outputs have
    both signs, so Σ A and the denominator can be negative, and α has a pole where 2 + Σ A · g = 0: α is
    used as computed, as the reference does, which makes the maps move with the rounding of the weights
    (``precision_caveats``, docs/decisions/cam-methods.md).

    Options:
        layer: the block whose ``norm1`` output is the feature map (0-based, negative counts from the end).
    """
    cam = feature_map(adapter, inputs, target, layer, gradients=True)
    gradients = cam.gradients
    squared = gradients ** 2
    cubed = squared * gradients
    totals = cam.features.sum(1, keepdim=True)  # Σ_ab A^c_ab [B, 1, C]
    alpha = squared / (2 * squared + totals * cubed + EPS)
    alpha = torch.where(gradients != 0, alpha, torch.zeros_like(alpha))
    return cam.weighted_map((gradients.clamp(min=0) * alpha).sum(1, keepdim=True))
