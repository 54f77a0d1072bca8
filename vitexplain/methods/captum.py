"""Any Captum input-attribution class by name (Kokhlikyan et al., arXiv 2020), on any differentiable image model."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._captum import Reduction, captum_class, captum_map, hooks_modules


@register_method(resolution="pixel", cost=3, reads="output")
def captum(adapter: ModelAdapter, images: Tensor, target=None, *, algorithm: str = "Saliency",
           init_kwargs: dict | None = None, attribute_kwargs: dict | None = None,
           channel_reduction: Reduction = "positive_sum", batch_size: PositiveInt = 64) -> Tensor:
    """The attributions of a class of ``captum.attr`` named by ``algorithm``, channels reduced: for a Captum class
    no registered method wraps.

    Kokhlikyan et al., "Captum: A unified and generic model interpretability library for PyTorch", arXiv 2009.07896,
    2020. The class is built as ``algorithm(forward, **init_kwargs)`` on the model's float32 forward (a module holding
    the model, for the classes that hook its modules) and called as ``attribute(images, target=...,
    **attribute_kwargs)`` in chunks of ``batch_size`` images (vitexplain/methods/_captum.py). A target that is not a
    class is scored by the forward itself, so it works with every class. Classes whose first argument is not a
    forward (``NoiseTunnel``, the layer and neuron classes) do not give pixel maps of the images; a class that
    returns anything not shaped like the images is refused. Captum's own random draws (``GradientShap``,
    ``FeaturePermutation``) are seeded with 0 for each image (``seed``-able versions: ``expected_gradients``,
    ``lime``, ``kernel_shap``). The cost counts one forward and backward per image; a perturbation class costs more.

    Options:
        algorithm: a class name of ``captum.attr`` (e.g. ``InputXGradient``, ``ShapleyValueSampling``).
        init_kwargs: its constructor's keyword arguments beyond the forward.
        attribute_kwargs: its ``attribute``'s keyword arguments beyond the inputs and target.
        channel_reduction: ``positive_sum`` (LATEC's), ``sum``, ``abs_sum`` or ``max_abs``.
        batch_size: images per call of ``attribute``; bounds memory.
    """
    cls = captum_class(algorithm)
    randomised = not hooks_modules(cls) and cls.__name__ in _DRAWING
    return captum_map(adapter, images, target, cls, reduction=channel_reduction, batch_size=batch_size,
                      init=init_kwargs, attribute=attribute_kwargs, seed=0 if randomised else None)


#: Captum classes that draw random numbers (run one image at a time, seeded, so a map does not depend on its batch)
_DRAWING = {"GradientShap", "Lime", "LimeBase", "KernelShap", "ShapleyValueSampling", "FeaturePermutation"}
