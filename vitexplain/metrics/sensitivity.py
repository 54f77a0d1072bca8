"""Max-sensitivity (Yeh et al., NeurIPS 2019) as run by TIS (Englebert et al., ICCVW 2023, Table 4).

TIS Sec. 4.2: "we used Captum's implementation with a number of perturbed samples set to 10 and a
perturbation radius set to 0.02" (``metrics/sensitivity.py`` of aenglebert/Transformer_Input_Sampling).
Captum's ``sensitivity_max`` with its defaults (``default_perturb_func``, ``norm_ord="fro"``):

    SENS_max(x) = max_s || e(x) - e(x + d_s) ||_2 / || e(x) ||_2,   d_s ~ U[-r, r]^(C x H x W),

i.e. noise drawn uniformly from the L-infinity ball of radius r around the *preprocessed* image,
the Frobenius (= L2 of the flattened) norm of the change of the raw explanation (TIS passes the
method's map as is, at its own resolution), divided by the norm of the unperturbed explanation
(a norm of 0 is replaced by 1), maximised over the samples.

Differences from Captum, both needed by vitexplain's contract: the noise comes from a
``torch.Generator`` seeded with ``seed`` (Captum uses the global RNG), and the same n samples are
added to every image, so an image's result does not depend on its batch. e(x) is the map already
computed for the batch (``batch.maps``), which is what Captum recomputes for deterministic methods.
"""
from __future__ import annotations

from typing import Annotated, Callable

import torch
from torch import Tensor

from ._common import check_images, check_maps
from ..options import PositiveInt, Range
from .base import EvalBatch, Metric, register_metric


def sensitivity_noise(n_samples: int, shape: tuple[int, ...], radius: float, seed: int) -> Tensor:
    """The n perturbations [n, *shape], uniform in [-radius, radius], drawn on the CPU from ``seed``."""
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    if radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}")
    generator = torch.Generator().manual_seed(seed)
    return torch.empty((n_samples, *shape)).uniform_(-radius, radius, generator=generator)


def max_sensitivity(explain: Callable[[Tensor, Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                    n_samples: int = 10, radius: float = 0.02, seed: int = 0) -> Tensor:
    """Max-sensitivity of each image's explanation [B].

    Args:
        explain: (images, targets) -> maps [B, h, w], the method under test.
        images: preprocessed images [B, C, H, W].
        maps: the method's maps of ``images`` for ``targets`` [B, h, w].
        targets: explained class per image [B].
        n_samples: perturbed copies per image (TIS: 10).
        radius: L-infinity radius of the perturbations (TIS: 0.02).
        seed: seed of the perturbations.
    """
    check_images(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    noise = sensitivity_noise(n_samples, tuple(images.shape[1:]), radius, seed).to(images)
    reference = maps.flatten(1)
    scale = reference.norm(dim=1)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    changes = []
    for delta in noise:
        perturbed = check_maps(explain(images + delta, targets).to(images.device), images.shape[0],
                               what="explanation map of a perturbed image")
        if perturbed.shape != maps.shape:
            raise ValueError(f"explain returned maps of shape {tuple(perturbed.shape)}, expected {tuple(maps.shape)}")
        changes.append((reference - perturbed.flatten(1)).norm(dim=1) / scale)
    return torch.stack(changes).max(0).values


def reduce_max_sensitivity(values: dict[str, Tensor]) -> dict[str, float]:
    return {"max_sensitivity": values["max_sensitivity"].to(torch.float64).mean().item()}


def _compute(batch: EvalBatch, *, n_samples: PositiveInt = 10,
             radius: Annotated[float, Range(low=0, low_open=True)] = 0.02, seed: int = 0) -> dict[str, Tensor]:
    return {"max_sensitivity": max_sensitivity(batch.explain, batch.images, batch.maps, batch.targets,
                                               n_samples=n_samples, radius=radius, seed=seed)}


register_metric(Metric(
    name="max_sensitivity",
    compute=_compute,
    reduce=reduce_max_sensitivity,
    higher_is_better={"max_sensitivity": False},
    cost=lambda options, method: options["n_samples"] * method,
))
