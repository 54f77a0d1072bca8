"""Insertion and deletion (Petsiuk et al., RISE, BMVC 2018) as run by TIS (Englebert et al., ICCVW 2023,
Tables 1-2).

TIS Sec. 4.2: 224 steps, four baselines (blur, random, black, mean). This reproduces ``metrics/utils.py``,
``insertion.py`` and ``deletion.py`` of aenglebert/Transformer_Input_Sampling:

* the map is upsampled bilinearly to the image and its pixels sorted by decreasing value (ties:
  lower row-major index first; the reference's unstable ``argsort`` leaves them unspecified);
* ``ceil(H * W / n_steps)`` pixels per step; sample s = 1 ... n_steps has the first
  ``min(s * per_step, H * W)`` pixels replaced (deletion: image -> baseline; insertion: baseline ->
  image), all channels at once; there is no sample for 0 pixels (as in the TIS code);
* score = softmax probability of the explained class;
* baselines are made from the *preprocessed* image, exactly as the TIS code does:
  ``blur`` = torchvision ``gaussian_blur`` (kernel 11 x 11, sigma 5, reflect padding), ``black`` =
  zeros of the preprocessed tensor (the dataset-mean colour, not black pixels), ``mean`` = the
  image's mean over channels and pixels, ``random`` = uniform [0, 1) values (drawn once on the CPU
  from a generator seeded with ``seed`` and shared by every image, so no image depends on its batch
  and no result on the device);
* AUC of a curve: RISE's ``auc`` (``evaluation.py`` of eclique/RISE), the trapezoidal area with the
  n points spread evenly over [0, 1]: (sum - first / 2 - last / 2) / (n - 1); the TIS repository
  stores the curves and does not include its AUC step.

Reported: mean insertion AUC (higher is better), deletion AUC (lower is better) and their difference.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ..maps import resize
from ..options import AtLeastTwo, PositiveInt
from ..seeding import seeded_draw
from ._common import check_image_batch, check_maps, check_targets, removal_rank
from ._perturb import mixed_logits
from .base import Curves, EvalBatch, even_steps, register_metric

Baseline = Literal["blur", "black", "mean", "random"]


def baseline_images(images: Tensor, baseline: str, seed: int = 0) -> Tensor:
    """The replacement image of each image [B or 1, C, H, W] (see the module docstring)."""
    if baseline == "blur":
        # imported here: torchvision's import pulls in torch._dynamo (about a second), which listing or checking
        # protocols does not need
        from torchvision.transforms.functional import gaussian_blur

        return gaussian_blur(images, kernel_size=[11, 11], sigma=[5.0, 5.0])
    if baseline == "black":
        return torch.zeros_like(images[:1])
    if baseline == "mean":
        return images.mean(dim=(1, 2, 3), keepdim=True)
    return seeded_draw(seed, lambda generator: torch.rand((1, *images.shape[1:]), generator=generator),
                       images.device).to(images.dtype)


def insertion_deletion(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                       n_steps: int = 224, baseline: str = "blur", batch_size: int = 128,
                       seed: int = 0) -> dict[str, Tensor]:
    """Per-image insertion and deletion curves.

    Args:
        forward: the classifier's forward, images -> logits (e.g. ``adapter_for(model).logits``, or a
            timm model in eval mode); called without gradients.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the image).
        targets: explained class per image [B].
        n_steps: points per curve (TIS: 224).
        baseline: ``"blur"``, ``"black"``, ``"mean"`` or ``"random"``.
        batch_size: perturbed images per forward.
        seed: seed of the ``random`` baseline.

    Returns:
        ``insertion`` and ``deletion``: [B, n_steps] target probabilities.
    """
    check_image_batch(images)
    return replacement_curves(forward, images, maps, targets, lambda checked: baseline_images(checked, baseline, seed),
                              n_steps=n_steps, batch_size=batch_size)


def replacement_curves(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor,
                       substitute: Callable[[Tensor], Tensor], *, n_steps: int, batch_size: int,
                       orders: tuple[str, ...] = ("insertion", "deletion")) -> dict[str, Tensor]:
    """The softmax probability of the explained class as ``ceil(H * W / n_steps)`` more pixels of the map's ranking
    are replaced at each of the n_steps steps, [B, n_steps] per order: ``"deletion"`` takes them from the
    replacement into the images, ``"insertion"`` from the images into the replacement, which ``substitute`` makes of
    the images once the inputs are checked ([B or 1, C or 1, H or 1, W or 1]). TIS's arithmetic, shared with pixel
    flipping (:mod:`vitexplain.metrics.pixel_flipping`)."""
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    pixels = images.shape[-2] * images.shape[-1]
    per_step = math.ceil(pixels / n_steps)
    counts = (torch.arange(1, n_steps + 1) * per_step).clamp(max=pixels)     # CPU: see mixed_logits
    rank = removal_rank(resize(maps, images.shape[-2:]), most_relevant_first=True)
    replacement = substitute(images)
    index = targets[:, None, None].expand(-1, n_steps, 1)

    def target_probability(first: Tensor, second: Tensor) -> Tensor:
        logits = mixed_logits(forward, first, second, rank, counts, batch_size)
        return logits.float().softmax(-1).gather(2, index)[..., 0]

    sources = {"insertion": (replacement, images), "deletion": (images, replacement)}
    return {order: target_probability(*sources[order]) for order in orders}


def curve_auc(curves: Tensor) -> Tensor:
    """RISE's normalised trapezoidal AUC of each curve [B, n] -> [B]."""
    return (curves.sum(-1) - curves[..., 0] / 2 - curves[..., -1] / 2) / (curves.shape[-1] - 1)


def reduce_insertion_deletion(values: dict[str, Tensor]) -> dict[str, float]:
    insertion = curve_auc(values["insertion"].to(torch.float64)).mean().item()
    deletion = curve_auc(values["deletion"].to(torch.float64)).mean().item()
    return {"insertion": insertion, "deletion": deletion, "insertion_minus_deletion": insertion - deletion}


@register_metric(
    "insertion_deletion",
    reduce=reduce_insertion_deletion,
    higher_is_better={"insertion": True, "deletion": False, "insertion_minus_deletion": True},
    cost=lambda options, method: 2 * options["n_steps"],
    group="faithfulness",
    # s / n_steps: exact when n_steps divides the pixels, as TIS's 224 steps at 224 px (else the last step is shorter)
    curves=Curves(lambda options, points: even_steps(1, points, options["n_steps"]),
                  "share of the pixels replaced, most relevant first (no point at 0, as in TIS's code)",
                  {"insertion": "probability of the explained class, pixels inserted into the baseline",
                   "deletion": "probability of the explained class, pixels replaced by the baseline"}),
    reference="latec",
    departures="LATEC's own insertion and deletion step 50 pixels at a time, insert into a 15 × 15 Gaussian blur (σ "
               "5) and delete into zeros of the preprocessed image; ours follows TIS's code: 224 steps, one baseline "
               "for both curves (an 11 × 11 blur, σ 5, by default; `baseline=\"black\"` is LATEC's deletion fill) and "
               "RISE's area.",
)
def _compute(batch: EvalBatch, *, n_steps: AtLeastTwo = 224,
             baseline: Baseline = "blur", batch_size: PositiveInt = 128,
             seed: int = 0) -> dict[str, Tensor]:
    return insertion_deletion(batch.logits, batch.images, batch.maps, batch.targets, n_steps=n_steps, baseline=baseline,
                              batch_size=batch_size, seed=seed)
