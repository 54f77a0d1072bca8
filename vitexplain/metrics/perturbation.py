"""Perturbation test: top-1 accuracy while the most / least relevant pixels are removed
(TokenTM Tables 2-4, GradToken Table 2).

TokenTM (Wu et al., CVPR 2024) Sec. 5.2 "Impact on Accuracy" and GradToken (Cheng et al., Neural
Networks 2024) Sec. 4.1.2 / 4.2.2 follow Chefer et al. (CVPR 2021); this reproduces
``baselines/ViT/generate_visualizations.py`` and ``pertubation_eval_from_hdf5.py`` of
hila-chefer/Transformer-Explainability:

* the map is upsampled bilinearly to the image and min-max normalised; pixels (not patches) are
  ranked on it, most relevant first ("positive") or least relevant first ("negative");
* at step k (fraction k / n_steps, k = 0 ... n_steps - 1, i.e. 0 %, 10 %, ..., 90 %) the first
  ``int(H * W * k / n_steps)`` pixels are set to 0 in all channels *before* normalisation, i.e. to
  black, which in the preprocessed space is ``-mean / std`` (the batch's ``mean`` / ``std``: the
  normalisation the images went through);
* a step is correct when the model's top-1 class equals the ground-truth label (whatever class was
  explained: "predicted" vs "ground-truth" in the tables only changes ``targets`` of the maps);
* AUC = ``np.trapz(accuracy, x=[0, 0.1, ..., 0.9]) * 100`` with the unperturbed accuracy at x = 0
  (H. Chefer, hila-chefer/Transformer-Explainability issue #31).

Ties in the map are removed in raster order (lower row-major index first), in both directions.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from ..options import AtLeastTwo, PositiveInt
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits, ranked_by_relevance, removal_counts
from .base import Curves, EvalBatch, even_steps, register_metric

Direction = Literal["both", "positive", "negative"]


def perturbation_test(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, labels: Tensor, *,
                      pixel_mean: Sequence[float], pixel_std: Sequence[float], direction: str = "both",
                      n_steps: int = 10, batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image correctness at every perturbation step.

    Args:
        forward: the classifier's forward, images -> logits (e.g. ``adapter_for(model).logits``, or a
            timm model in eval mode); called without gradients.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (any resolution; upsampled bilinearly).
        labels: ground-truth classes [B].
        direction: ``"positive"`` (most relevant removed first), ``"negative"`` (least relevant
            first) or ``"both"``.
        n_steps: number of steps; fractions k / n_steps for k < n_steps (10: 0 %, 10 %, ..., 90 %).
        batch_size: perturbed images per forward.
        pixel_mean, pixel_std: per channel, the normalisation the images were preprocessed with,
            to know what a black pixel is.

    Returns:
        ``positive`` and / or ``negative``: [B, n_steps] 1.0 where the top-1 class is the label.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    labels = check_targets(labels, images, "labels")
    if (labels < 0).any():
        raise ValueError("the perturbation test needs a ground-truth label (>= 0) for every image")
    counts = removal_counts(images.shape[-2] * images.shape[-1], n_steps)
    black = black_pixel(images, pixel_mean, pixel_std)
    chosen = ("positive", "negative") if direction == "both" else (direction,)
    result = {}
    for name in chosen:
        rank = ranked_by_relevance(maps, images, most_relevant_first=name == "positive")
        logits = mixed_logits(forward, images, black, rank, counts, batch_size)
        result[name] = (logits.argmax(-1) == labels[:, None]).float()
    return result


def perturbation_auc(correct: Tensor) -> float:
    """``np.trapz(mean accuracy, x=[0, 1/S, ..., (S-1)/S]) * 100`` of per-image correctness [B, S]."""
    curve = correct.to(torch.float64).mean(0)
    return 100 * torch.trapezoid(curve, dx=1 / curve.numel()).item()


def reduce_perturbation(values: dict[str, Tensor]) -> dict[str, float]:
    return {f"{name}_auc": perturbation_auc(values[name]) for name in ("positive", "negative") if name in values}


@register_metric(
    "perturbation",
    reduce=reduce_perturbation,
    requires=("labels",),
    higher_is_better={"positive_auc": False, "negative_auc": True},
    cost=lambda options, method: options["n_steps"] * (2 if options["direction"] == "both" else 1),
    group="faithfulness",
    curves=Curves(lambda options, points: even_steps(0, points, options["n_steps"]),
                  "share of the pixels set to black (0 = the image itself)",
                  {"positive": "top-1 accuracy, most relevant pixels removed first",
                   "negative": "top-1 accuracy, least relevant pixels removed first"}),
)
def _compute(batch: EvalBatch, *, direction: Direction = "both",
             n_steps: AtLeastTwo = 10, batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return perturbation_test(batch.logits, batch.images, batch.maps, batch.labels, pixel_mean=batch.mean,
                             pixel_std=batch.std, direction=direction, n_steps=n_steps, batch_size=batch_size)
