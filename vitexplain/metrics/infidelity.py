"""Infidelity (Yeh, Hsieh, Suggala, Inouye & Ravikumar, "On the (In)fidelity and Sensitivity of Explanations",
NeurIPS 2019, Sec. 2, Eq. 2; authors' code chihkuanyeh/saliency_evaluation, ``infid_sen_utils.get_exp_infid``).

    INFD(Φ, f, x) = E_{I ~ μ_I} [ (I^T Φ(f, x) - (f(x) - f(x - I)))^2 ],

the expected squared error between the change of the score that the map predicts for a perturbation I (its dot
product with I) and the change the model shows; lower is better. Computed by Captum's ``captum.metrics.infidelity``
(a dependency), which evaluates exactly this mean over ``n_samples`` perturbations, given here:

* a seeded perturbation function: the ``n_samples`` perturbations are drawn once (``seeding.seeded_draw``) and shared
  by every image, so no value depends on the batch or the device; Captum's repeated inputs are matched to them in the
  order Captum makes them (each image's samples together, ``repeat_interleave``);
* the two perturbations of the paper's image experiments, in pixel units (the images un-normalised with the batch's
  ``mean`` / ``std``; a batch without them is refused):

  - ``"square"`` (default): x - I = x with one square black (0 before normalisation), the square drawn uniformly
    among all squares of sides 1 ... R at every position (the authors' ``get_imageset``, which enumerates every
    square of sides 1 ... 10 on 28-px MNIST; **ours**: R = round(10 / 28 x the shorter side), the same share of the
    image, 40 px at 112 and 80 at 224);
  - ``"noisy_baseline"``: x - I = a noisy black image, N(0, 0.2^2) per pixel and channel clipped to [0, 1] (the
    authors' ``set_zero_infid`` on every pixel);

* Φ = the map upsampled bilinearly to the image, the same value in every channel (I^T Φ sums I over the channels
  of a pixel, as Quantus broadcasts a map to the channels);
* ``normalize=True`` (default): Φ is scaled first by the β minimising the error, β = E[I^T Φ Δf] / E[(I^T Φ)^2], as
  the authors' code does before every score ("performs optimal scaling for each explanation") and Captum's
  ``normalize``; without it the number measures the map's units (most maps here are min-max normalised), not its
  fidelity. f = the explained class's logit (``score``: or its probability or log-probability; the authors' MNIST
  networks output logits).

Per image ``infidelity`` [B]; reported its mean (↓). Cost: ``n_samples`` forwards per image, chunked in
``batch_size`` perturbed images (Captum's ``max_examples_per_batch``), plus one of the image per chunk.

Quantus's ``Infidelity`` differs (docs/decisions/metrics-latec-faithfulness-2.md): it replaces *every* 4 x 4 patch in
turn, cumulatively, with black, so each of its samples is the same deterministic sweep, and it does not rescale Φ.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from ..maps import resize
from ..options import PositiveInt, Score
from ..seeding import seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import normalisation
from .base import EvalBatch, register_metric

Perturbation = Literal["square", "noisy_baseline"]

#: the authors' squares: sides 1 ... 10 on 28 x 28 MNIST digits
SQUARE_SHARE = 10 / 28
#: the authors' noisy baseline: N(0, 0.2^2) in [0, 1] pixel units
NOISE_STD = 0.2


def square_masks(n_samples: int, height: int, width: int, seed: int) -> Tensor:
    """``n_samples`` squares [n, 1, H, W] (bool), each drawn uniformly among every square of sides 1 ... R at every
    position inside the image, R = max(1, round(10 / 28 x the shorter side))."""
    largest = max(1, round(SQUARE_SHARE * min(height, width)))
    sides = torch.arange(1, largest + 1)
    places = (height - sides + 1) * (width - sides + 1)
    ends = places.cumsum(0)
    drawn = seeded_draw(seed, lambda generator: torch.randint(int(ends[-1]), (n_samples,), generator=generator))
    masks = torch.zeros(n_samples, 1, height, width, dtype=torch.bool)
    for sample, pick in enumerate(drawn.tolist()):
        kind = int(torch.searchsorted(ends, pick, right=True))
        side, place = kind + 1, pick - (int(ends[kind - 1]) if kind else 0)
        top, left = divmod(place, width - side + 1)
        masks[sample, 0, top:top + side, left:left + side] = True
    return masks


def infidelity(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
               pixel_mean: Sequence[float], pixel_std: Sequence[float], perturbation: str = "square",
               n_samples: int = 50, normalize: bool = True, score: str = "logit", batch_size: int = 128,
               seed: int = 0) -> Tensor:
    """Per-image infidelity [B] (see the module docstring).

    Args:
        forward: images -> logits, batched, called without gradients.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: the explained class of each image [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through.
        perturbation: ``"square"`` or ``"noisy_baseline"``.
        n_samples: perturbations per image.
        normalize: scale each map by its optimal β first (Captum's ``normalize``).
        score: the explained class's ``"logit"``, ``"probability"`` or ``"log_probability"``.
        batch_size: perturbed images per forward.
        seed: seed of the perturbations.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    mean, std = normalisation(images, pixel_mean, pixel_std)
    batch, channels, height, width = images.shape
    if perturbation == "square":
        masks = square_masks(n_samples, height, width, seed).to(images.device)
        black = -mean / std

        def perturbed(rows: Tensor, samples: Tensor) -> Tensor:
            return torch.where(masks[samples], black, rows)
    else:
        noise = seeded_draw(seed, lambda generator: torch.randn((n_samples, channels, height, width),
                                                                generator=generator), images.device)
        baselines = ((noise.to(images.dtype) * NOISE_STD).clamp(0, 1) - mean) / std

        def perturbed(rows: Tensor, samples: Tensor) -> Tensor:
            return baselines[samples]

    def scores(inputs: Tensor) -> Tensor:
        logits = forward(inputs).double()         # float64: Captum's normalised error is a difference of sums
        return {"logit": logits, "probability": logits.softmax(-1), "log_probability": logits.log_softmax(-1)}[score]

    from captum.metrics import infidelity as captum_infidelity  # here: captum's import takes half a second

    relevance = resize(maps.double(), (height, width))[:, None].expand(-1, channels, -1, -1)
    values = []
    for begin in range(0, batch, batch_size):
        rows = slice(begin, begin + batch_size)
        drawn = 0

        def perturb(inputs: Tensor) -> tuple[Tensor, Tensor]:
            # Captum repeats each image for the samples of this call, image by image: the next samples of our draw
            nonlocal drawn
            per_image = inputs.shape[0] // images[rows].shape[0]
            samples = (torch.arange(per_image, device=inputs.device) + drawn).repeat(images[rows].shape[0])
            drawn += per_image
            changed = perturbed(inputs, samples)
            return inputs - changed, changed

        values.append(captum_infidelity(scores, perturb, images[rows], relevance[rows].contiguous(),
                                        target=targets[rows], n_perturb_samples=n_samples,
                                        max_examples_per_batch=min(batch_size, images[rows].shape[0] * n_samples),
                                        normalize=normalize))
    return torch.cat(values)


reduce_infidelity = Means(infidelity="infidelity")


@register_metric(
    "infidelity",
    reduce=reduce_infidelity,
    higher_is_better={"infidelity": False},
    cost=lambda options, method: options["n_samples"] + 1,
    group="faithfulness",
    reference=("latec", "quantus"),
    departures="LATEC calls Captum's `infidelity` with Gaussian noise (σ 0.005 per entry, NumPy's global generator) "
               "and no scaling; Quantus sweeps every 4 × 4 patch cumulatively into a fixed baseline, without draws "
               "or scaling. Ours wraps Captum's `infidelity` with the paper's perturbations (seeded black squares by "
               "default) and the authors' optimal scaling β (`normalize=False`: the plain error).",
)
def _compute(batch: EvalBatch, *, perturbation: Perturbation = "square", n_samples: PositiveInt = 50,
             normalize: bool = True, score: Score = "logit", batch_size: PositiveInt = 128,
             seed: int = 0) -> dict[str, Tensor]:
    return {"infidelity": infidelity(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                                     pixel_std=batch.std, perturbation=perturbation, n_samples=n_samples,
                                     normalize=normalize, score=score, batch_size=batch_size, seed=seed)}
