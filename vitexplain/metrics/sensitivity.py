"""Max-sensitivity (Yeh et al., NeurIPS 2019) as run by TIS (Englebert et al., ICCVW 2023, Table 4).

TIS Sec. 4.2: "we used Captum's implementation with a number of perturbed samples set to 10 and a
perturbation radius set to 0.02" (``metrics/sensitivity.py`` of aenglebert/Transformer_Input_Sampling).
Captum's ``sensitivity_max`` with its defaults (``default_perturb_func``, ``norm_ord="fro"``):

    SENS_max(x) = max_s || e(x) - e(x + d_s) ||_2 / || e(x) ||_2,   d_s ~ U[-r, r]^(C x H x W),

i.e. noise drawn uniformly from the L-infinity ball of radius r around the *preprocessed* image,
the Frobenius (= L2 of the flattened) norm of the change of the explanation (at the method's own
resolution), divided by the norm of the unperturbed explanation (a norm of 0 is replaced by 1),
maximised over the samples. That plain definition is the default.

Two options reproduce what the TIS authors' pipeline feeds Captum (docs/decisions/metrics.md):

* ``normalise``: e is what each method's wrapper returns, and some wrappers rescale their maps
  before the metric sees them — TIS min-max normalises (``normalise=True`` of ``tis.TIS``), the
  attention rollout of vit-explain divides by the maximum — so the maps are rescaled per image the
  same way, ``"minmax"`` ((e - min) / (max - min)) or ``"max"`` (e / max), before the norms.
* ``reseed``: the authors' randomised methods draw fresh random numbers on every call (TIS's k-means
  starts from new random points, ViT-CX and SmoothGrad draw new noise), so their sensitivity includes
  the spread of the method's own randomness. With ``reseed`` each perturbed call s runs the method
  with its own seed, derived from ``seed`` and s (:func:`sample_seeds`), so the run stays reproducible.

Each perturbed call s (1 … n) is the s-th copy of the images (``copy=s`` of :attr:`EvalBatch.explain`): the random
control is drawn afresh for each, so it scores as a map unrelated to its image, not as a perfectly stable one
(docs/decisions/metric-trust.md); every explanation method ignores it.

Differences from Captum, both needed by vitexplain's contract: the noise comes from a CPU
``torch.Generator`` seeded with ``seed`` (Captum uses the global RNG), and the same n samples are
added to every image, so an image's result does not depend on its batch. e(x) is the map already
computed for the batch (``batch.maps``), which is what Captum recomputes for deterministic methods.

Avg-sensitivity (``avg_sensitivity.py``) is the mean over the same samples of the same ratios
(:func:`sensitivity_changes`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ..options import Positive, PositiveInt
from ..seeding import seeded_draw
from ..uncertainty import Means
from ._common import check_image_batch, check_maps
from ._robustness import Normalise, explained_copies, normalise_maps
from .base import EvalBatch, register_metric

__all__ = ["Normalise", "max_sensitivity", "normalise_maps", "sample_seeds", "sensitivity_changes",
           "sensitivity_noise"]


def sensitivity_noise(n_samples: int, shape: tuple[int, ...], radius: float, seed: int,
                      device: torch.device | str = "cpu") -> Tensor:
    """The n perturbations [n, *shape], uniform in [-radius, radius], drawn on the CPU from ``seed``
    (the same on every device) and moved to ``device``."""
    def draw(generator: torch.Generator) -> Tensor:
        return torch.empty((n_samples, *shape)).uniform_(-radius, radius, generator=generator)

    return seeded_draw(seed, draw, device)


def sample_seeds(seed: int, n_samples: int) -> list[int]:
    """The method's seed for each perturbed call: numpy's ``SeedSequence((seed, s))``, s = 0 … n-1, as a
    32-bit integer — independent streams for every (base seed, sample), the same on every run."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"reseed needs a non-negative integer seed, got {seed!r}")
    return [int(np.random.SeedSequence((seed, sample)).generate_state(1)[0]) for sample in range(n_samples)]


def max_sensitivity(explain: Callable[..., Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                    n_samples: int = 10, radius: float = 0.02, seed: int = 0, normalise: str = "none",
                    reseed: bool = False) -> Tensor:
    """Max-sensitivity of each image's explanation [B].

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test; with ``reseed`` it is
            called as (images, targets, seed=...) and must run the method with that seed; when it takes
            ``copy``, perturbed call s gets ``copy=s`` (:func:`._common.explain_copy`).
        images: preprocessed images [B, C, H, W].
        maps: the method's maps of ``images`` for ``targets`` [B, h, w].
        targets: explained class per image [B].
        n_samples: perturbed copies per image (TIS: 10).
        radius: L-infinity radius of the perturbations (TIS: 0.02).
        seed: seed of the perturbations, and base of the per-call seeds under ``reseed``.
        normalise: ``"none"`` (Captum's definition), ``"minmax"`` or ``"max"``: every map rescaled
            per image before the norms, as the wrapper of the method in the TIS authors' pipeline does
            (``"maxabs"``, m / max |m|, is Quantus's rescaling: :func:`._robustness.normalise_maps`).
        reseed: give perturbed call s its own method seed, :func:`sample_seeds` (seed, s)
            (randomised methods, as the TIS authors' pipeline draws fresh randomness per call).
    """
    return sensitivity_changes(explain, images, maps, targets, n_samples=n_samples, radius=radius, seed=seed,
                               normalise=normalise, reseed=reseed).max(0).values


def sensitivity_changes(explain: Callable[..., Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                        n_samples: int = 10, radius: float = 0.02, seed: int = 0, normalise: str = "none",
                        reseed: bool = False) -> Tensor:
    """Per perturbed copy s and image, ``‖e(x) - e(x + d_s)‖_2 / ‖e(x)‖_2`` [n_samples, B] (float32): what max- and
    avg-sensitivity reduce, the max and the mean over s. The arguments are :func:`max_sensitivity`'s."""
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    noise = sensitivity_noise(n_samples, tuple(images.shape[1:]), radius, seed, images.device).to(images.dtype)
    seeds = sample_seeds(seed, n_samples) if reseed else None
    reference = normalise_maps(maps, normalise).flatten(1)
    scale = reference.norm(dim=1)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    changes = [(reference - normalise_maps(perturbed, normalise).flatten(1)).norm(dim=1) / scale
               for perturbed in explained_copies(explain, (images + delta for delta in noise), targets, maps, seeds)]
    return torch.stack(changes)


reduce_max_sensitivity = Means(max_sensitivity="max_sensitivity")


@register_metric(
    "max_sensitivity",
    reduce=reduce_max_sensitivity,
    requires=("explain",),
    higher_is_better={"max_sensitivity": False},
    cost=lambda options, method: options["n_samples"] * method,
    group="robustness",
    reference=("latec", "quantus"),
    departures="Ours is Captum's `sensitivity_max` with its defaults, as TIS ran it: uniform noise of radius 0.02, "
               "10 samples, raw maps; Quantus's radius is 0.2 (`radius=0.2`; 200 samples, LATEC's 10, with the maps "
               "divided by their largest value over the batch). The noise is drawn once from `seed`, shared by every "
               "image.",
)
def _compute(batch: EvalBatch, *, n_samples: PositiveInt = 10,
             radius: Positive = 0.02, seed: int = 0,
             normalise: Normalise = "none", reseed: bool = False) -> dict[str, Tensor]:
    return {"max_sensitivity": max_sensitivity(batch.explain, batch.images, batch.maps, batch.targets,
                                               n_samples=n_samples, radius=radius, seed=seed, normalise=normalise,
                                               reseed=reseed)}
