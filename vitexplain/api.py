"""The public entry point: one call explains a batch of images, or of tokenised text, with any registered method."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .instrumentation import ModelAdapter, TokenBatch, adapter_for
from .instrumentation.precision import precision_modes
from .instrumentation.targets import class_indices, is_score_target
from .instrumentation.two_tower import is_text, text_directions
from .maps import check_finite
from .registry import BoundMethod, MethodSpec, available_methods, get_method


def explain(
    model: nn.Module,
    inputs: Tensor | Any,
    method: str | BoundMethod,
    target: int | Sequence[int] | Tensor | None = None,
    *,
    classes: bool | None = None,
    **options,
) -> Tensor:
    """Explain a batch of predictions of a Vision Transformer, a BERT-style text classifier, or (with the
    methods that read only its outputs) any differentiable image classifier.

    Args:
        model: a model a family describes (see :mod:`vitexplain.instrumentation`) — also compiled, or as the
            last module of an ``nn.Sequential`` whose modules before it preprocess the images — or any
            module mapping images to scores [B, K], which the methods registered with ``reads="output"``
            explain (RISE, Integrated Gradients, SmoothGrad, the controls; the others refuse it, saying
            what they read). It is left exactly as it was: hooks removed, train/eval and gradient
            checkpointing flags restored, even if an error is raised.
        inputs: preprocessed float images [B, 3, H, W]; for a text classifier, tokenised text: a
            tokenizer's output (e.g. a ``BatchEncoding`` with ``input_ids`` and ``attention_mask``),
            or token ids [B, T] whose pad tokens are padding. Sequences must be right-padded.
        method: a name from :func:`vitexplain.available_methods` (for text, one of
            ``available_methods("text")``: the methods that only read the recording; see docs/decisions/hf.md), or a
            method bound to its options beforehand (:meth:`vitexplain.registry.MethodSpec.bind`: what a protocol
            explaining again and the bench carry), whose options ``options`` update.
        target: None (explain each input's predicted class), an int (the same class for every
            input), or one class per input (LongTensor [B] or a sequence of ints); or, for methods
            registered with ``score_targets`` (all but the LRP family), any score of the output: an
            embedding direction (float tensor [D] or [B, D]; the score is the cosine similarity of the
            output — for a model without a classifier head, its pooled embedding — to it) or a function
            ``outputs [R, ...] -> [R]`` applied to every row alike (see :mod:`vitexplain.instrumentation.targets`);
            for a two-tower model (transformers' ``CLIPModel`` / ``SiglipModel``), a text or one text per image:
            its text embedding is the direction, read with the tokenizer saved beside the model
            (:func:`vitexplain.text_embeddings` takes another; :func:`vitexplain.explain_texts` runs several texts).
            A model whose head projects to an embedding (CLIP-style towers) has no classes: None and class
            indices are refused there, unless ``classes=True``.
        classes: whether the model's outputs are class logits; None decides from the model (docs/decisions/targets.md).
        **options: the method's options; an unknown one raises an error listing the valid ones.

    Inside ``torch.inference_mode()`` the explanation leaves inference mode for its length (inputs and
    targets made in it are copied); a model whose weights were made in it cannot be differentiated and is refused.

    Precision: the explanation computes in float32 with full-precision matrix products whatever the caller
    runs (autocast, TF32, bfloat16 / float16 weights, seen in float32 for the length of the call); only the
    forwards that score perturbed inputs (RISE, TIS, ViT-CX, and the metrics') run in the caller's precision,
    where it buys speed. Every flag and weight comes back as it was. A method measured to move in the
    caller's precision (e.g. LRP with rounded weights) warns once (docs/decisions/precision.md).

    Returns:
        Raw relevance scores, float32, on the inputs' device: [B, h, w] on the patch grid for
        token-level methods and at image size for pixel-level ones; for text, [B, T], one score per
        position of ``input_ids``, with the [CLS] token and padding exactly 0. Normalisation is left
        to visualisation and evaluation.
    """
    if isinstance(method, BoundMethod):             # resolved and checked at its door; only the changes are checked
        method.spec.check_options(options)
        spec, options = method.spec, {**method.options, **options}
    else:
        spec = get_method(method).bind(options).spec
    if is_text(target):  # a text (or one per image) of a two-tower model: its text embedding, a direction
        target = text_directions(model, target, inputs.shape[0] if isinstance(inputs, Tensor) and inputs.ndim else 1)
    if is_score_target(target) and not spec.score_targets:
        raise ValueError(f"method {spec.name!r} explains classes only (LRP starts from relevance on the class "
                         "logits); give target= class indices, or use a method that explains any score")
    adapter = adapter_for(model, classes=classes)
    adapter.require(spec.reads, spec.name)
    # one call: float32 (instrumentation/precision.py), the target taken (the controls read none), the inputs checked
    with torch.inference_mode(False), adapter.call(target=target, reads_target=not spec.control) as call:
        _warn_of_caveats(spec, precision_modes(adapter.model, call.scope))
        _refuse_inference_weights(adapter.model)
        prepared, target = _outside_inference(adapter.check_inputs(inputs)), _outside_inference(target)
        if isinstance(prepared, TokenBatch):
            return _finite(spec, _explain_text(spec, call, prepared, target, options).to(_device_of(inputs)))
        maps = spec.fn(call, prepared, target, **options).float()  # the method runs within the call it receives
    expected = adapter.grid_size(prepared) if spec.resolution == "token" else tuple(prepared.shape[-2:])
    if maps.shape != (prepared.shape[0], *expected):
        raise RuntimeError(f"method {spec.name!r} returned shape {tuple(maps.shape)}, expected "
                           f"{(prepared.shape[0], *expected)}")
    maps = _finite(spec, maps.detach().to(device=inputs.device, dtype=torch.float32))
    _notice_zero_maps(spec, maps)
    return maps


def _finite(spec: MethodSpec, maps: Tensor) -> Tensor:
    """``maps`` refused, as the bench refuses them (:func:`vitexplain.maps.check_finite`), when any holds NaN or
    infinite values (a plug-in's, or a method overflowing): the error names the method and the images."""
    return check_finite(maps, [f"image {i}" for i in range(maps.shape[0])], f"method {spec.name!r}: the map")


#: (method, precision) pairs already warned of in this process
_WARNED: set[tuple[str, str]] = set()


def _warn_of_caveats(spec: MethodSpec, modes: list[str]) -> None:
    """Say once per process and precision that a method's maps were measured to move in that precision."""
    for mode in modes:
        if mode in spec.precision_caveats and (spec.name, mode) not in _WARNED:
            _WARNED.add((spec.name, mode))
            warnings.warn(f"{spec.name} in {mode}: its maps were measured at r = {spec.precision_caveats[mode]:.3f} to "
                          "the float32 model's (worst of 64 digits test canvases); see docs/decisions/precision.md",
                          stacklevel=3)


class AllZeroMapWarning(UserWarning):
    """A method returned a map that is zero everywhere for some image (the bench, which shows the maps, mutes it)."""


def _notice_zero_maps(spec: MethodSpec, maps: Tensor) -> None:
    """Say, once per call, how many of the batch's maps are zero everywhere, and why the method gives such maps."""
    zero = int((maps.flatten(1) == 0).all(1).sum())
    if zero:
        warnings.warn(f"{spec.name} returned an all-zero map for {zero} of {len(maps)} images: "
                      f"{spec.zero_map_reason}", AllZeroMapWarning, stacklevel=3)


def _explain_text(spec: MethodSpec, adapter: ModelAdapter, tokens: TokenBatch, target, options: dict) -> Tensor:
    """Per-token maps [B, T] of a text batch, each sequence explained at its own length.

    Sequences of one length run together, cut to that length, so no method ever sees padding and a
    sequence's map does not depend on the other sequences of the batch or on how much it was padded.
    """
    if "text" not in spec.modalities:
        raise ValueError(f"method {spec.name!r} explains images only; for text use one of: "
                         f"{', '.join(available_methods('text'))}")
    lengths = tokens.lengths
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    if not torch.equal(tokens.attention_mask, positions < lengths[:, None]):
        raise ValueError("explain takes right-padded sequences (attention_mask 1 … 1 0 … 0); "
                         "tokenize with padding_side='right'")
    if (lengths == 0).any():
        raise ValueError(f"sequence {int((lengths == 0).nonzero()[0])} has no tokens")
    per_sequence = None if target is None else class_indices(target, tokens.shape[0], tokens.device)
    maps = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    for length in lengths.unique().tolist():
        rows = (lengths == length).nonzero()[:, 0]
        group_target = None if per_sequence is None else per_sequence[rows]
        group = spec.fn(adapter, tokens.select(rows, length), group_target, **options)
        if group.shape != (len(rows), length):
            raise RuntimeError(f"method {spec.name!r} returned shape {tuple(group.shape)}, expected "
                               f"{(len(rows), length)}")
        maps[rows, :length] = group.detach().float()
    return maps


def _refuse_inference_weights(model: nn.Module) -> None:
    if any(parameter.is_inference() for parameter in model.parameters()):
        raise RuntimeError(f"this {type(model).__name__}'s weights were made under torch.inference_mode(), so no "
                           "gradient can flow through them: build or load the model outside inference mode")


def _outside_inference(value: Any) -> Any:
    """``value`` (inputs, a target), its tensors made under ``torch.inference_mode()`` copied into ordinary ones,
    which autograd may save."""
    if isinstance(value, Tensor):
        return value.clone() if value.is_inference() else value
    if isinstance(value, TokenBatch):
        return dataclasses.replace(value, **{field.name: _outside_inference(getattr(value, field.name))
                                             for field in dataclasses.fields(value)})
    return value


def _device_of(inputs: Any) -> torch.device:
    """The device the caller's inputs are on (token ids given as lists are on the CPU)."""
    if isinstance(inputs, Mapping):
        inputs = inputs["input_ids"]
    return inputs.device if isinstance(inputs, (Tensor, TokenBatch)) else torch.device("cpu")
