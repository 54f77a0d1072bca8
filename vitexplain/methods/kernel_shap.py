"""Kernel SHAP on patches of the image (Lundberg & Lee, NeurIPS 2017), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PixelLength, PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map, patch_mask


@register_method(resolution="pixel", cost=lambda o: o["n_samples"], reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `KernelShap` with LATEC's 10 samples, 16 px patches and "
                            "zero baseline, positive part per channel, summed where LATEC averages; the samples are "
                            "drawn on the CPU from `seed`, the same on every device.")
def kernel_shap(adapter: ModelAdapter, images: Tensor, target=None, *, n_samples: PositiveInt = 10,
                patch_size: PixelLength = 16, baseline: float = 0.0, channel_reduction: Reduction = "positive_sum",
                batch_size: PositiveInt = 64, seed: int = 0) -> Tensor:
    """Shapley values of image patches for the target logit, estimated by a weighted linear regression on copies of
    the image with random patches set to a baseline, by Captum's ``KernelShap``.

    Lundberg & Lee, "A Unified Approach to Interpreting Model Predictions", NeurIPS 2017, Theorem 2 (the Shapley
    kernel π_x(z') = (M - 1) / (C(M, |z'|) |z'| (M - |z'|)) makes LIME's regression estimate Shapley values). Captum
    samples the coalitions from the kernel (the first two samples all features and none) and fits scikit-learn's
    linear regression. The defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI",
    NeurIPS 2024 Datasets and Benchmarks, code IML-DKFZ/latec): 10 samples, 16 px patches as features, removed
    patches set to 0, channels reduced as LATEC does (positive part, summed).

    Captum's draws for each image are seeded with ``seed`` (its own CPU generator, put back after): every image
    sees the same samples, on every device.

    Options:
        n_samples: coalitions sampled per image (10 in LATEC's setting).
        patch_size: the side of the square patches that are the features, in pixels (16 in LATEC's setting).
        baseline: the value of a removed patch (0 in LATEC's setting).
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: perturbed copies per forward; bounds memory.
        seed: seeds the samples.
    """
    mask = patch_mask(*images.shape[-2:], patch_size, images.device)
    return captum_map(adapter, images, target, "KernelShap", reduction=channel_reduction, seed=seed,
                      attribute={"feature_mask": mask, "n_samples": n_samples, "baselines": baseline,
                                 "perturbations_per_eval": min(batch_size, n_samples)})
