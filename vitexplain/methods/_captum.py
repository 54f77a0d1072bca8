"""The one bridge from vitexplain's adapters to Captum's attribution classes (Kokhlikyan et al., "Captum: A unified
and generic model interpretability library for PyTorch", arXiv 2009.07896, 2020).

:func:`captum_attributions` runs any class of ``captum.attr`` whose first constructor argument is the forward (the
gradient, perturbation and DeepLIFT families) over the model's float32 differentiable forward, in chunks, and
returns its per-channel attributions [R, C, H, W] in float32; :func:`captum_map` resolves the target and reduces the
channels. Why each piece is as it is:

* **The forward is a module that holds the user's model** (:class:`ScoredForward`). Classes that hook a model's
  non-linear submodules (DeepLift, DeepLiftShap, GuidedBackprop, Deconvolution) are given it, so their hooks reach
  the user's modules, and the main-model hooks DeepLift puts on "the model" land on the wrapper, never on the
  user's model. Such a class runs within :func:`~vitexplain.instrumentation.modifying.modified` with no change,
  which puts back every hook, parameter and flag also when the call raises, and the attributes DeepLift sets on
  modules while it runs (``input`` / ``output`` / ``input_ref``, left behind by an exception mid-forward) are
  removed; the classes that take a forward function never touch the model (the forward's eval mode is put back by
  ``differentiable_forward``).
* **Targets**: a class target is Captum's ``target=`` (one class per row of the chunk). Any other score (an
  embedding direction, a score function) is computed by the wrapper itself: each row's image index travels as an
  ``additional_forward_args`` tensor, which every Captum class expands exactly as it expands its inputs (repeated
  along IG's path, DeepLift's input/baseline halves, DeepLiftShap's baselines, Occlusion's and LIME's perturbation
  batches), so a perturbed or path row is scored with its own image's target whatever the class does to the batch.
* **Precision**: within :meth:`~vitexplain.instrumentation.ModelAdapter.differentiable_forward` the model is seen in
  float32 with full-precision products (instrumentation/precision.py); the inputs and the per-chunk tensor options
  (baselines) are cast to float32 here, so images handed over in bfloat16 are explained in float32 too.
* **Batches**: images are attributed ``max(1, batch_size // rows_per_input)`` at a time, where ``rows_per_input`` is
  how many model inputs one image becomes in one forward of the class (2 for DeepLift's input and baseline, 2·K for
  DeepLiftShap with K baselines); classes with their own batching knob (IG's ``internal_batch_size``,
  ``perturbations_per_eval``) are given it by the method. Captum's DeepLIFT rule for ``nn.Softmax`` normalises over
  the whole batch tensor, so on a model with such a module DeepLIFT runs one image per call.
* **Random draws**: with ``seed``, each image is attributed in a Captum call of its own, with the CPU generator
  (and numpy's global state, and the images' CUDA generator) seeded with ``seed`` and put back after
  (``torch.random.fork_rng``): every image sees the same draws, so a map does not depend on its batch, and the caller's
  random state is untouched. LIME's and Kernel SHAP's draws are made on the CPU (the same on every device);
  a class that draws on the images' device (NoiseTunnel's noise) draws other numbers on CUDA.
* **LibraGrad** (``libragrad=True``, the gradient methods' option): the forward and every backward of the call run
  within :func:`~vitexplain.instrumentation.libragrad.libragrad` (Mehri et al., CVPR 2025), so the gradients Captum
  takes follow its rebalanced backward; refused before any work where its rules have no place (a model known by
  its outputs, a family LRP does not serve) and for the classes that put rules of their own on the modules.
"""
from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

from ..instrumentation import ModelAdapter, Target, UnsupportedModelError
from ..instrumentation.libragrad import libragrad_if
from ..instrumentation.modifying import modified
from ..options import similar_names
from ._pixel import CHANNEL_REDUCTIONS, chunks

#: what a seeded call returns
Drawn = TypeVar("Drawn")

#: How LATEC reduces per-channel attributions: its Captum fork keeps each attribution's positive part
#: (``torch.max(a, 0)``) and its figures average over channels, i.e. Σ_c max(a_c, 0) up to the factor 1/C;
#: ``positive_sum`` is that, beside the reductions of :data:`._pixel.CHANNEL_REDUCTIONS`.
Reduction = Literal["positive_sum", "sum", "abs_sum", "max_abs"]
REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    **CHANNEL_REDUCTIONS, "positive_sum": lambda attributions: attributions.clamp(min=0).sum(1)}
#: attributes Captum's DeepLift sets on the modules it hooks (removed if an exception leaves them)
_CAPTUM_ATTRIBUTES = ("input", "output", "input_ref")

PerChunk = Mapping[str, Any] | Callable[[slice], Mapping[str, Any]]


def captum_class(algorithm: str | type) -> type:
    """A class of ``captum.attr`` by name (e.g. ``"Saliency"``), or the class itself; an unknown name is refused in
    one line with the closest names."""
    import captum.attr

    if isinstance(algorithm, type):
        return algorithm
    classes = {name: found for name, found in vars(captum.attr).items()
               if isinstance(found, type) and hasattr(found, "attribute")}
    if algorithm not in classes:
        close = similar_names(algorithm, classes, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown Captum attribution class {algorithm!r}{hint}: give a class name of captum.attr, "
                         f"e.g. 'Saliency', 'InputXGradient', 'Occlusion'")
    return classes[algorithm]


class ScoredForward(nn.Module):
    """The forward Captum differentiates: the model's outputs (class targets, picked by Captum's ``target=``), or,
    for any other target, each row's own score, its image given by the ``rows`` Captum expanded with the inputs.

    The user's model is a submodule, so classes that hook non-linear modules reach it; the wrapper is the module
    DeepLift hooks as "the model"."""

    def __init__(self, model: nn.Module, forward: Callable[[Tensor], Tensor], target: Target):
        super().__init__()
        self.model = model
        self._forward, self._target = forward, target

    def forward(self, inputs: Tensor, rows: Tensor | None = None) -> Tensor:
        outputs = self._forward(inputs)
        if rows is None:
            return outputs
        return self._target.select(rows).score(outputs)


def with_captum_draws(seed: int, device: torch.device, call: Callable[[], Drawn]) -> Drawn:
    """``call()`` with Captum's random draws (torch's CPU generator, numpy's global state, the device's CUDA generator)
    seeded with ``seed``, and everything put back after: Captum draws from the global generators and takes none of
    its own, so this is its :func:`~vitexplain.seeding.seeded_draw`."""
    import numpy as np

    state = np.random.get_state()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.random.default_generator.manual_seed(seed)
            np.random.seed(seed % 2 ** 32)
            if devices:
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(seed)
            return call()
    finally:
        np.random.set_state(state)


@contextlib.contextmanager
def _restored(model: nn.Module) -> Iterator[None]:
    """Hooks, parameters, flags put back (modifying.py), and the attributes Captum sets on modules removed."""
    had = {id(module): set(vars(module)) for module in model.modules()}
    try:
        with modified(model, lambda _: None):
            yield
    finally:
        for module in model.modules():
            for name in _CAPTUM_ATTRIBUTES:
                if name in vars(module) and name not in had.get(id(module), ()):
                    delattr(module, name)


def captum_attributions(adapter: ModelAdapter, inputs: Tensor, target: Target, algorithm: str | type, *,
                        init: Mapping[str, Any] | None = None, attribute: PerChunk | None = None,
                        batch_size: int = 64, rows_per_input: int = 1, rows: Tensor | None = None,
                        seed: int | None = None, libragrad: bool = False) -> Tensor:
    """Per-channel attributions [R, C, H, W] (float32) of ``inputs`` by the Captum class ``algorithm``.

    Args:
        inputs: images [R, C, H, W], or copies derived from them (then ``rows`` gives each one's image).
        target: the images' resolved target (``adapter.target(images, target)``).
        algorithm: a class of ``captum.attr`` or its name; constructed as ``algorithm(forward, **init)``.
        attribute: keyword arguments of ``attribute`` (beyond inputs, target and the rows), or a function of a
            chunk's slice of ``inputs`` that returns them (for per-input tensors such as baselines).
        batch_size: model inputs per forward: ``max(1, batch_size // rows_per_input)`` inputs per call.
        rows_per_input: model inputs one input becomes in one forward of ``algorithm``.
        rows: the image [R] of each input (default: input i is image i).
        seed: when given, Captum's random draws are seeded with it for each input alone (:func:`with_captum_draws`).
        libragrad: the gradients follow LibraGrad's backward (:mod:`vitexplain.instrumentation.libragrad`).
    """
    cls = captum_class(algorithm)
    if libragrad and hooks_modules(cls):
        raise ValueError(f"libragrad=True rebalances the gradients of gradient methods, but Captum's {cls.__name__} "
                         "puts rules of its own on the model's modules; use it without libragrad")
    init = dict(init or {})
    rows = torch.arange(inputs.shape[0], device=inputs.device) if rows is None else rows
    per_call = 1 if seed is not None or _mixes_batch(cls, adapter.model) else max(1, batch_size // rows_per_input)
    found = []
    restoring = _restored(adapter.model) if hooks_modules(cls) else contextlib.nullcontext()
    with adapter.differentiable_forward() as forward, restoring, libragrad_if(adapter, libragrad):
        scored = ScoredForward(adapter.model, forward, target)
        method = cls(scored, **init)
        for part in chunks(inputs.shape[0], per_call):
            given = dict(attribute(part) if callable(attribute) else (attribute or {}))
            given = {name: value.float() if isinstance(value, Tensor) and value.is_floating_point() else value
                     for name, value in given.items()}
            if target.is_class:
                given["target"] = target.classes[rows[part]]
            else:
                given["additional_forward_args"] = (rows[part],)
            def run(part: slice = part, given: dict = given) -> Tensor:
                return _as_attributions(cls, method.attribute(inputs[part].float(), **given), inputs[part])

            with _refusing_reuse(cls, adapter), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # Captum's notes on hooks, inputs without grad, batches
                found.append(run() if seed is None else with_captum_draws(seed, inputs.device, run))
    return torch.cat(found).float()


@contextlib.contextmanager
def _refusing_reuse(cls: type, adapter: ModelAdapter) -> Iterator[None]:
    """Captum's refusal of a model that calls one hooked module twice per forward (DeepLift's multipliers are kept on
    the module), as the refusal of the model it is."""
    try:
        yield
    except RuntimeError as error:
        if "used more than once" not in str(error):
            raise
        module = str(error).split("A Module ", 1)[-1].split(" was detected", 1)[0]
        raise UnsupportedModelError(
            f"Captum's {cls.__name__} keeps each non-linear module's input and output on the module, so each must be "
            f"called once per forward, but this {adapter.model_name} calls {module} more than once (as a torchvision "
            f"ResNet block calls its ReLU); give it a model with one module per call") from None


def _as_attributions(cls: type, result: Any, inputs: Tensor) -> Tensor:
    """The attribution tensor of ``attribute``'s result, refused in one line unless shaped like the inputs."""
    if isinstance(result, tuple):  # (attributions, delta) when a convergence delta was asked for
        result = result[0]
    if not isinstance(result, Tensor) or result.shape != inputs.shape:
        shape = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
        raise ValueError(f"Captum's {cls.__name__} returned {shape}, not attributions shaped like the images "
                         f"{tuple(inputs.shape)}: only input attribution classes give pixel maps")
    return result.detach()


def captum_map(adapter: ModelAdapter, images: Tensor, target, algorithm: str | type, *,
               reduction: str = "positive_sum", **how: Any) -> Tensor:
    """Maps [B, H, W]: :func:`captum_attributions` of ``images`` for ``target`` (resolved here), channels reduced
    by ``reduction`` (:data:`REDUCTIONS`)."""
    resolved = adapter.target(images, target)
    return REDUCTIONS[reduction](captum_attributions(adapter, images, resolved, algorithm, **how))


def _mixes_batch(cls: type, model: nn.Module) -> bool:
    """Whether the class's rules mix the rows of a batch on this model: Captum's DeepLift rule for ``nn.Softmax``
    subtracts the mean over the whole tensor (every row, head and window) of the module's multipliers, so an image's
    map would depend on the others in its call (timm's Swin has such a module; its ViT calls softmax as a function)."""
    return hooks_modules(cls) and cls.__name__ in ("DeepLift", "DeepLiftShap") and \
        any(isinstance(module, nn.Softmax) for module in model.modules())


def hooks_modules(cls: type) -> bool:
    """Whether the class hooks the model's submodules: its constructor takes a ``model`` (DeepLift, DeepLiftShap,
    GuidedBackprop, Deconvolution, LRP), not a ``forward_func``."""
    first = list(inspect.signature(cls.__init__).parameters)[1:2]
    return first == ["model"]


def takes_argument(cls: type, name: str) -> bool:
    """Whether ``cls.attribute`` takes ``name`` (e.g. ``perturbations_per_eval``)."""
    return name in inspect.signature(cls.attribute).parameters


def patch_mask(height: int, width: int, size: int, device: torch.device) -> Tensor:
    """Square patches of ``size`` px as LIME / Kernel SHAP features [1, 1, H, W] (long), numbered in raster order;
    the last row and column of patches are cut where ``size`` does not divide the image."""
    across = -(-width // size)
    ys = torch.arange(height, device=device) // size
    xs = torch.arange(width, device=device) // size
    return (ys[:, None] * across + xs[None, :])[None, None]
