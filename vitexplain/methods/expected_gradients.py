"""Expected Gradients (Erion, Janizek, Sturmfels, Lundberg & Lee, Nat. Mach. Intell. 2021), as Captum's GradientShap."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import NonNegative, PositiveInt
from ..registry import register_method
from ..seeding import seeded_draw
from ._captum import REDUCTIONS, Reduction, captum_attributions
from ._pixel import mask_major_pairs


def expected_gradients_draws(n_samples: int, image_shape: tuple[int, ...], n_references: int | None, seed: int,
                             device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Sample k's draws, the same for every image and device (drawn from ``seed`` on the CPU): the point on the path
    α_k ~ U(0, 1) [n], standard normal noise ε_k [n, C, H, W], and the baseline: an index into ``n_references``
    reference images [n] (long), or, with None, a standard normal image [n, C, H, W]."""
    def draw(generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        alphas = torch.rand(n_samples, generator=generator)
        noise = torch.randn((n_samples, *image_shape), generator=generator)
        if n_references is None:
            return alphas, noise, torch.randn((n_samples, *image_shape), generator=generator)
        return alphas, noise, torch.randint(n_references, (n_samples,), generator=generator)

    return seeded_draw(seed, draw, device)


@register_method(resolution="pixel", cost=lambda o: 3 * o["n_samples"], reads="output",
                 reference="latec",
                 departures="LATEC's GradientShap takes its baselines from the data batch and its draws from NumPy's "
                            "and the device's global generators; ours draws each of the 40 samples' baseline "
                            "(standard normal), point and noise (σ 0.001) from `seed` on the CPU, so a map depends "
                            "neither on its batch nor on the device. LATEC's Captum fork keeps each sample's "
                            "positive part before the mean, ours the mean's.")
def expected_gradients(adapter: ModelAdapter, images: Tensor, target=None, *, n_samples: PositiveInt = 40,
                       stdev: NonNegative = 0.001, baselines: Tensor | None = None,
                       channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64,
                       seed: int = 0) -> Tensor:
    """Expected Gradients: Integrated Gradients averaged over baselines drawn from a distribution, one random point
    of each path, as Captum's ``GradientShap`` computes it.

    Erion et al., "Improving performance of deep learning models with axiomatic attribution priors and expected
    gradients", Nature Machine Intelligence 3, 2021, Eq. 4: φ_i = E_{x'~D, α~U(0,1)} [(x_i - x'_i) ∂f(x' + α(x -
    x'))/∂x_i]; Captum's ``GradientShap`` (Lundberg & Lee, NeurIPS 2017) estimates it with n samples, each a
    baseline x'_k, a point α_k and Gaussian noise of ``stdev`` added to the image (SmoothGrad's), the attribution
    (x̃_k - x'_k) ⊙ ∇f(α_k x̃_k + (1 - α_k) x'_k), averaged. The defaults are LATEC's setting (Klein et al.,
    "Navigating the Maze of Explainable AI", NeurIPS 2024 Datasets and Benchmarks, code IML-DKFZ/latec): 40 samples,
    σ = 0.001, channels reduced as LATEC does (positive part, summed, after the mean: LATEC's Captum fork clamps each
    sample, docs/decisions/latec-methods.md).

    The baselines: LATEC takes the data batch as the distribution; a method here sees only the images it explains,
    so by default each sample's baseline is an image drawn from N(0, 1) in the normalised input space (the data's
    per-channel mean and spread), and ``baselines`` takes reference images of your own (each sample picks one
    uniformly). The draws (α, noise, baselines) come from a generator of our own seeded with ``seed``, the same
    for every image and device, not from Captum's, which draws from numpy's and the device's global generators;
    the gradients are Captum's ``Saliency``, so the arithmetic is Captum's ``GradientShap`` on the same draws
    (a test compares).

    Options:
        n_samples: n, the number of (baseline, point, noise) samples (40 in LATEC's setting).
        stdev: σ of the noise added to the image for each sample (0.001 in LATEC's setting; 0: none).
        baselines: reference images [K, C, H, W] (normalised like the images), or None to draw each sample's.
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: samples (images × n_samples) per forward/backward; bounds memory.
        seed: seeds the draws.
    """
    resolved = adapter.target(images, target)
    references = None
    if baselines is not None:
        if baselines.ndim != images.ndim or baselines.shape[1:] != images.shape[1:]:
            raise ValueError(f"baselines must be reference images [K, {', '.join(map(str, images.shape[1:]))}], "
                             f"got shape {tuple(baselines.shape)}")
        references = baselines.to(device=images.device, dtype=torch.float32)
    alphas, noise, drawn = expected_gradients_draws(n_samples, tuple(images.shape[1:]),
                                                    None if references is None else references.shape[0], seed,
                                                    images.device)
    chosen = drawn if references is None else references[drawn]
    image_idx, sample_idx = mask_major_pairs(torch.full((images.shape[0],), n_samples, device=images.device))
    total = torch.zeros(images.shape, device=images.device)
    for start in range(0, len(image_idx), batch_size):
        img, smp = image_idx[start:start + batch_size], sample_idx[start:start + batch_size]
        noisy = images[img].float() + stdev * noise[smp]
        base = chosen[smp]
        alpha = alphas[smp].view(-1, *[1] * (images.ndim - 1))
        points = (alpha * noisy + (1.0 - alpha) * base).detach()
        gradients = captum_attributions(adapter, points, resolved, "Saliency", rows=img, batch_size=batch_size,
                                        attribute={"abs": False})
        total.index_add_(0, img, (noisy - base) * gradients)
    return REDUCTIONS[channel_reduction](total * 1 / n_samples)
