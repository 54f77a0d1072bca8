"""Score-CAM on a ViT block's normalised tokens (Wang et al., CVPRW 2020), as pytorch-grad-cam applies it."""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt, Score
from ..registry import register_method
from ._cam import feature_map
from ._pixel import chunks, mask_major_pairs

#: added to each mask's value range before dividing by it, as pytorch-grad-cam adds it (1e-8)
EPS = 1e-8


def channel_masks(maps: Tensor, size: tuple[int, int], upsampling: str) -> Tensor:
    """Activation maps [n, h, w] upsampled to the image [n, H, W] and min-max normalised to [0, 1] each.

    ``bilinear`` is pytorch-grad-cam's ``UpsamplingBilinear2d`` (corners aligned); ``nearest`` is LATEC's own
    copy of ScoreCAM. A constant map gives a mask of 0 (its range is 0, plus ``EPS``).
    """
    how = {"mode": "bilinear", "align_corners": True} if upsampling == "bilinear" else {"mode": "nearest"}
    masks = F.interpolate(maps[:, None], size=size, **how)[:, 0]
    low, high = masks.amin((1, 2), keepdim=True), masks.amax((1, 2), keepdim=True)
    return (masks - low) / (high - low + EPS)


@register_method(cost=769, reads="tokens",
                 zero_map_reason="Score-CAM's ReLU removed every token's relevance: the score-weighted features "
                                 "were negative on every patch",
                 reference="latec",
                 departures="pytorch-grad-cam's Score-CAM by default (masks upsampled bilinearly, corners aligned); "
                            "LATEC's own copy upsamples them by nearest neighbour (`upsampling=\"nearest\"`) and adds "
                            "1e-7 to each mask's range (not an option). 32 masked images a forward, as LATEC's "
                            "config.")
def scorecam(adapter: ModelAdapter, images: Tensor, target=None, *, layer: int = -1, score: Score = "logit",
             channel_weights: Literal["softmax", "score"] = "softmax",
             upsampling: Literal["bilinear", "nearest"] = "bilinear", batch_size: PositiveInt = 32) -> Tensor:
    """Score-CAM: each feature channel's map, as a mask on the image, weighted by the target score it keeps.

    Wang, Wang, Du, Yang, Zhang, Ding, Mardziel & Hu, "Score-CAM: Score-Weighted Visual Explanations
    for Convolutional Neural Networks", CVPR Workshops 2020, Sec. 3 and Algorithm 1: each channel's
    activation map A^k is upsampled to the image and min-max normalised, H^k = s(Up(A^k)); the
    image is masked with it, X ∘ H^k, and scored, S_k = f^c(X ∘ H^k); the weights are the softmax
    of the scores over the channels, α_k = exp(S_k) / Σ_j exp(S_j) (the baseline f^c(X_b) of the
    paper's increase of confidence is the same for every k, so the softmax drops it); then
    L = ReLU(Σ_k α_k A^k).

    As pytorch-grad-cam (``ScoreCAM``) computes it, which LATEC ran on ViTs: S_k is the target's
    logit, the upsampling bilinear with aligned corners, 1e-8 added to each map's range. The feature
    map is a block's ``norm1`` patch tokens, as for ``gradcam`` (``_cam.py``); the map stays on the
    patch grid, unnormalised. One forward per channel and image (768 for a ViT-B, the ``cost``),
    ``batch_size`` masked images at a time; a text direction or score function gives its own score
    S_k, softmaxed over the channels alike (docs/decisions/cam-methods.md).

    Options:
        layer: the block whose ``norm1`` output is the feature map (0-based, negative counts from the end).
        score: S_k of a class target: ``logit`` (pytorch-grad-cam's ``ClassifierOutputTarget``, LATEC),
            ``probability`` (softmax over the classes, the authors' code) or ``log_probability``.
        channel_weights: ``softmax`` (over the channels, the paper's Algorithm 1 and pytorch-grad-cam)
            or ``score`` (S_k itself: with ``score="probability"`` the authors' code's weights).
        upsampling: ``bilinear`` (pytorch-grad-cam) or ``nearest`` (LATEC's own copy of ScoreCAM).
        batch_size: masked images per forward (32 in LATEC's config); bounds memory, never changes a result.
    """
    cam = feature_map(adapter, images, target, layer, gradients=False)
    features = cam.features  # [B, patches, C]
    batch, patches, channels = features.shape
    maps = features.transpose(1, 2).reshape(batch, channels, *cam.record.geometry.grid_of(patches))
    size = tuple(images.shape[-2:])
    scores = torch.zeros(batch, channels, device=images.device)
    image_idx, channel_idx = mask_major_pairs(torch.full((batch,), channels, device=images.device))
    for part in chunks(len(image_idx), batch_size):
        img, channel = image_idx[part], channel_idx[part]
        masks = channel_masks(maps[img, channel], size, upsampling)
        logits = adapter.logits(images[img] * masks[:, None].to(images.dtype))
        scores[img, channel] = cam.record.target.select(img).score(logits, score).float()
    weights = scores.softmax(-1) if channel_weights == "softmax" else scores
    return cam.weighted_map(weights[:, None, :])
