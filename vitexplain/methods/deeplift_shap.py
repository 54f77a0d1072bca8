"""DeepLIFT SHAP: DeepLIFT averaged over a distribution of baselines (Lundberg & Lee, NeurIPS 2017), through Captum."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import AtLeastTwo, PositiveInt
from ..registry import register_method
from ..seeding import seeded_draw
from ._captum import Reduction, captum_map


def reference_images(baselines: Tensor | None, n_samples: int, images: Tensor, seed: int) -> Tensor:
    """The baseline distribution [K, C, H, W]: the given reference images, or ``n_samples`` standard normal images
    drawn from ``seed`` (the same for every image and device)."""
    if baselines is not None:
        if baselines.ndim != images.ndim or baselines.shape[1:] != images.shape[1:] or baselines.shape[0] < 2:
            raise ValueError(f"baselines must be K >= 2 reference images [K, {', '.join(map(str, images.shape[1:]))}] "
                             f"(Captum's DeepLiftShap; for one, use deeplift's baseline), got shape "
                             f"{tuple(baselines.shape)}")
        return baselines.to(device=images.device, dtype=images.dtype)
    shape = (n_samples, *images.shape[1:])
    return seeded_draw(seed, lambda generator: torch.randn(shape, generator=generator), images.device)


@register_method(resolution="pixel", cost=lambda o: 6 * o["n_samples"], reads="output",
                 reference="latec",
                 departures="LATEC takes the first 16 images of the data batch as references; ours draws 16 "
                            "standard-normal references from `seed`, so a map does not depend on its batch "
                            "(`baselines=` takes your own). LATEC's Captum fork keeps each reference's positive part "
                            "before the mean, ours the mean's.")
def deeplift_shap(adapter: ModelAdapter, images: Tensor, target=None, *,
                  n_samples: AtLeastTwo = 16,
                  baselines: Tensor | None = None, channel_reduction: Reduction = "positive_sum",
                  batch_size: PositiveInt = 64, seed: int = 0) -> Tensor:
    """DeepLIFT of each image against each of K baselines, averaged, by Captum's ``DeepLiftShap``.

    Lundberg & Lee, "A Unified Approach to Interpreting Model Predictions", NeurIPS 2017, Sec. 4.2 (Deep SHAP):
    SHAP values approximated by DeepLIFT multipliers, the expectation over references taken as the mean of
    DeepLIFT attributions against K sampled references (Captum's ``DeepLiftShap``: Captum's DeepLIFT rules, eps
    1e-10; what that means on a ViT: :func:`~vitexplain.methods.deeplift.deeplift`).

    LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI", NeurIPS 2024 Datasets and Benchmarks,
    code IML-DKFZ/latec) takes the first 16 images of the data batch as the references; a method here sees only
    the images it explains (a batch's maps must not depend on the batch), so by default the K = 16 references are
    drawn from N(0, 1) in the normalised input space (the data's per-channel mean and spread) with ``seed``, and
    ``baselines`` takes reference images of your own (e.g. LATEC's: images of the data set). Channels are reduced
    as LATEC does (positive part, summed), after the mean over references (LATEC's Captum fork clamps each
    reference's attribution before the mean: docs/decisions/latec-methods.md).

    Options:
        n_samples: K >= 2 (Captum's), the number of references drawn when ``baselines`` is None (16 in LATEC's
            setting).
        baselines: reference images [K, C, H, W] (normalised like the images), or None to draw them.
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: model inputs per forward/backward (an image counts 2·K); bounds memory.
        seed: seeds the drawn references.
    """
    references = reference_images(baselines, n_samples, images, seed)
    return captum_map(adapter, images, target, "DeepLiftShap", reduction=channel_reduction, batch_size=batch_size,
                      rows_per_input=2 * references.shape[0], attribute={"baselines": references})
