"""The adapter: everything vitexplain does to a model, done through the model's family description.

:class:`ModelAdapter` reads a :class:`~vitexplain.instrumentation.families.base.Family` and offers the
methods what they need: model facts, plain forwards, an instrumented forward that records what a
method asks for (:meth:`ModelAdapter.record`), forwards on token subsets (TIS), and the context in
which LRP rules run (:meth:`ModelAdapter.instrumented`). Every change to the model happens inside a
context manager that undoes it (hooks removed, ``forward`` methods and train / eval flags restored),
also when an exception is raised.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .attention import NOTHING, PLAIN, Arithmetic, Sink, attend
from .blocks import BlockParts, block_forward, recomputed_block_forward
from .families import ForwardOnly
from .families.base import Family, ProbeParts, UnsupportedModelError, check_images
from .geometry import Readout, TokenGeometry
from .inputs import TokenBatch
from .patching import ModelPatch
from .precision import caller_precision, float32_scope
from .recording import (
    BLOCK_FIELDS,
    HEAD_FIELDS,
    BlockRecord,
    Recorder,
    Recording,
)
from .targets import Target, TargetLike, resolve_target
from .windows import WindowLayout, stage_grids

#: block index under which an attention-pooling head hands its attention to a sink
READOUT = -1


#: the flags by which timm (``set_grad_checkpointing``) and transformers (``gradient_checkpointing_enable``) make
#: a module recompute its forward in the backward
CHECKPOINTING_FLAGS = ("grad_checkpointing", "gradient_checkpointing")


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Put every module in eval mode with gradient checkpointing off, and give each its own flags back afterwards.

    Checkpointing runs a forward again in the backward, where the recording (and LRP's rules) would meet it a
    second time; it only trades memory for time, so the values are the same without it.
    """
    flags = [(module, module.training) for module in model.modules()]
    with ModelPatch() as patch:
        for module in model.modules():
            for name in CHECKPOINTING_FLAGS:
                if getattr(module, name, None) is True:
                    patch.set_attribute(module, name, False)
        model.eval()
        try:
            yield
        finally:
            for module, training in flags:
                module.training = training


@dataclasses.dataclass(frozen=True)
class LayerScores:
    """The target scored at the outputs of some blocks, read through the model's head (``Family.head``),
    instead of at the model's output: what the model would score if it ended at each of those blocks.

    Every block from the lowest gradient asked for on starts its own gradient graph at its input, so the
    one backward of the layer scores' sum leaves in each block the gradient of the score read at its own
    output only (∂s_l/∂A_l for every l at the cost of one backward; a block whose output is not scored gets
    zero gradients).

    Attributes:
        blocks: the blocks whose outputs are scored (negative indices count from the end).
        mean_token: the head reads a sequence whose every token is the mean of the block's tokens (prefix
            included), so that any readout weighting the tokens reads their mean, rather than the tokens.
        final_norm: the model's final norm comes before the head (False: the head reads the tokens as they are).
    """

    blocks: Collection[int]
    mean_token: bool = False
    final_norm: bool = True


@dataclasses.dataclass
class _State:
    """How the instrumented blocks compute during one ``with adapter.instrumented(...)``."""

    arithmetic: Arithmetic
    sink: Sink
    positions: Tensor | None
    gradient_from: int | None
    detach_attention_input: bool
    separate_graphs: bool


def _instrumented_block(parts: BlockParts, index: int, state: _State, *args: Any, **kwargs: Any) -> Any:
    """A block's ``forward`` while instrumented: the written-out block on the family's call arguments."""
    x, extra = parts.inputs(*args, **kwargs)
    if state.positions is not None:
        extra.positions = state.positions
    below = state.gradient_from is not None and index < state.gradient_from
    with torch.set_grad_enabled(torch.is_grad_enabled() and not below):
        starts = (state.separate_graphs and state.gradient_from is not None and not below) or (
            index == state.gradient_from and not x.requires_grad)
        if starts and torch.is_grad_enabled():
            x = x.detach().requires_grad_(True)  # frozen weights, a cut below, or the block's own graph
        context = state.arithmetic.recomputing() if torch.is_grad_enabled() else None
        if context is None:
            out = block_forward(parts, x, extra, index=index, arithmetic=state.arithmetic, sink=state.sink,
                                detach_attention_input=state.detach_attention_input)
        else:  # under LRP rules: the block computed again in the backward (Arithmetic.recomputing)
            out = recomputed_block_forward(parts, x, extra, index=index, sink=state.sink, context=context)
    returned = parts.output(out, args[0] if args else next(iter(kwargs.values())))
    if state.sink.wants(index, "output"):
        state.sink.put(index, output=returned)
    return returned


def _instrumented_probe(parts: ProbeParts, state: _State, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """An attention-pooling head's ``forward`` while instrumented, its attention handed to the sink."""
    if parts.position is not None:
        x = state.arithmetic.offset(x, parts.position().to(x.dtype))
    out = attend(parts.attention, x, arithmetic=state.arithmetic, sink=state.sink, block=READOUT)
    if parts.mlp is not None:
        out = state.arithmetic.add(out, parts.mlp(parts.norm(out)))
    if parts.pool == "avg":
        return out.mean(1)
    return out[:, 0] if parts.pool == "token" else out


def _hand_over_selection(sink: Sink, selection: Tensor) -> None:
    """A max-pooling head's selection of the tokens (``Family.observe_pooling``) to ``sink``, if it wants it."""
    if sink.wants(READOUT, "selection"):
        sink.put(READOUT, selection=selection)


class ModelAdapter:
    """Instruments one model through its family description (see the module docstring).

    Methods receive an adapter and read :class:`~vitexplain.instrumentation.recording.Recording`
    objects; they never touch a model directly. Inputs are image tensors [B, C, H, W] for vision
    families and :class:`~vitexplain.instrumentation.inputs.TokenBatch` for text families.
    """

    def __init__(self, family: Family, *, model: nn.Module | None = None, preprocessing: nn.Module | None = None):
        """``model``: the module the user gave (``family.model``, the described one, by default), whose
        modes and precision the adapter keeps; ``preprocessing``: modules run on the inputs before
        ``family.model`` (the modules of an ``nn.Sequential`` before it)."""
        self.family = family
        self.model = family.model if model is None else model
        self.preprocessing = preprocessing

    # -- model facts ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.family.name

    @property
    def modality(self) -> str:
        return self.family.modality

    @property
    def num_blocks(self) -> int:
        return len(self.family.blocks)

    @property
    def num_heads(self) -> int:
        return self.family.blocks[0].attention.num_heads

    @property
    def num_prefix_tokens(self) -> int:
        return self.family.num_prefix_tokens

    @property
    def class_token_index(self) -> int | None:
        return self.family.class_token_index

    @property
    def readout(self) -> str:
        """How the output reads the last tokens: ``token``, ``avg``, ``token_avg``, ``avgmax``, ``max`` or ``map``."""
        return self.family.readout

    @property
    def patch_size(self) -> tuple[int, int]:
        return self.family.patch_size

    def grid_size(self, inputs: Any) -> tuple[int, ...]:
        """Patch grid (h, w) of a batch of images (as the described model sees them), or (T,) for a batch of
        T-token sequences."""
        return self.family.grid_size(inputs if self.preprocessing is None else self._as_seen(inputs))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def require_class_token(self, method: str) -> int:
        """The class token's position; refuses models without one, naming ``method``."""
        if self.class_token_index is None:
            raise UnsupportedModelError(
                f"{method} explains through the class token, but this {type(self.family.model).__name__} has none "
                f"(its head reads the tokens by {self.readout!r} pooling)")
        return self.class_token_index

    def require_readout(self, method: str, kinds: Collection[str]) -> str:
        """The readout kind, when ``method`` has a reading for it (see docs/decisions/readouts.md)."""
        if self.readout not in kinds:
            raise UnsupportedModelError(
                f"{method} has no reading for a head that reads the tokens by {self.readout!r} pooling "
                f"(it reads {', '.join(map(repr, kinds))}); see docs/decisions/readouts.md")
        return self.readout

    def require(self, reads: str, method: str) -> None:
        """Refuses, naming ``method``, a model of which ``reads`` (see :data:`~vitexplain.registry.READS`) cannot be
        read: anything beyond the outputs of a model described by its forward alone."""
        if reads != "output" and isinstance(self.family, ForwardOnly):
            raise UnsupportedModelError(f"method {method!r} reads {reads}; {self.family.unreachable}")

    def require_head_shares(self, method: str, blocks: Collection[int]) -> None:
        """Refuses, naming ``method`` and the one cause, a model in whose ``blocks`` the heads' shares of the
        attention branch cannot be read (``head_projection``)."""
        for index in blocks:
            reason = self.family.blocks[index].heads_reason()
            if reason is not None:
                raise UnsupportedModelError(f"{method} reads each head's share of the attention branch, but in block "
                                            f"{index % self.num_blocks} of this {type(self.family.model).__name__} "
                                            f"{reason}")

    def require_token_subsets(self, method: str) -> None:
        """Refuses, naming ``method``, a model that cannot run on token subsets (and why)."""
        reason = self.family.token_subsets_reason()
        if reason is not None:
            raise UnsupportedModelError(f"{method} runs the model on token subsets, but {reason}")

    # -- inputs and plain forwards ----------------------------------------------------------------
    def check_inputs(self, inputs: Any) -> Any:
        """What the user passed, checked and moved to the model's device (and, for images, dtype); with
        preprocessing, images are checked as the described model sees them (preprocessed)."""
        if self.preprocessing is None:
            checked = self.family.check_inputs(inputs)
        else:
            checked = check_images(inputs, grid_size=lambda images: None)
            self.family.check_inputs(self._as_seen(checked))
        if isinstance(checked, TokenBatch):
            return checked.to(self.device)
        return checked.to(device=self.device, dtype=self.dtype)

    def preprocessed(self, inputs: Any) -> Any:
        """``inputs`` as the described model takes them: through the preprocessing, if any."""
        return inputs if self.preprocessing is None else self.preprocessing(inputs)

    def _as_seen(self, images: Tensor) -> Tensor:
        """``images`` preprocessed without gradients, in eval mode: what the described model would check."""
        with torch.no_grad(), evaluation_mode(self.model):
            return self.preprocessed(images.to(device=self.device, dtype=self.dtype))

    def check_images(self, images: Any) -> Tensor:
        if self.modality != "image":
            raise TypeError(f"{type(self.family.model).__name__} explains tokenised text, not images")
        return self.check_inputs(images)

    def forward(self, inputs: Any) -> Tensor:
        """Outputs [B, classes] (or [B, D]) of a plain forward on checked inputs (current mode and grad setting),
        the preprocessing first."""
        return self.family.forward(self.preprocessed(inputs))

    def logits(self, inputs: Any) -> Tensor:
        """Float32 outputs of a plain batched forward in eval mode, no gradients.

        A forward that only scores inputs: within an explanation it runs in the caller's precision
        (autocast, TF32, low-precision weights; see :mod:`.precision`)."""
        with torch.no_grad(), evaluation_mode(self.model), caller_precision():
            return self.forward(self.check_inputs(inputs)).float()

    @contextlib.contextmanager
    def differentiable_forward(self) -> Iterator[Callable[[Tensor], Tensor]]:
        """Yield ``inputs -> outputs`` with gradients enabled and the model in eval mode (restored on exit),
        in float32. For methods that drive their own backward passes (e.g. through Captum)."""
        with float32_scope(self.model), evaluation_mode(self.model), torch.enable_grad():
            yield self.forward

    def target(self, inputs: Any, target: TargetLike) -> Target:
        """``target`` resolved for ``inputs`` (the prediction when None), from a plain float32 forward."""
        if isinstance(target, Target):
            return target
        with float32_scope(self.model), torch.no_grad(), evaluation_mode(self.model):
            outputs = self.forward(self.check_inputs(inputs))
        return resolve_target(target, outputs, has_classes=self.family.has_classes)

    # -- instrumented forwards --------------------------------------------------------------------
    @contextlib.contextmanager
    def instrumented(self, *, arithmetic: Arithmetic = PLAIN, sink: Sink = NOTHING, positions: Tensor | None = None,
                     gradient_from: int | None = None, detach_attention_input: bool = False,
                     separate_graphs: bool = False) -> Iterator[ModelPatch]:
        """Within the block, every Transformer block (and an attention-pooling head) computes through the
        written-out forward of :mod:`.blocks`, with ``arithmetic`` and handing what it computes to
        ``sink``; yields the :class:`ModelPatch` holding the changes, for further ones (LRP rules).

        Args:
            positions: the tokens are a subset: their sequence positions [B, N'] (prefix included).
            gradient_from: blocks below this index run without gradients and this block's input starts
                the graph (so a backward stops there); None: as the surrounding mode says.
            detach_attention_input: every attention reads a detached copy of its input.
            separate_graphs: every block from ``gradient_from`` on starts its own graph at its input, so a
                backward from a block's output reaches that block only.

        A block hands its output, as it returns it, to ``sink`` as ``output`` when the sink wants it.
        """
        state = _State(arithmetic, sink, positions, gradient_from, detach_attention_input, separate_graphs)
        with ModelPatch() as patch:
            for index, parts in enumerate(self.family.blocks):
                patch.replace_forward(parts.module, functools.partial(_instrumented_block, parts, index, state))
            if self.family.probe is not None:
                patch.replace_forward(self.family.probe.module,
                                      functools.partial(_instrumented_probe, self.family.probe, state))
            self.family.observe_pooling(patch, functools.partial(_hand_over_selection, sink))
            yield patch

    def record(
        self,
        inputs: Any,
        target: TargetLike = None,
        *,
        fields: Collection[str] | Mapping[str, Collection[int] | None] | None = None,
        blocks: Collection[int] | None = None,
        grads: Collection[str] | Mapping[str, Collection[int] | None] = (),
        score: str | Callable[[Tensor, Tensor], Tensor] = "logit",
        stop_gradient: Sequence[str] = (),
        reduce: Callable[[Recording, BlockRecord], Any] | None = None,
        layer_scores: LayerScores | None = None,
    ) -> Recording:
        """One instrumented forward over a batch and, if ``grads`` names any field, one backward.

        Only what is asked is kept, and the backward runs only as deep as the lowest gradient asked for.

        Args:
            inputs: preprocessed images [B, C, H, W], or tokenised text for text families.
            target: what to explain (see :mod:`.targets`): None (each input's predicted class), classes, an
                embedding direction or a score function of the output.
            fields: names from :data:`~vitexplain.instrumentation.recording.BLOCK_FIELDS` to keep (None: all),
                or a mapping from names to the blocks each is kept in (None: ``blocks``).
            blocks: the blocks whose fields are kept (None: all; negative indices count from the end).
            grads: fields whose gradient is wanted — names (every block) or a mapping from names to the
                blocks they are wanted in — and/or ``"input"``, the gradient with respect to the images.
                ``"probe_attn"`` (:data:`~vitexplain.instrumentation.recording.HEAD_FIELDS`), the attention of
                an attention-pooling head reading a block's output, is there for ``layer_scores`` only.
            score: what is differentiated for class targets: ``"logit"``, ``"probability"``,
                ``"log_probability"`` or a callable (logits, classes) -> [B]. Inputs are independent, so
                the sum over the batch gives each input its own gradient.
            stop_gradient: ``("attn_input",)`` makes every attention read a detached input, so the backward
                does not flow through attention into lower blocks (as Leem & Seo's AG-CAM model does).
            reduce: ``(recording, block) -> value``: the attention fields asked for (``attn_logits``, ``attn``,
                values or gradients) are then not kept but handed, block by block as the backward passes
                each block's attention, to ``reduce``, whose value is kept as ``block.reduced``. Its
                ``block`` holds them beside the block's other fields; ``recording`` has everything but the
                gradients. Only a reduction's size is kept of each block's attention (no N×N matrix is
                kept from the forward either), and the backward runs even if no gradient is asked.
            layer_scores: differentiate the target scored at some blocks' outputs through the model's head
                (:class:`LayerScores`, each block's gradients those of its own score) instead of at the
                model's output; ``scores`` stays the output's.
        """
        if set(stop_gradient) - {"attn_input"}:
            raise ValueError(f"stop_gradient supports only 'attn_input', got {sorted(stop_gradient)}")
        if isinstance(self.family, ForwardOnly):
            raise UnsupportedModelError(f"record reads the model's blocks; {self.family.unreachable}")
        wanted = dict(grads) if isinstance(grads, Mapping) else {name: None for name in grads}
        input_grad = wanted.pop("input", False) is not False
        for name in set(wanted) | set(fields or ()):
            if name not in BLOCK_FIELDS + HEAD_FIELDS:
                raise ValueError(f"cannot record {name!r}; choose from {list(BLOCK_FIELDS + HEAD_FIELDS) + ['input']}")
        self._check_layer_scores(layer_scores, set(wanted) | set(fields or ()), input_grad)
        with float32_scope(self.model):  # internals and gradients are read in float32 (precision.py)
            inputs = self.check_inputs(inputs)
            if input_grad and not isinstance(inputs, Tensor):
                raise ValueError("'input' gradients are taken with respect to images; token ids have none "
                                 "(ask for 'residual': block 0's residual holds the embeddings)")
            anchor = None if reduce is None else torch.zeros((), device=self.device, requires_grad=True)
            recorder = Recorder(self.num_blocks, fields, blocks, wanted, anchor)
            scored = sorted({block % self.num_blocks for block in layer_scores.blocks}) if layer_scores else []
            backward = bool(wanted) or input_grad or bool(recorder.reduced_blocks)
            lowest = [block for block in (recorder.first_gradient_block, *scored[:1]) if block is not None]
            gradient_from = 0 if input_grad else min(lowest, default=None)
            sink = _RecordingSink(recorder, scored)
            with evaluation_mode(self.model), torch.set_grad_enabled(backward), \
                    self.instrumented(sink=sink, gradient_from=gradient_from,
                                      detach_attention_input="attn_input" in stop_gradient,
                                      separate_graphs=bool(scored)):
                if input_grad:
                    inputs = inputs.detach().requires_grad_(True)
                outputs = self.forward(inputs)
                resolved = resolve_target(target, outputs.detach(), has_classes=self.family.has_classes)
                scores = resolved.score(outputs, score)
                differentiated = scores if layer_scores is None else self._layer_scores(sink, layer_scores, resolved,
                                                                                        score)
                recording = self._recording(recorder, inputs, outputs, resolved, scores)
                if backward:
                    self._backward(differentiated, recorder, recording, reduce, inputs if input_grad else None)
            return recording

    def _recording(self, recorder: Recorder, inputs: Any, outputs: Tensor, resolved: Target,
                   scores: Tensor) -> Recording:
        """What the forward left in ``recorder``, as a :class:`Recording` (gradients to come)."""
        records = []
        for index, (entry, layout) in enumerate(zip(recorder.entries, recorder.layouts)):
            parts = self.family.blocks[index]
            values = recorder.laid_out(index, {name: tensor.detach() for name, tensor in entry.items()})
            projection = parts.head_projection() if "v" in values else None
            records.append(BlockRecord(**values, head_projection=projection, layout=parts.layout, windows=layout,
                                       index=index))
        return Recording(
            logits=outputs.detach(), targets=resolved.labels(outputs.shape[0], outputs.device), scores=scores.detach(),
            blocks=records, target=resolved,
            geometry=self.token_geometry(inputs, recorder.layouts, recorder.tokens[-1], recorder.readout_attn,
                                          recorder.readout_selection))

    def _check_layer_scores(self, layer_scores: LayerScores | None, names: set[str], input_grad: bool) -> None:
        """Refuse what layer scores cannot give, and head fields without them."""
        if layer_scores is None:
            if names & set(HEAD_FIELDS):
                raise ValueError(f"{sorted(names & set(HEAD_FIELDS))} are recorded when the head reads blocks' "
                                 "outputs: pass layer_scores")
            return
        if "probe_attn" in names and self.family.probe is None:
            raise ValueError(f"'probe_attn' needs an attention-pooling head; this model's head reads the tokens by "
                             f"{self.readout!r} pooling")
        if input_grad:
            raise ValueError("layer scores cut the graph at every block, "
                             "so they have no gradient with respect to the images")
        if not layer_scores.blocks:
            raise ValueError("layer_scores names no block")

    def _layer_scores(self, sink: _RecordingSink, layer_scores: LayerScores, target: Target, score: Any) -> Tensor:
        """The target's score read at each scored block's output through the head, summed over the blocks -> [B]
        (the head's probe attention goes to the block it reads)."""
        last = sink.recorder.tokens[-1]
        total = 0
        for block, output in sink.outputs.items():
            if sink.recorder.tokens[block] != last:
                raise UnsupportedModelError(
                    f"block {block} has {sink.recorder.tokens[block]} tokens, the last block {last} (a patch merge "
                    "comes between), so the model's head cannot read its output; read blocks of the last stage only")
            if layer_scores.mean_token:
                tokens = output.transpose(0, 1) if self.family.sequence_first else output
                mean = tokens.flatten(1, -2).mean(1)
                tokens = mean.reshape(mean.shape[0], *(1,) * (tokens.ndim - 2), mean.shape[-1]).expand_as(tokens)
                output = tokens.transpose(0, 1) if self.family.sequence_first else tokens
            sink.reading = block
            total = total + target.score(self.family.head(output, final_norm=layer_scores.final_norm), score)
        sink.reading = None
        return total

    @staticmethod
    def _backward(scores: Tensor, recorder: Recorder, recording: Recording,
                  reduce: Callable[[Recording, BlockRecord], Any] | None, images: Tensor | None) -> None:
        """The backward of the summed scores: the gradients asked for into ``recording`` (each block's
        ``grads``, ``input_grad``), and ``reduce``'s value of each reduced block's attention as it passes."""
        def reduce_block(index: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
            block = recording.blocks[index]
            block.reduced = reduce(recording, dataclasses.replace(block, **tensors, grads=gradients))

        recorder.reduce = reduce_block
        inputs = recorder.gradient_inputs()
        tensors = [tensor for _, _, tensor in inputs] + ([images] if images is not None else [])
        anchors = [recorder.anchor_leaf] if recorder.reduced_blocks else []
        found = torch.autograd.grad(scores.sum(), tensors + anchors, allow_unused=True)
        found = [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, found)]
        if images is not None:
            recording.input_grad = found.pop()
        by_block: dict[int, dict[str, Tensor]] = {}
        for (block, name, _), gradient in zip(inputs, found):
            by_block.setdefault(block, {})[name] = gradient
        for block, gradients in by_block.items():
            recording.blocks[block].grads = recorder.laid_out(block, gradients)

    def token_geometry(self, inputs: Any, layouts: Sequence[WindowLayout | None], last_tokens: int,
                       probe_attn: Tensor | None = None, selection: Tensor | None = None) -> TokenGeometry:
        """Where the tokens of one instrumented forward of ``inputs`` sit (:class:`TokenGeometry`): the
        family's grid, prefix and class token, the readout of the last block's ``last_tokens`` tokens (an
        attention-pooling head's attention ``probe_attn`` or a max-pooling head's ``selection`` from
        the same forward), each block's window
        ``layouts`` and the stages they give; for text, the token mask."""
        grid = self.grid_size(inputs)
        return TokenGeometry(
            grid=grid, num_prefix_tokens=self.num_prefix_tokens, class_token_index=self.class_token_index,
            readout=self.readout_weights(last_tokens, inputs.shape[0], probe_attn, selection),
            stages=stage_grids(layouts, grid),
            layouts=list(layouts), token_mask=inputs.attention_mask if isinstance(inputs, TokenBatch) else None)

    def readout_weights(self, tokens: int, batch: int, probe_attn: Tensor | None = None,
                        selection: Tensor | None = None) -> Readout:
        """What the output takes from each of the last block's ``tokens`` tokens (see :class:`Readout`);
        ``probe_attn`` is an attention-pooling head's attention [B, H, latents, N'] from the same forward,
        ``selection`` a max-pooling head's selection of the tokens it pools [B, N'] (``Family.observe_pooling``)."""
        kind = self.readout
        if kind == "map":
            attn = probe_attn.detach()
            weights = attn.mean(1)[:, 0]
            if weights.shape[-1] < tokens:  # the head read the patch tokens only
                weights = torch.nn.functional.pad(weights, (tokens - weights.shape[-1], 0))
            return Readout(kind, weights.float())
        weights = torch.zeros(batch, tokens, device=self.device)
        if kind == "token":
            weights[:, self.class_token_index] = 1
        elif kind == "token_avg":  # a head on the class token concatenated with the patch tokens' mean: half each
            weights[:, self.class_token_index] = 1 / 2
            weights[:, self.num_prefix_tokens:] = 1 / (2 * (tokens - self.num_prefix_tokens))
        else:
            first = 0 if getattr(self.family, "readout_includes_prefix", False) else self.num_prefix_tokens
            weights[:, first:] = 1 / (tokens - first)
            if kind == "avgmax":  # half the mean, half the maximum (its selection averaged over the channels)
                weights[:, first:] = (weights[:, first:] + selection.to(weights)) / 2
            elif kind == "max":
                weights[:, first:] = selection.to(weights)
        return Readout(kind, weights)

    def logits_on_tokens(self, inputs: Any, keep: Tensor, *, batch_size: int = 256) -> Tensor:
        """Outputs when only some patch tokens of each image enter the encoder.

        Prefix tokens are always kept. Tokens are dropped after the position embedding, so the kept
        ones keep their positions (the token-sampling forward of TIS, Englebert et al. 2023, Eq. 4);
        position-dependent parts of the attention (RoPE, relative position bias) follow the kept tokens.

        Args:
            inputs: images [B, C, H, W] (or what :meth:`check_inputs` takes).
            keep: patch indices to keep, [B, M, K] (M token subsets of K patches per image).
            batch_size: sequences run through the encoder at once; bounds memory independently of M.

        Returns:
            outputs [B, M, classes].
        """
        self.require_token_subsets("logits_on_tokens")
        inputs = self.check_inputs(inputs)
        batch = inputs.shape[0]
        if keep.ndim != 3 or keep.shape[0] != batch:
            raise ValueError(f"keep must be [B, M, K] patch indices with B={batch}, got {tuple(keep.shape)}")
        prefix = self.num_prefix_tokens
        with torch.no_grad(), evaluation_mode(self.model), caller_precision():
            inputs = self.check_inputs(inputs)  # in the model's own dtype
            tokens, context = self.family.embed(self.preprocessed(inputs))
            num_patches = tokens.shape[1] - prefix
            if keep.numel() and (keep.min() < 0 or keep.max() >= num_patches):
                raise ValueError(f"keep holds patch indices outside 0..{num_patches - 1}")
            b, m, k = keep.shape
            image_of = torch.arange(b, device=tokens.device).repeat_interleave(m)
            positions = torch.cat([torch.arange(prefix, device=tokens.device).expand(b * m, prefix),
                                   keep.to(tokens.device).reshape(b * m, k) + prefix], dim=1)
            outputs = []
            for start in range(0, b * m, batch_size):
                rows, where = image_of[start:start + batch_size], positions[start:start + batch_size]
                with self.instrumented(positions=where):
                    outputs.append(self.family.encode(tokens[rows[:, None], where],
                                                      context.select(rows, where, prefix)))
        return torch.cat(outputs).float().reshape(b, m, -1)


class _RecordingSink(Sink):
    """Routes a forward's tensors to a :class:`Recorder`, the pooling head's attention to its readout slot (or,
    while the head reads a scored block's output, to that block's ``probe_attn``), and keeps the outputs of
    the scored blocks."""

    def __init__(self, recorder: Recorder, scored: Collection[int] = ()):
        self.recorder = recorder
        self.scored = set(scored)
        #: each scored block's output, as the block returns it (in the graph)
        self.outputs: dict[int, Tensor] = {}
        #: the block whose output the head is reading, None while the model runs
        self.reading: int | None = None

    def wants(self, block: int, name: str) -> bool:
        if block == READOUT:
            return name in ("attn", "selection")
        if name == "output":
            return block in self.scored
        return self.recorder.wants(block, name)

    def wants_gradient(self, block: int, name: str) -> bool:
        return block != READOUT and self.recorder.wants_gradient(block, name)

    def anchor(self, block: int) -> Tensor | None:
        return None if block == READOUT else self.recorder.anchor(block)

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == READOUT and self.reading is not None:  # the head reading a scored block's output
            if "attn" in tensors:
                self.recorder.put(self.reading, probe_attn=tensors["attn"])
        elif block == READOUT:
            self.recorder.readout_attn = tensors.get("attn", self.recorder.readout_attn)
            self.recorder.readout_selection = tensors.get("selection", self.recorder.readout_selection)
        elif "output" in tensors:
            self.outputs[block] = tensors["output"]
        else:
            self.recorder.put(block, **tensors)

    def put_backward(self, block: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        self.recorder.put_backward(block, tensors, gradients)

    def layout(self, block: int, layout) -> None:
        self.recorder.layout(block, layout)
