"""SRG, the Symmetric Relevance Gain: the area between the least- and the most-relevant-first removal curves
(Blücher, Vielhaben & Strodthoff, "Decoupling Pixel Flipping and Occlusion Strategy for Consistent XAI
Benchmarks", TMLR 2024; authors' code bluecher31/pixel-flipping).

Pixel flipping removes an image's features in the order of a map, most influential first (MIF) or least
influential first (LIF), and follows the model's score f while a fraction x of the image is occluded. Which fill
replaces the removed features (the occlusion strategy) decides which methods win MIF and LIF, and the two disagree.
The paper measures each against a random ordering, the most- and least-relevant gains

    MRG = AUC(random) - AUC(MIF),    LRG = AUC(LIF) - AUC(random),

and scores their sum, in which the random curve cancels:

    SRG = MRG + LRG = AUC(LIF) - AUC(MIF) = integral_0^1 [f_LIF(x) - f_MIF(x)] dx,

higher is better (a random map scores 0 in expectation, a constant one 0); its ranking of methods is
largely the same whatever the fill. As implemented:

* features: the ``patch_size`` x ``patch_size`` patches (16: the 14 x 14 patches the authors flip for a ViT at
  224 px, their ``vit_patches`` segmentation) of a grid centred on the image (``_regions.pixel_patches``), each
  scored by the mean of the map upsampled bilinearly over its pixels (the authors' superpixel mean); ties: the
  lower patch (raster order) first in both orders, so a constant map removes the same patches in MIF and LIF;
* curve points: after floor(R k / n) of the R patches are removed, k = 0 ... n (``n_steps``, 15: the authors'
  ``n_measurements``, spaced linearly), in both orders; the first (intact) and last (all removed) images are the
  same in both, so a map costs 2 n forwards;
* fill (``fill``): ``"zero"`` (default) = 0 in the preprocessed space, i.e. the normalisation's mean colour: the
  authors' default ``ConstantValueImputer(value=0)`` on normalised images; ``"black"`` = black pixels (the batch's
  ``-mean / std``, as the perturbation test; refused without them); ``"mean"`` = the image's mean over channels
  and pixels; ``"blur"`` = the image blurred (11 x 11, sigma 5); the last three are insertion / deletion's
  baselines. The authors' other imputers (training-set draws, inpainting, diffusion) need models of the data;
* f = the softmax probability of the explained class (the authors follow the label's; the bench explains the
  prediction or the label as its ``target`` says);
* areas: trapezoidal on the true x = (patches removed) / R, as the authors integrate their interpolated curves.

Per image ``srg``, ``mif_auc`` and ``lif_auc`` [B] and the curves ``mif`` / ``lif`` [B, n + 1]; reported the means
of ``srg`` (higher is better), ``mif_auc`` (lower is better) and ``lif_auc`` (higher is better).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from ..options import AtLeastTwo, PixelLength, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits
from ._regions import class_score, pixel_patches, pixel_rank, region_relevance, upsampled
from .base import Curves, EvalBatch, even_steps, register_metric
from .insertion_deletion import baseline_images

Fill = Literal["zero", "black", "mean", "blur"]


def fill_images(images: Tensor, fill: str, pixel_mean: Sequence[float] | None = None,
                pixel_std: Sequence[float] | None = None) -> Tensor:
    """What replaces the removed patches [B or 1, C or 1, H or 1, W or 1] (see the module docstring)."""
    if fill == "zero":
        return baseline_images(images, "black")                    # TIS's "black": zeros of the preprocessed tensor
    if fill == "black":
        return black_pixel(images, pixel_mean, pixel_std)
    return baseline_images(images, fill)


def symmetric_relevance_gain(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                             patch_size: int = 16, n_steps: int = 15, fill: str = "zero",
                             pixel_mean: Sequence[float] | None = None, pixel_std: Sequence[float] | None = None,
                             batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image MIF and LIF curves and the area between them.

    Args:
        forward: the classifier's forward, images -> logits; called without gradients, in chunks of
            ``batch_size`` perturbed images.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose probability is followed (the explained class) [B].
        patch_size: side of the square features, in pixels.
        n_steps: curve points after the intact image (the k-th has floor(R k / n_steps) of the R patches removed).
        fill: ``"zero"``, ``"black"``, ``"mean"`` or ``"blur"``.
        pixel_mean, pixel_std: per channel, the normalisation the images went through (``fill="black"`` only).
        batch_size: perturbed images per forward.

    Returns:
        ``srg``, ``mif_auc``, ``lif_auc`` [B] and ``mif``, ``lif`` [B, n_steps + 1] (probabilities).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    substitute = fill_images(images, fill, pixel_mean, pixel_std)
    labels, count = pixel_patches(images.shape[-2], images.shape[-1], patch_size, images.device)
    relevance = region_relevance(upsampled(maps, images), labels[None], count, "mean")
    removed = torch.tensor([count * k // n_steps for k in range(n_steps + 1)])   # CPU: see mixed_logits

    def curve(most_relevant_first: bool, counts: Tensor) -> Tensor:
        rank = pixel_rank(relevance, labels[None], most_relevant_first)
        return class_score(mixed_logits(forward, images, substitute, rank, counts, batch_size), targets)

    mif = curve(True, removed)
    lif = torch.cat([mif[:, :1], curve(False, removed[1:-1]), mif[:, -1:]], 1)     # shared intact / all-removed
    x = (removed.to(images.device, torch.float64) / count).expand(mif.shape[0], -1)
    mif_auc = torch.trapezoid(mif.to(torch.float64), x, dim=1)
    lif_auc = torch.trapezoid(lif.to(torch.float64), x, dim=1)
    return {"srg": (lif_auc - mif_auc).float(), "mif_auc": mif_auc.float(), "lif_auc": lif_auc.float(),
            "mif": mif, "lif": lif}


reduce_srg = Means(srg="srg", mif_auc="mif_auc", lif_auc="lif_auc")


@register_metric(
    "srg",
    reduce=reduce_srg,
    higher_is_better={"srg": True, "mif_auc": False, "lif_auc": True},
    cost=lambda options, method: 2 * options["n_steps"],
    group="faithfulness",
    # k / n_steps: exact when n_steps divides the patches (the areas themselves use the true shares)
    curves=Curves(lambda options, points: even_steps(0, points, options["n_steps"]),
                  "share of the patches replaced (0 = the image itself)",
                  {"mif": "probability of the explained class, most relevant patches removed first (MIF)",
                   "lif": "probability of the explained class, least relevant patches removed first (LIF)"}),
    reference="quantus",
    departures="Quantus 0.6.0 has no SRG; its main branch's `SymmetricRelevanceGain` flips single input entries into "
               "the image's mean in 28 steps; ours flips the authors' 16 px patches into 0 of the normalised image "
               "in 15 steps. With its features, steps and fill, per-image SRG agrees to 1e-5.",
)
def _compute(batch: EvalBatch, *, patch_size: PixelLength = 16, n_steps: AtLeastTwo = 15,
             fill: Fill = "zero",
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return symmetric_relevance_gain(batch.logits, batch.images, batch.maps, batch.targets, patch_size=patch_size,
                                    n_steps=n_steps, fill=fill, pixel_mean=batch.mean, pixel_std=batch.std,
                                    batch_size=batch_size)
