"""One forward and one backward under a rule set: :func:`relevance`, and the :class:`Relevance` it returns.

The rules are placed for the forward (:func:`~.placement.lrp_rules`), the rule set's start puts relevance
on the target logits, and one ordinary backward from there carries it to every tensor asked for (a
tensor's relevance is the tensor times its gradient under the rules). Optionally a second backward
through the same forward takes the plain gradient at the attention (:func:`~.rules.both_gradients`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..adapter import ModelAdapter, evaluation_mode
from ..geometry import TokenGeometry
from ..positions import token_geometry
from ..targets import resolve_target
from . import rules as r
from .composites import RuleSet, one_on_target, resolve_rules
from .placement import lrp_rules
from .trace import AttentionReadings, Trace

#: what :func:`relevance` can return
STAGES = ("attn", "residuals", "patches", "pixels")


@dataclass
class Relevance:
    """Relevance of one batch under one rule set, for the target class of each image.

    Attributes:
        logits: model output [B, classes].
        targets: the class explained for each image [B].
        output: relevance put on each image's target logit [B] (1, the logit, or 0 when starting from the others).
        attn: relevance of every block's attention probabilities [B, H, N, N] (zero where the rules hold
            attention constant; None for blocks not asked for); windowed blocks: [B, H, windows, T, T].
        residuals: relevance of every block's input, then of the last block's output [B, N, C] (a
            hierarchical model's later stages have fewer tokens).
        patches: relevance of the patch embeddings (before position embedding) [B, h*w, C]; under
            the absolute rule not renormalised.
        pixels: relevance of the input pixels [B, C, H, W].
        geometry: where the tokens sit: grid, prefix tokens, class token, readout, stages and each block's
            window layout (:class:`~vitexplain.instrumentation.geometry.TokenGeometry`), through which maps,
            readout rows and block matrices are read.
        attn_grads: with ``gradients=True``, the plain gradient of the target logit at the attention
            probabilities of the blocks asked for, shaped as ``attn`` (None elsewhere).
        reduced: with ``reduce``, its value for each block asked for (None elsewhere; ``attn`` and
            ``attn_grads`` are then None).
    """

    logits: Tensor
    targets: Tensor
    output: Tensor
    attn: list[Tensor | None]
    residuals: list[Tensor | None]
    patches: Tensor | None
    pixels: Tensor | None
    geometry: TokenGeometry
    attn_grads: list[Tensor | None] | None = None
    reduced: list[Any] | None = None

    @property
    def tokens(self) -> Tensor:
        """Relevance of the token embeddings fed to the first block [B, N, C]."""
        return self.residuals[0]


def relevance(adapter: ModelAdapter, images: Tensor, targets=None, rules: str | RuleSet = "chefer", *,
              at: Collection[str] = STAGES, blocks: Collection[int] | None = None,
              gradients: bool = False,
              reduce: Callable[[TokenGeometry, int, Tensor, Tensor | None], Any] | None = None,
              recompute: bool = True) -> Relevance:
    """One forward and one backward under ``rules``; the relevance at the stages asked for.

    Args:
        adapter: the model's adapter (``vitexplain.adapter_for(model)``).
        images: preprocessed batch [B, 3, H, W].
        targets: None (each image's predicted class), an int, or one class per image.
        rules: a name from :data:`~.composites.RULE_SETS` or a :class:`~.composites.RuleSet`.
        at: which of ``attn``, ``residuals``, ``patches``, ``pixels`` to return; the backward stops
            at the lowest one asked for, and the blocks below it run plainly, without gradients.
        blocks: for ``attn``, the blocks whose attention relevance is wanted (None: all).
        gradients: also the plain gradient of the target logit at that attention (``attn_grads``), taken
            by a second backward through the same forward (:func:`~.rules.both_gradients`).
        reduce: ``(geometry, block, relevance, gradient) -> value``: what is kept of each block's attention
            relevance [B, H, N, N] (windowed: per window) and plain gradient (None without ``gradients``), run
            as the relevance's backward passes the block, the last block first (``Relevance.reduced``).
            Without it every block's relevance and gradient are kept; a block's attention probabilities
            are computed again in the backward either way (docs/decisions/performance.md).
        recompute: compute each block again in the backward (:func:`~.placement.lrp_rules`): peak memory that
            does not grow with blocks × tokens², for one more forward of the blocks (in the relevance's backward;
            the plain one of ``gradients`` reads the plain graph the forward keeps for it). False keeps every
            block's graph from the forward, the attention's probabilities included: faster, for memory that
            grows with blocks × tokens²; the same operations, so the same values up to rounding.
    """
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"relevance takes a ModelAdapter (vitexplain.adapter_for(model)), got {type(adapter).__name__}")
    unknown = set(at) - set(STAGES)
    if unknown:
        raise ValueError(f"cannot return relevance at {sorted(unknown)}; choose from {STAGES}")
    if (gradients or reduce is not None) and "attn" not in at:
        raise ValueError(f"{'gradients are' if gradients else 'reduce is'} taken at the attention: ask for relevance "
                         "at 'attn' too")
    with adapter.call(reads_target=False) as call:  # the rules' denominators need float32 (precision.py)
        resolved = resolve_rules(rules)
        return _relevance(call, adapter.check_images(images), targets, resolved, at, blocks, gradients, reduce,
                          recompute)


def _relevance(adapter: ModelAdapter, images: Tensor, targets, rules: RuleSet, at: Collection[str],
               blocks: Collection[int] | None, gradients: bool, reduce, recompute: bool) -> Relevance:
    below_blocks = "pixels" in at or "patches" in at
    images = images.detach().requires_grad_(below_blocks)  # checked by the caller
    num_blocks = adapter.num_blocks
    chosen = range(num_blocks) if blocks is None else sorted({b % num_blocks for b in blocks})
    # the graph starts where the lowest relevance asked for is (the images' own gradient is never taken
    # unless the pixels are asked for: autograd stops at the tensors asked for)
    gradient_from = None if below_blocks else 0 if "residuals" in at else min(chosen)
    with evaluation_mode(adapter.model), torch.enable_grad(), \
            (r.both_gradients() if gradients else contextlib.nullcontext()) as phase:
        with lrp_rules(adapter, rules, pixels="pixels" in at, gradient_from=gradient_from,
                       recompute=recompute) as trace:
            readings = None if "attn" not in at else AttentionReadings(chosen, phase, reduce, images.device)
            trace.readings = readings
            logits = adapter.forward(images)
            # the backward computes each block's forward again under the rules, so it runs while they are placed
            layouts = [trace.layouts.get(block) for block in range(num_blocks)]
            geometry = token_geometry(adapter, images, layouts, trace.residuals[num_blocks - 1].shape[1],
                                      trace.readout_attn, trace.readout_selection)
            if readings is not None:
                readings.geometry = geometry
            resolved = resolve_target(targets, logits.detach(), has_classes=adapter.family.has_classes)
            if not resolved.is_class:
                raise ValueError("LRP starts from relevance on the class logits: give class targets")
            classes = resolved.classes
            start = rules.start(logits.detach(), classes)
            wanted = _wanted(trace, images, at, num_blocks)
            plain = _plain_gradients(phase, logits, classes, wanted["attn"]) if gradients else None
            taken = _propagated(logits, r.safe_divide(start, logits.detach()), wanted)
            if readings is not None and not recompute:
                _read_kept_attention(trace, taken["attn"], plain)
    patches = taken["patches"][0] if taken["patches"] else None
    kept = readings is not None and reduce is None
    return Relevance(
        logits=logits.detach(), targets=classes, output=start.gather(1, classes[:, None])[:, 0],
        attn=_per_block(readings.relevance if kept else {}, num_blocks),
        residuals=[value.flatten(1, -2) for value in taken["residuals"]] or [None] * (num_blocks + 1),
        patches=None if patches is None else patches.reshape(patches.shape[0], -1, patches.shape[-1]),
        pixels=_pixels(taken["pixels"], images, adapter),
        geometry=geometry,
        attn_grads=_per_block(readings.gradients, num_blocks) if kept and gradients else None,
        reduced=_per_block(readings.reduced, num_blocks) if reduce is not None else None)


def _wanted(trace: Trace, images: Tensor, at: Collection[str], num_blocks: int) -> dict[str, list[Tensor]]:
    """The tensors whose relevance is asked for, by stage; the pixels' with the z^B rule's bound terms
    (:class:`~.rules.ZBox`), whose relevance adds to theirs; for the attention, the readings' anchor (the
    attention's relevance is collected as the backward passes it, :class:`~.trace.AttentionReadings`), or the
    probabilities the forward kept (``recompute=False``)."""
    bounds = (trace.pixel_rule.bounds or ()) if isinstance(trace.pixel_rule, r.ZBox) else ()
    attention = [] if "attn" not in at else [trace.readings.anchor] if trace.sink.recompute else \
        list(trace.attention.values())
    return {
        "attn": attention,
        "residuals": [trace.residuals[block] for block in range(num_blocks + 1)] if "residuals" in at else [],
        "patches": [trace.patches] if "patches" in at else [],
        "pixels": [images, *bounds] if "pixels" in at else [],
    }


def _plain_gradients(phase: r.Phase, logits: Tensor, classes: Tensor,
                     anchors: list[Tensor]) -> tuple[Tensor | None, ...]:
    """The plain backward of the target logit through the attention of the blocks read (to the ``anchors``),
    which leaves each its plain gradient (:class:`~.trace.AttentionReadings`; where the anchors are the kept
    probabilities, the gradients returned) and keeps the graph for the relevance's."""
    phase.plain = True
    try:
        found = torch.autograd.grad(logits, anchors, grad_outputs=one_on_target(logits, classes), retain_graph=True,
                                    allow_unused=True)
    finally:
        phase.plain = False
    return found


def _read_kept_attention(trace: Trace, relevances: list[Tensor], plain: tuple[Tensor | None, ...] | None) -> None:
    """Hand the readings each block's relevance and plain gradient (0 where none reached it) at the probabilities
    the forward kept (``recompute=False``), the last block first, as the backward that computes each block again
    hands them."""
    blocks = list(trace.attention)
    for index in reversed(range(len(blocks))):
        found = {"attn": relevances[index]}
        if plain is not None:
            found["grad"] = torch.zeros_like(relevances[index]) if plain[index] is None else plain[index]
        trace.readings.read(blocks[index], found, trace.layouts.get(blocks[index]))


def _propagated(logits: Tensor, seed: Tensor, wanted: dict[str, list[Tensor]]) -> dict[str, list[Tensor]]:
    """Each wanted tensor's relevance, by stage: the tensor times its gradient under the rules from
    ``seed`` at the logits (zero where the backward does not reach it)."""
    tensors = [tensor for stage in STAGES for tensor in wanted[stage]]
    differentiable = [tensor for tensor in tensors if tensor.requires_grad]
    found = iter(torch.autograd.grad(logits, differentiable, grad_outputs=seed, allow_unused=True)
                 if differentiable else ())
    gradients = [next(found) if tensor.requires_grad else None for tensor in tensors]
    values = iter([tensor.detach() * (torch.zeros_like(tensor) if gradient is None else gradient)
                   for tensor, gradient in zip(tensors, gradients)])
    return {stage: [next(values) for _ in wanted[stage]] for stage in STAGES}


def _per_block(values: dict[int, Any], num_blocks: int) -> list[Any]:
    """Values by block as a per-block list, None elsewhere."""
    return [values.get(block) for block in range(num_blocks)]


def _pixels(taken: list[Tensor], images: Tensor, adapter: ModelAdapter) -> Tensor | None:
    """The pixels' relevance plus the z^B rule's bound terms (laid out as pixels where the patch projection is a
    Linear of flattened patches; cropped in case the patch embedding padded the image); None when not asked for."""
    if not taken:
        return None
    pixels, *bounds = taken
    height, width = images.shape[-2:]
    as_pixels = adapter.family.embedding().as_pixels if bounds else None
    for bound in bounds:
        bound = bound if as_pixels is None else as_pixels(bound, tuple(adapter.grid_size(images)))
        pixels = pixels + bound[..., :height, :width]
    return pixels
