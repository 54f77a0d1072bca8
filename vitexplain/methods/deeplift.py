"""DeepLIFT with the Rescale rule (Shrikumar, Greenside & Kundaje, ICML 2017), through Captum."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import Positive, PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_map
from .integrated_gradients import integration_baselines


@register_method(resolution="pixel", cost=6, reads="output",
                 reference="latec",
                 departures="None in substance: Captum's `DeepLift` with LATEC's eps 1e-9 and zero baseline, "
                            "positive part per channel, summed where LATEC averages. On a model with an `nn.Softmax` "
                            "module (Swin) ours explains one image per call, since Captum's softmax rule mixes the "
                            "images of a batch.")
def deeplift(adapter: ModelAdapter, images: Tensor, target=None, *, baseline: float | Tensor = 0.0,
             eps: Positive = 1e-9,
             channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64) -> Tensor:
    """DeepLIFT contributions of the pixels to the target logit's difference from a baseline, by Captum's ``DeepLift``.

    Shrikumar, Greenside & Kundaje, "Learning Important Features Through Propagating Activation Differences",
    ICML 2017: C_{Δx Δt} = m_{Δx Δt} · Δx (Eq. 1-2), multipliers chained backwards (Eq. 3), a non-linearity's
    multiplier Δy/Δx (the Rescale rule, Sec. 3.5.1). Captum implements the rule by overriding the gradient of the
    non-linear *modules* it knows (``nn.ReLU``, ``ELU``, ``LeakyReLU``, ``Sigmoid``, ``Tanh``, ``Softplus``,
    ``Softmax``, max pooling); everything else — GELU, LayerNorm, and every functional call (timm's attention
    softmax inside ``F.scaled_dot_product_attention``) — passes the plain gradient at the image. On a timm ViT no
    module is hooked, so the map is (x - x') ⊙ ∂S_c/∂x, Input × Gradient against the baseline (a test checks
    it; docs/decisions/latec-methods.md). Captum requires each hooked module to be used once per forward (a
    torchvision ResNet reuses its blocks' ReLU; Captum runs it, with the multipliers of the module's last call).

    The defaults are LATEC's setting (Klein et al., "Navigating the Maze of Explainable AI", NeurIPS 2024 Datasets
    and Benchmarks): baseline 0, eps = 1e-9, channels reduced as LATEC does (positive part, summed).

    Options:
        baseline: x', a constant or a tensor that broadcasts to the images (0 in LATEC's setting).
        eps: Captum's threshold under which Δx counts as zero and the gradient is used (1e-9 in LATEC's setting).
        channel_reduction: ``positive_sum`` (LATEC's setting), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: model inputs per forward/backward (each image and its baseline count two); bounds memory.
    """
    baselines = integration_baselines(baseline, images)
    return captum_map(adapter, images, target, "DeepLift", reduction=channel_reduction, batch_size=batch_size,
                      rows_per_input=2, init={"eps": eps}, attribute=lambda part: {"baselines": baselines[part]})
