"""LIME on patches of the image (Ribeiro, Singh & Guestrin, KDD 2016), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import NonNegative, PixelLength, PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map, patch_mask


def lasso(alpha: float):
    """Captum's ``SGDLasso`` (squared error + α·L1, trained by SGD from zeros) with ``alpha``, trained on the CPU
    whatever the images' device (its coefficients are the same on every device; Captum 0.9 builds it on the CPU)."""
    from captum._utils.models.linear_model import SGDLasso

    class Lasso(SGDLasso):
        def fit(self, train_data, **kwargs):
            return super().fit(train_data, alpha=alpha, device="cpu", **kwargs)

    return Lasso()


@register_method(resolution="pixel", cost=lambda o: o["n_samples"], reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `Lime` with LATEC's 10 samples, 16 px patches, Lasso α 1 "
                            "and zero baseline, positive part per channel, summed. The Lasso is trained on the CPU "
                            "(LATEC's fork moved it to the GPU) and the samples are drawn on the CPU from `seed`: "
                            "the same map on every device.")
def lime(adapter: ModelAdapter, images: Tensor, target=None, *, n_samples: PositiveInt = 10,
         patch_size: PixelLength = 16, alpha: NonNegative = 1.0, baseline: float = 0.0,
         channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64, seed: int = 0) -> Tensor:
    """The coefficients of a sparse linear model fitted to the target logit of copies of the image with random
    patches set to a baseline, by Captum's ``Lime``; each patch's pixels get its coefficient.

    Ribeiro, Singh & Guestrin, "'Why Should I Trust You?': Explaining the Predictions of Any Classifier", KDD 2016,
    Eq. 1 and Alg. 1: ξ(x) = argmin_g L(f, g, π_x) + Ω(g) over linear models g of binary features z' (which
    interpretable features are kept), samples weighted by π_x = exp(-D(x, z)²/σ²). Captum's ``Lime``: each feature
    kept with probability 1/2, π_x the exponential kernel of the cosine distance (width 1), the model Captum's
    ``SGDLasso``. The defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI", NeurIPS
    2024 Datasets and Benchmarks, code IML-DKFZ/latec): 10 samples, features the 16 px patches of a grid (14 × 14
    on a 224 px image; LATEC's feature mask), α = 1 for the Lasso, removed patches set to 0, channels reduced as
    LATEC does (positive part, summed).

    Captum's draws for each image are seeded with ``seed`` (its own CPU generator, put back after): every image
    sees the same samples, on every device.

    Options:
        n_samples: perturbed copies per image (10 in LATEC's setting).
        patch_size: the side of the square patches that are the features, in pixels (16 in LATEC's setting; the
            last row and column are cut where it does not divide the image).
        alpha: the L1 weight of the Lasso (1 in LATEC's setting).
        baseline: the value of a removed patch (0 in LATEC's setting).
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: perturbed copies per forward; bounds memory.
        seed: seeds the samples.
    """
    mask = patch_mask(*images.shape[-2:], patch_size, images.device)
    return captum_map(adapter, images, target, "Lime", reduction=channel_reduction, seed=seed,
                      init={"interpretable_model": lasso(alpha)},
                      attribute={"feature_mask": mask, "n_samples": n_samples, "baselines": baseline,
                                 "perturbations_per_eval": min(batch_size, n_samples)})
