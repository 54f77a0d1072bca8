"""Placement: a rule set put on a model, from its family description, for the length of a ``with`` block.

Where the parts are comes from the model's family description: the rule set's module rules go on the
model's modules by type (a Linear's also by its role and block), its operation rules are the arithmetic
of the written-out blocks and attention (:class:`RuleArithmetic`, run by
:meth:`~vitexplain.instrumentation.ModelAdapter.instrumented`). :func:`lrp_rules` refuses a model holding
a module no rule covers, places everything, and removes it all on exit (also after an exception).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from ..adapter import ModelAdapter
from ..attention import PLAIN, Arithmetic
from ..families.base import UnsupportedModelError
from ..patching import ModelPatch
from . import rules as r
from .composites import RuleSet, resolve_rules
from .trace import Trace, TraceSink


class _WrittenOut(Arithmetic):
    """The plain operations with the attention written out, so that its probabilities reach the trace's readings:
    a block's arithmetic when it is computed for the plain gradient or its values alone (:class:`_Recomputation`)."""

    explicit = True


class RuleArithmetic(Arithmetic):
    """The written-out blocks' operations under a rule set."""

    @property
    def explicit(self) -> bool:
        """The attention is written out wherever a gradient will pass it (the rules act on its parts)."""
        return torch.is_grad_enabled()

    def __init__(self, rules: RuleSet, recompute: bool = True):
        self.rules = rules
        self.recompute = recompute
        #: whether the module rules are on the model (within :func:`lrp_rules`)
        self.placed = True

    def recomputing(self) -> _Recomputation | None:
        """With ``recompute``, each block's forward, attention included, is computed again under the rules in the
        backward, so a block's tensors are kept only while the backward passes it; that backward must run while
        the rules are placed. Without it, every block's graph is kept from the forward (None)."""
        if not self.recompute or not torch.is_grad_enabled():
            return None
        return _Recomputation(self)

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

    def normalise(self, t: Tensor) -> Tensor:
        return self.rules.attention.normalise(t)

    def gate(self, value: Tensor, gate: Tensor) -> Tensor:
        return self.rules.gate(value, gate)

    def attention_input(self, x: Tensor) -> Tensor:
        return self.rules.attention.input(x)

    def dropout(self, t: Tensor, module: nn.Module | None) -> Tensor:
        """A dropout of the forward; where timm's ViT has one and the family none, the rule set's dropout rule."""
        if module is not None:
            return module(t)
        return r.absolute_passthrough(t) if self.rules.dropout is not None else t


_WRITTEN_OUT = _WrittenOut()


class _Recomputation:
    """A block under the rules computed again in the backward (:class:`~..attention.Recomputation`).

    The plain backward of :func:`~.rules.both_gradients` reads only the plain graph, and the forward only the
    block's output: a block computed for either (``plain=True``) runs its plain forward — plain operations (the
    attention written out for the readings, or fused where only the gradient at A·v is read) and the module rules
    standing aside (:func:`~.rules.rules_apply`) — on the same values, so the same output and plain gradient,
    without the rules' surrogates (the |W| |x| products of every Linear). Where that plain backward will come, the
    forward keeps its plain graph for it (``keeps_plain_graph``), so only the relevance's backward computes the
    block again.
    """

    def __init__(self, arithmetic: RuleArithmetic):
        self.arithmetic = arithmetic
        self.restored = r.RestoredPhase()
        self.keeps_plain_graph = self.restored.phase is not None

    def plain_backward(self) -> bool:
        return self.restored.plain_now()

    @contextlib.contextmanager
    def __call__(self, plain: bool = False, fused: bool = False) -> Iterator[Arithmetic]:
        if not self.arithmetic.placed:
            raise RuntimeError("relevance is propagated by a backward within lrp_rules(): each block's forward "
                               "is computed again there, under the rules placed")
        with self.restored(plain) as plain:
            yield (PLAIN if fused else _WRITTEN_OUT) if plain else self.arithmetic


def _activations(family) -> list[nn.Module]:
    """The feed-forwards' element-wise activations (blocks and pooling head)."""
    found = [parts.activation for parts in family.blocks] + [family.probe and family.probe.activation]
    return [activation for activation in found if activation is not None]


def _check_covered(adapter: ModelAdapter) -> None:
    """Refuse a model holding a module the written-out blocks and the rules do not cover, naming it."""
    family = adapter.family
    allowed = (*family.lrp_allowed(), nn.Linear, *r.norm_types(), nn.Identity, nn.Dropout, nn.Sequential, nn.ModuleList)
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


def _attention_linears(family) -> list[tuple[nn.Linear, int | None]]:
    """The Linears of every attention (blocks and pooling head) with their block (None: the head)."""
    attentions = [(parts.attention, index) for index, parts in enumerate(family.blocks)]
    attentions += [(family.probe.attention, None)] if family.probe is not None else []
    return [(linear, index) for attention, index in attentions
            for linear in (*attention.projections, attention.query, attention.proj) if isinstance(linear, nn.Linear)]


def _linear_places(family) -> dict[int, tuple[str, int | None]]:
    """Each Linear of the blocks and of a pooling head, by id: its role and block (:data:`.composites.LinearRules`);
    Linears not listed are ``("head", None)``."""
    places = {id(linear): ("mlp", index) for index, parts in enumerate(family.blocks)
              for linear in parts.module.modules() if isinstance(linear, nn.Linear)}
    places.update({id(linear): ("attention", index) for linear, index in _attention_linears(family)})
    return places


def _ruled_modules(adapter: ModelAdapter, views: tuple[nn.Linear, ...]) -> list[nn.Module]:
    """The model's modules, then the description's Linears that are none of them: views of bare parameters
    (:class:`~..families.base.LinearView`: ``nn.MultiheadAttention``'s packed input projection, ``views`` of
    the family's LRP forward), which the written-out attention and that forward call as modules, so their rules are
    placed like any Linear's."""
    modules = list(adapter.model.modules())
    own = {id(module) for module in modules}
    described = [linear for linear, _ in _attention_linears(adapter.family)] + list(views)
    return modules + list({id(linear): linear for linear in described if id(linear) not in own}.values())


def _keep_patches(trace: Trace, channels_first: bool, module: nn.Module, args, output: Tensor) -> Tensor:
    """Forward hook of the patch embedding: its output into the trace as tokens [B, h*w, C] (a bare convolution's
    output [B, C, h, w] flattened); the model goes on with a copy laid out as the module gave it, so that a position
    embedding added to it in place (NaFlexVit's) leaves the kept tensor as the patch embedding made it, and the
    relevance of the kept tokens is read where the forward passes."""
    trace.patches = output.flatten(2).transpose(1, 2) if channels_first else output
    copy = trace.patches.clone()
    return copy.transpose(1, 2).unflatten(2, output.shape[2:]) if channels_first else copy


def _keep_output(trace: Trace, index: int, sequence_first: bool, module: nn.Module, args, output) -> Tensor | None:
    """Forward hook of the last block: its output into the trace as the residual after it, batch first (blocks laid
    out [N, B, C] go on with a view of the tokens kept, so that their relevance is read where the forward passes)."""
    if not sequence_first:
        trace.residuals[index] = output[0] if isinstance(output, tuple) else output
        return None
    trace.residuals[index] = output.transpose(0, 1)
    return trace.residuals[index].transpose(0, 1)


def _place(adapter: ModelAdapter, rules: RuleSet, trace: Trace, patch: ModelPatch, pixels: bool) -> None:
    """Put the rule set's module rules on the model's modules (and the description's Linear views), from its family
    description."""
    family = adapter.family
    embedding = family.embedding()
    projections = {id(linear) for parts in family.blocks for linear in parts.attention.projections}
    if family.probe is not None:
        projections |= {id(linear) for linear in family.probe.attention.projections}
    activations = {id(activation) for activation in _activations(family)}
    places = _linear_places(family)
    forward, views = family.lrp_forward() or (None, ())
    if forward is not None:  # the family's forward (not the model's) computes through the views
        patch.set_attribute(family, "forward", forward)
    for module in _ruled_modules(adapter, views):
        if module is embedding.convolution:  # the patch projection (a Linear in NaFlexVit): the pixels' rule, or none
            continue
        if isinstance(module, nn.Linear):
            rule = rules.linear_rule(*places.get(id(module), ("head", None)))
            rule.place(module, patch, renormalise_input=id(module) not in projections)
        elif isinstance(module, r.norm_types()):
            rules.norm().place(module, patch)
        elif id(module) in activations:
            rules.activation().place(module, patch)
        elif isinstance(module, nn.Dropout) and module is not embedding.position_module and rules.dropout is not None:
            rules.dropout().place(module, patch)
    if rules.dropout is not None:  # after the modules' own rules, as a dropout follows them
        for module in family.missing_dropouts():
            patch.hook(module.register_forward_hook(
                lambda module, args, output: r.absolute_passthrough(output) if r.rules_apply() else None))
        for head in family.head_without_dropout():
            patch.hook(head.register_forward_pre_hook(lambda module, args: (r.absolute_passthrough(args[0]),)))
    if pixels and embedding.convolution is not None:  # first: the patch embedding may be the convolution itself
        trace.pixel_rule = rules.pixels()
        trace.pixel_rule.place(embedding.convolution, patch)
    patch.hook(embedding.patch_embedding.register_forward_hook(functools.partial(
        _keep_patches, trace, embedding.channels_first)))
    if rules.position is not None and embedding.position_module is not None:
        prefix = adapter.num_prefix_tokens
        if getattr(rules.position, "renormalises_input", True):  # the absolute rule's (abslrp), not PA-LRP's reading
            patch.hook(embedding.position_module.register_forward_pre_hook(
                lambda module, args: (r.normalise_relevance(args[0]),)))
        patch.hook(embedding.position_module.register_forward_hook(
            lambda module, args, output: rules.position(output, trace.patches, prefix)))
    last = family.blocks[-1].module
    patch.hook(last.register_forward_hook(functools.partial(_keep_output, trace, len(family.blocks),
                                                            family.sequence_first)))


@contextlib.contextmanager
def lrp_rules(adapter: ModelAdapter, rules: str | RuleSet = "chefer", *, pixels: bool = True,
              gradient_from: int | None = None, recompute: bool = True) -> Iterator[Trace]:
    """Within the block, the model's backward propagates relevance under ``rules``; yields the :class:`Trace`.

    Forward values are unchanged (up to rounding in the attention, which is computed unfused). The model
    comes back exactly as it was — hooks removed, patched ``forward`` methods restored — also when an
    exception is raised inside. The backward must run within the block too: with ``recompute`` (the default)
    each block's forward is computed again there, under the rules (:meth:`RuleArithmetic.recomputing`): memory
    that does not grow with blocks × tokens², for one more forward of the blocks, in the relevance's backward (a
    plain backward beside it reads the plain graph the forward keeps for it); without it the forward keeps every
    block's graph. ``pixels=False`` leaves the patch convolution's rule out (for callers
    that do not read the pixels' relevance). ``gradient_from``: blocks below this index run plainly
    without gradients and this block's input starts the graph (the backward stops there; the trace
    holds the attention and residuals from there on).
    """
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"lrp_rules takes a ModelAdapter (vitexplain.adapter_for(model)), got {type(adapter).__name__}")
    rules = resolve_rules(rules)
    _check_covered(adapter)
    trace = Trace()
    sink = TraceSink(trace, gradient_from or 0, recompute)
    arithmetic = RuleArithmetic(rules, recompute)
    try:
        with adapter.call(reads_target=False), \
                adapter.instrumented(arithmetic=arithmetic, sink=sink, gradient_from=gradient_from) as patch:
            _place(adapter, rules, trace, patch, pixels)
            yield trace
    finally:
        arithmetic.placed = False
