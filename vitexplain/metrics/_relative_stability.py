"""The arithmetic shared by relative input, output and representation stability (Agarwal et al., "Rethinking
Stability for Attribution-based Explanations", ICLR 2022 PAIR^2Struct workshop, arXiv 2203.06877).

The three metrics (Eqs. 2, 3 and 5 of the paper) share a numerator, the relative change of the explanation, and
differ in what the change of the map is divided by:

    R(x) = max_{x'} || (e_x - e_x') / e_x ||_2 / max(D(x, x'), eps_min),   x' in N_x with argmax f(x') = argmax f(x)

    RIS: D = || (x - x') / x ||_2        (the relative change of the input),
    ROS: D = || h(x) - h(x') ||_2        (the change of the output logits; the paper does not divide it by h(x)),
    RRS: D = || (L_x - L_x') / L_x ||_2  (the relative change of an internal representation).

Divisions are element-wise. An element of e_x, x or L_x that is exactly 0 is replaced by ``eps_min`` in its
division (the paper is silent; Quantus 0.6.0 does this); the denominator is bounded below by ``eps_min`` as the
paper's max(., eps_min) says (Quantus replaces only an exact 0 by it). Perturbed copies whose predicted class differs
from the image's are left out of the maximum, as the paper's neighbourhood condition asks (Quantus makes the whole
image's value NaN as soon as one copy changed its prediction); an image none of whose copies kept its prediction
has no value (NaN), counted by the reduction as ``undefined``. docs/decisions/metrics-relative-stability.md.

The n perturbations are drawn once from ``seed`` on the CPU and added to every image (an image's value does not
depend on its batch); copy s is explained with ``copy=s`` (:func:`._common.explain_copy`), so the random control draws
afresh for each; the forwards that check the predictions (and read the logits or the representation) run over every
copy of the batch at once, in chunks of ``batch_size``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from ..seeding import seeded_draw
from ._common import check_image_batch, check_maps, explain_copy

#: where the three relative stabilities depart from Quantus and LATEC in their noise and prediction rule (the
#: catalogue's departures line of each, which adds its own agreement figure)
NOISE_DEPARTURES = ("Quantus's noise is uniform in [0.02, 0.2] (always brightening), 200 samples per image from "
                    "NumPy's global generator, and one copy that changes the prediction makes the image NaN "
                    "(LATEC: the max over all copies, 10 of them); ours draws 50 Gaussian copies (σ 0.05, the "
                    "authors') once from `seed` and leaves out copies that change the prediction, as the paper.")

Kind = Literal["input", "output", "representation"]


def passes(options: dict, method: float, forwards_per_copy: int = 1) -> float:
    """Model passes per image: the method on every copy, and ``forwards_per_copy`` forwards of the image and of every
    copy (the predictions; RRS reads its representation in a forward of its own)."""
    return options["n_samples"] * method + forwards_per_copy * (options["n_samples"] + 1)


def gaussian_noise(n_samples: int, shape: tuple[int, ...], noise: float, seed: int,
                   device: torch.device | str = "cpu") -> Tensor:
    """The n perturbations [n, *shape], N(0, noise^2) per element, drawn on the CPU from ``seed`` and moved to
    ``device`` (the same numbers on every device); the local Lipschitz estimate draws its perturbations here too."""
    return seeded_draw(seed, lambda generator: torch.randn((n_samples, *shape), generator=generator) * noise, device)


def relative_change(reference: Tensor, changed: Tensor, eps_min: float) -> Tensor:
    """|| (reference - changed) / reference ||_2 per row [B] of [B, ...] tensors, an element of ``reference`` that
    is 0 divided as ``eps_min``; float32."""
    reference, changed = reference.flatten(1).float(), changed.flatten(1).float()
    divisor = torch.where(reference == 0, torch.full_like(reference, eps_min), reference)
    return ((reference - changed) / divisor).norm(dim=1)


def _chunked(forward: Callable[[Tensor], Tensor], images: Tensor, noise: Tensor, batch_size: int) -> Tensor:
    """``forward`` of every copy images[b] + noise[s], in the order (s, b), batch_size copies per call: [n * B, ...]."""
    count, copies = images.shape[0], noise.shape[0] * images.shape[0]
    parts = []
    for start in range(0, copies, batch_size):
        index = torch.arange(start, min(start + batch_size, copies), device=images.device)
        parts.append(forward(images[index % count] + noise[index // count]))
    return torch.cat(parts)


def relative_stability(kind: Kind, explain: Callable[..., Tensor], logits: Callable[[Tensor], Tensor],
                       images: Tensor, maps: Tensor, targets: Tensor, *,
                       features: Callable[[Tensor], Tensor] | None = None, n_samples: int = 50, noise: float = 0.05,
                       eps_min: float = 1e-6, seed: int = 0, batch_size: int = 64) -> Tensor:
    """RIS, ROS or RRS (``kind``) of each image's explanation [B] (NaN: no copy kept the image's prediction).

    Args:
        kind: ``"input"`` (RIS), ``"output"`` (ROS) or ``"representation"`` (RRS).
        explain: (images, targets) -> maps [B, h, w], the method under test; copy s gets ``copy=s`` when it takes it.
        logits: the model's forward, images -> logits [B, K] (the predictions; ROS's h).
        images: preprocessed images [B, C, H, W]; maps: their maps [B, h, w]; targets: the explained classes [B].
        features: for ``"representation"``, images -> the representation L [B, D].
        n_samples: perturbed copies per image; noise: their standard deviation (Gaussian, preprocessed units);
        eps_min: the paper's epsilon_min; seed: seeds the perturbations; batch_size: copies per forward.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    if kind == "representation" and features is None:
        raise ValueError("relative representation stability needs the representation the model's classifier reads: "
                         "give the batch features= (e.g. the adapter's features)")
    count = images.shape[0]
    deltas = gaussian_noise(n_samples, tuple(images.shape[1:]), noise, seed, images.device).to(images.dtype)
    outputs = logits(images).float()
    copies = _chunked(logits, images, deltas, batch_size).float().unflatten(0, (n_samples, count))
    kept = copies.argmax(-1) == outputs.argmax(-1)                                        # [n, B]
    if kind == "representation":
        own = features(images).float()
        represented = _chunked(features, images, deltas, batch_size).float().unflatten(0, (n_samples, count))
    ratios = []
    for sample, delta in enumerate(deltas):
        found = explain_copy(explain, images + delta, targets, sample + 1)
        perturbed = check_maps(found.to(images.device), count, what="explanation map of a perturbed image")
        if perturbed.shape != maps.shape:
            raise ValueError(f"explain returned maps of shape {tuple(perturbed.shape)}, expected {tuple(maps.shape)}")
        if kind == "input":
            denominator = relative_change(images, images + delta, eps_min)
        elif kind == "output":
            denominator = (outputs - copies[sample]).norm(dim=1)
        else:
            denominator = relative_change(own, represented[sample], eps_min)
        ratios.append(relative_change(maps, perturbed, eps_min) / denominator.clamp(min=eps_min))
    ratios = torch.where(kept, torch.stack(ratios), float("-inf")).max(0).values
    return torch.where(kept.any(0), ratios, float("nan"))


class DefinedMean:
    """A relative stability's report: the mean of the defined per-image values of ``name`` and how many images have
    none (``undefined``: no perturbed copy kept the image's prediction)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, values: dict[str, Tensor]) -> dict[str, float]:
        found = values[self.name].double()
        defined = ~found.isnan()
        return {self.name: found[defined].mean().item() if defined.any() else float("nan"),
                "undefined": int((~defined).sum())}

    def __repr__(self) -> str:
        return f"DefinedMean({self.name!r})"
