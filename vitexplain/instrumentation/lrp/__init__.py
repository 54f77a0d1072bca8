"""Layer-wise relevance propagation (LRP) through a Transformer's own modules, laid out as zennit is.

* :mod:`.rules` — the rules, as objects: module rules (Linear, LayerNorm, activation, dropout, patch
  convolution) and operation rules (residual add, attention products and softmax, LayerScale, gates);
* :mod:`.composites` — rule sets (which rule each part gets): ``chefer``, ``lrp``, ``conservative``,
  ``abslrp``;
* placement (here) — where the parts are comes from the model's family description: the rule set's
  module rules go on the model's modules by type, its operation rules are the arithmetic of the
  written-out blocks and attention (:meth:`~vitexplain.instrumentation.ModelAdapter.instrumented`).

Like zennit, this changes how the model computes its *backward* while leaving its forward values
untouched, so that one ordinary backward pass propagates relevance. :func:`lrp_rules` applies a rule
set for the length of a ``with`` block (everything removed on exit, also after an exception), and
:func:`relevance` runs one forward and one backward and returns the relevance asked for.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..adapter import READOUT, ModelAdapter, evaluation_mode
from ..attention import Arithmetic, Sink
from ..families.base import UnsupportedModelError
from ..patching import ModelPatch
from ..precision import float32_scope
from ..targets import resolve_target
from ..windows import (
    Grid,
    WindowedMatrix,
    WindowLayout,
    mix_rows,
    mixing,
    stage_grids,
    to_tokens,
)
from . import rules as r
from .composites import (
    RULE_SETS,
    RuleSet,
    lrp_baseline,
    one_on_target,
    other_classes,
    resolve_rules,
)

#: what :func:`relevance` can return
STAGES = ("attn", "residuals", "patches", "pixels")


@dataclass
class Trace:
    """Tensors of one forward under :func:`lrp_rules`, whose relevance :func:`relevance` reads.

    Attributes:
        attn: attention probabilities of every block [B, H, N, N], as they enter A·v.
        residuals: every block's input, then the last block's output [B, N, C].
        patches: the patch embedding's output, before prefix tokens and position embedding.
        readout_attn: an attention-pooling head's probabilities [B, H, latents, N], when the model has one.
        readout_selection: a max-pooling head's selection of the tokens it pools [B, N'], when the model has one.
        pixel_rule: the pixel rule placed (its bounds, for the z^B rule).
        layouts: windowed blocks' window layouts (hierarchical models), by block.
    """

    attn: dict[int, Tensor] = field(default_factory=dict)
    residuals: dict[int, Tensor] = field(default_factory=dict)
    patches: Tensor | None = None
    readout_attn: Tensor | None = None
    readout_selection: Tensor | None = None
    pixel_rule: r.ModuleRule | None = None
    layouts: dict[int, WindowLayout] = field(default_factory=dict)


class _TraceSink(Sink):
    """Keeps the attention and the residual stream of the blocks from ``first`` on (and the pooling head's)."""

    def __init__(self, trace: Trace, first: int = 0):
        self.trace = trace
        self.first = first

    def wants(self, block: int, name: str) -> bool:
        if block == READOUT:
            return name in ("attn", "selection")
        return name in ("attn", "residual") and block >= self.first

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == READOUT:
            self.trace.readout_attn = tensors.get("attn", self.trace.readout_attn)
            self.trace.readout_selection = tensors.get("selection", self.trace.readout_selection)
            return
        if "attn" in tensors:
            self.trace.attn[block] = tensors["attn"]
        if "residual" in tensors:
            self.trace.residuals[block] = tensors["residual"]

    def layout(self, block: int, layout: WindowLayout) -> None:
        self.trace.layouts[block] = layout


class RuleArithmetic(Arithmetic):
    """The written-out blocks' operations under a rule set."""

    def __init__(self, rules: RuleSet):
        self.rules = rules

    @property
    def explicit(self) -> bool:
        """The attention is written out wherever a gradient will pass it (the rules act on its parts)."""
        return torch.is_grad_enabled()

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self.rules.residual(a, b)

    def scale(self, x: Tensor, gamma: Tensor) -> Tensor:
        return self.rules.scale(x, gamma)

    def scores(self, q: Tensor, k: Tensor, constant_query: bool = False) -> Tensor:
        return self.rules.attention.scores(q, k, constant_query)

    def offset(self, x: Tensor, constant: Tensor) -> Tensor:
        return self.rules.attention.offset(x, constant)

    def softmax(self, scores: Tensor) -> Tensor:
        return self.rules.attention.softmax(scores)

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        return self.rules.attention.mix(attn, v)

    def normalize(self, t: Tensor) -> Tensor:
        return self.rules.attention.normalize(t)

    def gate(self, value: Tensor, gate: Tensor) -> Tensor:
        return self.rules.gate(value, gate)

    def attention_input(self, x: Tensor) -> Tensor:
        return self.rules.attention.input(x)

    def dropout(self, t: Tensor, module: nn.Module | None) -> Tensor:
        """A dropout of the forward; where timm's ViT has one and the family none, the rule set's dropout rule."""
        if module is not None:
            return module(t)
        return r.absolute_passthrough(t) if self.rules.dropout is not None else t


def _activations(family) -> list[nn.Module]:
    """The feed-forwards' element-wise activations (blocks and pooling head)."""
    found = [parts.activation for parts in family.blocks] + [family.probe and family.probe.activation]
    return [activation for activation in found if activation is not None]


def _check_covered(adapter: ModelAdapter) -> None:
    """Refuse a model holding a module the written-out blocks and the rules do not cover, naming it."""
    family = adapter.family
    allowed = (*family.lrp_allowed(), nn.Linear, nn.LayerNorm, nn.Identity, nn.Dropout, nn.Sequential, nn.ModuleList)
    exempt = {id(activation) for activation in _activations(family)}
    convolution = family.embedding().convolution
    if convolution is not None:
        exempt.add(id(convolution))
    for name, module in adapter.model.named_modules():
        gated = any(parts.attention.module is module and parts.attention.gate is not None for parts in family.blocks)
        if id(module) in exempt or (isinstance(module, allowed) and not gated):
            continue
        reason = "its attention has a gate" if gated else "has no LRP rule here"
        raise UnsupportedModelError(f"cannot propagate LRP through this {type(adapter.model).__name__}: its module "
                                    f"{name} ({type(module).__name__}) {reason}")


def _place(adapter: ModelAdapter, rules: RuleSet, trace: Trace, patch: ModelPatch, pixels: bool) -> None:
    """Put the rule set's module rules on the model's modules, from its family description."""
    family, model = adapter.family, adapter.model
    embedding = family.embedding()
    projections = {id(linear) for parts in family.blocks for linear in parts.attention.projections}
    if family.probe is not None:
        projections |= {id(linear) for linear in family.probe.attention.projections}
    activations = {id(activation) for activation in _activations(family)}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            rules.linear().place(module, patch, renormalise_input=id(module) not in projections)
        elif isinstance(module, nn.LayerNorm):
            rules.norm().place(module, patch)
        elif id(module) in activations:
            rules.activation().place(module, patch)
            if rules.dropout is not None and module in family.missing_dropouts():
                patch.hook(module.register_forward_hook(lambda module, args, output: r.absolute_passthrough(output)))
        elif isinstance(module, nn.Dropout) and module is not embedding.position_module and rules.dropout is not None:
            rules.dropout().place(module, patch)
    if rules.dropout is not None:
        for head in family.head_without_dropout():
            patch.hook(head.register_forward_pre_hook(lambda module, args: (r.absolute_passthrough(args[0]),)))
    patch.hook(embedding.patch_embedding.register_forward_hook(
        lambda module, args, output: setattr(trace, "patches", output)))
    if rules.position is not None and embedding.position_module is not None:
        prefix = adapter.num_prefix_tokens
        patch.hook(embedding.position_module.register_forward_pre_hook(
            lambda module, args: (r.normalise_relevance(args[0]),)))
        patch.hook(embedding.position_module.register_forward_hook(
            lambda module, args, output: rules.position(output, trace.patches, prefix)))
    if pixels and embedding.convolution is not None:
        trace.pixel_rule = rules.pixels()
        trace.pixel_rule.place(embedding.convolution, patch)
    last = family.blocks[-1].module
    patch.hook(last.register_forward_hook(lambda module, args, output: trace.residuals.__setitem__(
        len(family.blocks), output[0] if isinstance(output, tuple) else output)))


@contextlib.contextmanager
def lrp_rules(adapter: ModelAdapter, rules: str | RuleSet = "chefer", *, pixels: bool = True,
              gradient_from: int | None = None) -> Iterator[Trace]:
    """Within the block, the model's backward propagates relevance under ``rules``; yields the :class:`Trace`.

    Forward values are unchanged (up to rounding in the attention, which is computed unfused). The model
    comes back exactly as it was — hooks removed, patched ``forward`` methods restored — also when an
    exception is raised inside. ``pixels=False`` leaves the patch convolution's rule out (for callers
    that do not read the pixels' relevance). ``gradient_from``: blocks below this index run plainly
    without gradients and this block's input starts the graph (the backward stops there; the trace
    holds the attention and residuals from there on).
    """
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"lrp_rules takes a ModelAdapter (vitexplain.adapter_for(model)), got {type(adapter).__name__}")
    rules = resolve_rules(rules)
    _check_covered(adapter)
    trace = Trace()
    with float32_scope(adapter.model), adapter.instrumented(arithmetic=RuleArithmetic(rules), sink=_TraceSink(trace, gradient_from or 0),
                              gradient_from=gradient_from) as patch:
        _place(adapter, rules, trace, patch, pixels)
        yield trace


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
        grid: patch grid (h, w).
        num_prefix_tokens: non-patch tokens at the start of the sequence.
        class_token_index: position of the class token, or None.
        readout: what the output takes from each last-block token [B, N] (see
            :class:`~vitexplain.instrumentation.recording.Readout`).
        attn_grads: with ``gradients=True``, the plain gradient of the target logit at the attention
            probabilities of the blocks asked for, shaped as ``attn`` (None elsewhere).
        layouts: each block's window layout (None for global attention).
        stages: the token grids of a hierarchical model's stages, first first.
    """

    logits: Tensor
    targets: Tensor
    output: Tensor
    attn: list[Tensor | None]
    residuals: list[Tensor | None]
    patches: Tensor | None
    pixels: Tensor | None
    grid: tuple[int, int]
    num_prefix_tokens: int
    class_token_index: int | None
    readout: Tensor | None = None
    attn_grads: list[Tensor | None] | None = None
    layouts: list[WindowLayout | None] = field(default_factory=list)
    stages: tuple[Grid, ...] = ()

    @property
    def tokens(self) -> Tensor:
        """Relevance of the token embeddings fed to the first block [B, N, C]."""
        return self.residuals[0]

    def patch_map(self, per_token: Tensor) -> Tensor:
        """Per-token values over the whole sequence [B, N] (of any stage) -> the patch tokens on the
        (first stage's) grid [B, h, w]."""
        per_patch = to_tokens(per_token[:, self.num_prefix_tokens:], math.prod(self.grid), self.stages)
        return per_patch.reshape(per_token.shape[0], *self.grid)

    def mixing(self, block: int, matrix: Tensor) -> Tensor | WindowedMatrix:
        """Block ``block``'s token-by-token matrix as a factor of the products (windowed: with its layout)."""
        return mixing(self.layouts[block], matrix)

    def readout_row(self, matrix: Tensor | WindowedMatrix) -> Tensor:
        """The readout's row of a last-block token-by-token matrix [B, N, N] (or a windowed one, see
        :meth:`mixing`) over the patches -> [B, h, w] (the class token's row for class-token models)."""
        return self.patch_map(mix_rows(self.readout, matrix))


def relevance(adapter: ModelAdapter, images: Tensor, targets=None, rules: str | RuleSet = "chefer", *,
              at: Collection[str] = STAGES, blocks: Collection[int] | None = None, gradients: bool = False) -> Relevance:
    """One forward and one backward under ``rules``; the relevance at the stages asked for.

    Args:
        adapter: the model's adapter (``vitexplain.adapter_for(model)``).
        images: preprocessed batch [B, 3, H, W].
        targets: None (each image's predicted class), an int, or one class per image.
        rules: a name from :data:`RULE_SETS` or a :class:`RuleSet`.
        at: which of ``attn``, ``residuals``, ``patches``, ``pixels`` to return; the backward stops
            at the lowest one asked for, and the blocks below it run plainly, without gradients.
        blocks: for ``attn``, the blocks whose attention relevance is wanted (None: all).
        gradients: also the plain gradient of the target logit at that attention (``attn_grads``), taken
            by a second backward through the same forward (:func:`~.rules.both_gradients`).
    """
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"relevance takes a ModelAdapter (vitexplain.adapter_for(model)), got {type(adapter).__name__}")
    unknown = set(at) - set(STAGES)
    if unknown:
        raise ValueError(f"cannot return relevance at {sorted(unknown)}; choose from {STAGES}")
    if gradients and "attn" not in at:
        raise ValueError("gradients are taken at the attention: ask for relevance at 'attn' too")
    with float32_scope(adapter.model):  # the rules' denominators need float32 (precision.py)
        return _relevance(adapter, images, targets, resolve_rules(rules), at, blocks, gradients)


def _relevance(adapter: ModelAdapter, images: Tensor, targets, rules: RuleSet, at: Collection[str],
               blocks: Collection[int] | None, gradients: bool) -> Relevance:
    below_blocks = "pixels" in at or "patches" in at
    images = adapter.check_images(images).detach().requires_grad_(below_blocks)
    num_blocks = adapter.num_blocks
    chosen = range(num_blocks) if blocks is None else sorted({b % num_blocks for b in blocks})
    # the graph starts where the lowest relevance asked for is (the images' own gradient is never taken
    # unless the pixels are asked for: autograd stops at the tensors asked for)
    gradient_from = None if below_blocks else 0 if "residuals" in at else min(chosen)
    with evaluation_mode(adapter.model), torch.enable_grad(), \
            (r.both_gradients() if gradients else contextlib.nullcontext()) as phase:
        with lrp_rules(adapter, rules, pixels="pixels" in at, gradient_from=gradient_from) as trace:
            logits = adapter.forward(images)
        resolved = resolve_target(targets, logits.detach(), has_classes=adapter.family.has_classes)
        if not resolved.is_class:
            raise ValueError("LRP starts from relevance on the class logits: give class targets")
        classes = resolved.classes
        start = rules.start(logits.detach(), classes)
        seed = r.safe_divide(start, logits.detach())
        wanted: dict[str, list[Tensor]] = {
            "attn": [trace.attn[b] for b in chosen] if "attn" in at else [],
            "residuals": [trace.residuals[b] for b in range(num_blocks + 1)] if "residuals" in at else [],
            "patches": [trace.patches] if "patches" in at else [],
            "pixels": [images, *(trace.pixel_rule.bounds or ())] if "pixels" in at and isinstance(
                trace.pixel_rule, r.ZBox) else ([images] if "pixels" in at else []),
        }
        attn_grads = None
        if gradients:
            phase.plain = True
            plain = torch.autograd.grad(logits, wanted["attn"], grad_outputs=one_on_target(logits, classes),
                                        retain_graph=True, allow_unused=True)
            phase.plain = False
            attn_grads = [None] * num_blocks
            for block, tensor, gradient in zip(chosen, wanted["attn"], plain):
                attn_grads[block] = torch.zeros_like(tensor) if gradient is None else gradient
        tensors = [t for stage in STAGES for t in wanted[stage]]
        differentiable = [t for t in tensors if t.requires_grad]
        found = iter(torch.autograd.grad(logits, differentiable, grad_outputs=seed, allow_unused=True)
                     if differentiable else ())
        grads = [next(found) if t.requires_grad else None for t in tensors]
    values = iter([t.detach() * (torch.zeros_like(t) if g is None else g) for t, g in zip(tensors, grads)])
    taken = {stage: [next(values) for _ in wanted[stage]] for stage in STAGES}
    layouts = [trace.layouts.get(block) for block in range(num_blocks)]
    def as_recorded(block: int, value: Tensor) -> Tensor:
        return value if layouts[block] is None else layouts[block].recorded({"attn": value})["attn"]

    attn: list[Tensor | None] = [None] * num_blocks
    for block, value in zip(chosen if "attn" in at else (), taken["attn"]):
        attn[block] = as_recorded(block, value)
    if attn_grads is not None:
        attn_grads = [None if g is None else as_recorded(block, g) for block, g in enumerate(attn_grads)]
    residuals = [value.flatten(1, -2) for value in taken["residuals"]]  # a block's output may be a token grid
    pixels = None
    if taken["pixels"]:
        pixels, *bounds = taken["pixels"]
        height, width = images.shape[-2:]
        for bound in bounds:  # z^B's bound terms; cropped in case the patch embedding padded the image
            pixels = pixels + bound[..., :height, :width]
    patches = taken["patches"][0] if taken["patches"] else None
    grid = adapter.grid_size(images)
    last_tokens = trace.residuals[num_blocks - 1].shape[1]
    return Relevance(
        logits=logits.detach(), targets=classes, output=start.gather(1, classes[:, None])[:, 0], attn=attn,
        residuals=residuals or [None] * (num_blocks + 1),
        patches=None if patches is None else patches.reshape(patches.shape[0], -1, patches.shape[-1]),
        pixels=pixels, grid=grid, num_prefix_tokens=adapter.num_prefix_tokens,
        class_token_index=adapter.class_token_index,
        readout=adapter.readout_weights(last_tokens, logits.shape[0], trace.readout_attn, trace.readout_selection).weights,
        attn_grads=attn_grads, layouts=layouts, stages=stage_grids(layouts, grid))


__all__ = ["RULE_SETS", "Relevance", "RuleArithmetic", "RuleSet", "STAGES", "Trace", "lrp_baseline", "lrp_rules",
           "other_classes", "relevance", "resolve_rules"]
