"""SmoothGrad (Smilkov, Thorat, Kim, Viégas & Wattenberg, 2017)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.libragrad import libragrad_if
from ..options import NonNegative, PositiveInt
from ..registry import register_method
from ..seeding import seeded_draw
from ._pixel import CHANNEL_REDUCTIONS, ChannelReduction, chunks, mask_major_pairs


def noise_samples(n_samples: int, image_shape: tuple[int, ...], seed: int, device: torch.device) -> Tensor:
    """Standard normal noise [n_samples, C, H, W], the same for every image and device: drawn from ``seed``
    on the CPU, moved to ``device`` once."""
    return seeded_draw(seed, lambda generator: torch.randn((n_samples, *image_shape), generator=generator), device)


@register_method(resolution="pixel", cost=lambda o: 3 * o["n_samples"], reads="output")
def smoothgrad(adapter: ModelAdapter, images: Tensor, target=None, *, n_samples: PositiveInt = 50,
               stdev: NonNegative = 1.0, relative_to_range: bool = False, absolute: bool = True,
               channel_reduction: ChannelReduction = "sum", batch_size: PositiveInt = 32, seed: int = 0,
               libragrad: bool = False) -> Tensor:
    """SmoothGrad: the input gradient of the target logit, averaged over noisy copies of the image.

    Smilkov et al., "SmoothGrad: removing noise by adding noise", arXiv 1706.03825, 2017, Sec. 3:
    M̂_c(x) = 1/n Σ_{k=1}^{n} M_c(x + N(0, σ²)), with M_c = ∂S_c/∂x the sensitivity map of class c.
    Set up as the TIS benchmark ran it (Englebert et al., ICCVW 2023: Captum ``NoiseTunnel`` over
    ``Saliency``, 50 samples, Captum's default σ = 1 in the normalised input space): S_c is the
    target logit, each sample's gradient is taken in absolute value (Captum ``Saliency``'s default)
    before averaging, and channels are summed.

    The noise comes from a generator of our own seeded with ``seed``, the same for every image, not
    from Captum's ``NoiseTunnel`` (why: docs/decisions/baselines-perturbation.md).

    Options:
        n_samples: n, the number of noisy copies (50 in the TIS benchmark and the paper's advice).
        stdev: σ; with ``relative_to_range`` it is a share of each image's value range
            (x_max - x_min), the paper's "noise level" (it advises 0.1-0.2).
        absolute: take |M_c| per sample before averaging (Captum's default) or keep the sign.
        channel_reduction: ``sum`` (as the TIS authors' wrapper), ``abs_sum`` or ``max_abs``.
        batch_size: noisy images per forward/backward; bounds memory.
        seed: seeds the noise.
        libragrad: each sample's gradient through LibraGrad's rebalanced backward (Mehri, Baghshah & Pilehvar,
            "LibraGrad: Balancing Gradient Flow for Universally Better Vision Transformer Attributions", CVPR 2025;
            docs/decisions/libragrad.md).
    """
    reduce = CHANNEL_REDUCTIONS[channel_reduction]
    resolved = adapter.target(images, target)
    noise = noise_samples(n_samples, tuple(images.shape[1:]), seed, images.device).to(images.dtype)
    sigma = torch.full((images.shape[0],), float(stdev), device=images.device, dtype=images.dtype)
    if relative_to_range:
        sigma = sigma * (images.flatten(1).amax(1) - images.flatten(1).amin(1))
    total = torch.zeros(images.shape, device=images.device)
    image_idx, sample_idx = mask_major_pairs(torch.full((images.shape[0],), n_samples, device=images.device))
    # the model's own forward (any differentiable model); under LibraGrad, its blocks' rebalanced backward
    with adapter.differentiable_forward() as forward, libragrad_if(adapter, libragrad):
        for part in chunks(len(image_idx), batch_size):
            img, smp = image_idx[part], sample_idx[part]
            noisy = (images[img] + sigma[img, None, None, None] * noise[smp]).detach().requires_grad_(True)
            gradient, = torch.autograd.grad(resolved.select(img).score(forward(noisy)).sum(), noisy)
            total.index_add_(0, img, gradient.float().abs() if absolute else gradient.float())
    return reduce(total / n_samples)
