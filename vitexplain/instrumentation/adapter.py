"""The adapter: everything vitexplain does to a model, done through the model's family description.

:class:`ModelAdapter` reads a :class:`~vitexplain.instrumentation.families.base.Family` once and offers the
methods what they need, one way: the model's facts (its attributes), calls on the model whose checks are made
once (:meth:`ModelAdapter.call` yields a :class:`Call`, the adapter as what runs within the call receives it and
passes it on: its inputs checked, its float32 scope), plain forwards, an instrumented forward that records what a
method asks for (:meth:`ModelAdapter.record`), forwards on token subsets (TIS), and the context in which LRP rules run
(:meth:`ModelAdapter.instrumented`). Every change to the model happens inside a context manager that undoes it
(hooks removed, ``forward`` methods and train / eval flags restored), also when an exception is raised.
"""
from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor, nn

from .blocks import BlockParts
from .families import ForwardOnly
from .families.base import Family, ProbeParts, UnsupportedModelError
from .instrumented import instrumented_forward
from .layer_scores import LayerScores
from .modes import CHECKPOINTING_FLAGS, evaluation_mode
from .patching import ModelPatch
from .positions import token_geometry
from .precision import Scope, caller_precision, float32_scope
from .received import as_seen, checked, placed
from .recording import BlockRecord, Recorder, Recording
from .representation import classifier_input
from .requests import requested
from .targets import Target, TargetLike, refuse_classes, resolve_target
from .token_subsets import subset_outputs

__all__ = ["CHECKPOINTING_FLAGS", "Call", "ModelAdapter", "evaluation_mode"]


class ModelAdapter:
    """Instruments one model through its family description (see the module docstring).

    Methods receive an adapter and read :class:`~vitexplain.instrumentation.recording.Recording`
    objects; they never touch a model directly, nor its family description. Inputs are image tensors
    [B, C, H, W] for vision families and :class:`~vitexplain.instrumentation.inputs.TokenBatch` for text families.
    """

    def __init__(self, family: Family, *, model: nn.Module | None = None, preprocessing: nn.Module | None = None):
        """``model``: the module the user gave (``family.model``, the described one, by default), whose
        modes and precision the adapter keeps; ``preprocessing``: modules run on the inputs before
        ``family.model`` (the modules of an ``nn.Sequential`` before it)."""
        self.family = family
        self.model = family.model if model is None else model
        self.preprocessing = preprocessing
        # what methods read of the model, from its description
        self.modality: str = family.modality
        #: where each Transformer block keeps its parts, first to last
        self.blocks: Sequence[BlockParts] = family.blocks
        self.num_blocks = len(family.blocks)
        #: the attention-pooling head (readout ``map``), or None
        self.probe: ProbeParts | None = family.probe
        self.num_prefix_tokens: int = family.num_prefix_tokens
        self.class_token_index: int | None = family.class_token_index
        #: how the output reads the last tokens: ``token``, ``avg``, ``token_avg``, ``avgmax``, ``max`` or ``map``
        self.readout: str = family.readout
        #: None when the outputs are class logits, else why they are not
        self.head_reason: str | None = family.head_reason
        #: ``head(tokens, final_norm=True)``: the outputs the model computes from a block's output (``Family.head``)
        self.head: Callable[..., Tensor] = family.head
        #: the blocks take and return tokens sequence first, [N, B, C]
        self.sequence_first: bool = family.sequence_first
        #: the described model's class, by name, as refusals name it
        self.model_name = type(family.model).__name__

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def grid_size(self, inputs: Any) -> tuple[int, ...]:
        """Patch grid (h, w) of a batch of images (as the described model sees them), or (T,) for a batch of
        T-token sequences."""
        seen = inputs if self.preprocessing is None else as_seen(self.preprocessing, self.model, inputs)
        return self.family.grid_size(seen)

    # -- refusals ---------------------------------------------------------------------------------
    def require(self, reads: str, method: str) -> None:
        """Refuses, naming ``method``, a model of which ``reads`` (see :data:`~vitexplain.registry.READS`) cannot be
        read: anything beyond the outputs of a model described by its forward alone."""
        if reads != "output" and isinstance(self.family, ForwardOnly):
            raise UnsupportedModelError(f"method {method!r} reads {reads}; {self.family.unreachable}")

    def require_head_shares(self, method: str, blocks: Collection[int]) -> None:
        """Refuses, naming ``method`` and the one cause, a model in whose ``blocks`` the heads' shares of the
        attention branch cannot be read (``head_projection``)."""
        for index in blocks:
            reason = self.blocks[index].heads_reason()
            if reason is not None:
                raise UnsupportedModelError(f"{method} reads each head's share of the attention branch, but in block "
                                            f"{index % self.num_blocks} of this {self.model_name} {reason}")

    def require_token_subsets(self, method: str) -> None:
        """Refuses, naming ``method``, a model that cannot run on token subsets (and why)."""
        reason = self.family.token_subsets_reason()
        if reason is not None:
            raise UnsupportedModelError(f"{method} runs the model on token subsets, but {reason}")

    # -- calls and their inputs -------------------------------------------------------------------
    #: the float32 scope of the call this is (:class:`Call`); None for an adapter outside any call
    scope: Scope | None = None

    @contextlib.contextmanager
    def call(self, inputs: Any = None, target: TargetLike = None, *, reads_target: bool = True) -> Iterator[Call]:
        """One call on the model (``explain``'s, or a method's own — :meth:`record`, :meth:`target` … — called
        directly), whose checks are made once: yields the :class:`Call`, an adapter within whose block the model
        is seen in float32 (its :attr:`scope`, :mod:`.precision`), a class target (None included) refused when the
        outputs are not classes, and ``inputs`` (if given) checked and on the model (:attr:`Call.inputs`).

        Hand the call, not this adapter, to what runs within it (a method, a protocol's forwards): it trusts what
        this call checked (:meth:`Call.call`). ``reads_target``: False for a call that reads no target (the
        controls, :meth:`differentiable_forward`).
        """
        with float32_scope(self.model) as scope:
            if reads_target:
                refuse_classes(target, self.head_reason)
            yield Call(self, None if inputs is None else self.received(inputs), reads_target, scope)

    def received(self, inputs: Any) -> Any:
        """``inputs`` on the model: checked (:meth:`check_inputs`); a :class:`Call` only moves them."""
        return self.check_inputs(inputs)

    def check_inputs(self, inputs: Any) -> Any:
        """What the user passed, checked and moved to the model's device (and, for images, dtype); with
        preprocessing, images are checked as the described model sees them (preprocessed)."""
        return checked(self.family, self.preprocessing, self.model, inputs)

    def check_images(self, images: Any) -> Tensor:
        """``images`` checked (by a :class:`Call`, trusted) and on the model; refuses a text model."""
        if self.modality != "image":
            raise TypeError(f"{self.model_name} explains tokenised text, not images")
        return self.received(images)

    def preprocessed(self, inputs: Any) -> Any:
        """``inputs`` as the described model takes them: through the preprocessing, if any."""
        return inputs if self.preprocessing is None else self.preprocessing(inputs)

    # -- plain forwards ---------------------------------------------------------------------------
    def forward(self, inputs: Any) -> Tensor:
        """Outputs [B, classes] (or [B, D]) of a plain forward on checked inputs (current mode and grad setting),
        the preprocessing first."""
        return self.family.forward(self.preprocessed(inputs))

    def logits(self, inputs: Any) -> Tensor:
        """Float32 outputs of a plain batched forward in eval mode, no gradients.

        A forward that only scores inputs: within a call it runs in the caller's precision (autocast, TF32,
        low-precision weights; see :mod:`.precision`)."""
        with torch.no_grad(), evaluation_mode(self.model), caller_precision(self.scope):
            return self.forward(self.received(inputs)).float()

    def features(self, inputs: Any) -> Tensor:
        """Float32 [B, D]: the representation the model's classifier reads (the pre-logits), from a plain forward as
        :meth:`logits` computes it; refused in one line where the last linear layer the forward runs does not compute
        the output from a [B, D] input (:func:`~.representation.classifier_input`)."""
        with torch.no_grad(), evaluation_mode(self.model), caller_precision(self.scope):
            return classifier_input(self.model, lambda: self.forward(self.received(inputs)), self.model_name)

    @contextlib.contextmanager
    def differentiable_forward(self) -> Iterator[Callable[[Tensor], Tensor]]:
        """Yield ``inputs -> outputs`` with gradients enabled and the model in eval mode (restored on exit),
        in float32. For methods that drive their own backward passes (e.g. through Captum)."""
        with self.call(reads_target=False), evaluation_mode(self.model), torch.enable_grad():
            yield self.forward

    def target(self, inputs: Any, target: TargetLike) -> Target:
        """``target`` resolved for ``inputs`` (the prediction when None), from a plain float32 forward."""
        if isinstance(target, Target):
            return target
        with self.call(inputs, target) as call, torch.no_grad(), evaluation_mode(self.model):
            outputs = self.forward(call.inputs)
        return resolve_target(target, outputs)

    # -- instrumented forwards --------------------------------------------------------------------
    def instrumented(self, **how: Any) -> ContextManager[ModelPatch]:
        """The model's blocks computed by their written-out forward within the block, as ``how`` (the keyword
        arguments of :func:`~.instrumented.instrumented_forward`) says."""
        return instrumented_forward(self.family, **how)

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
                (:class:`~.layer_scores.LayerScores`, each block's gradients those of its own score) instead of
                at the model's output; ``scores`` stays the output's.
        """
        wanted, input_grad = requested(self.family, fields, grads, stop_gradient, layer_scores)
        with self.call(inputs, target) as call:  # internals and gradients are read in float32 (precision.py)
            inputs = call.inputs
            if input_grad and not isinstance(inputs, Tensor):
                raise ValueError("'input' gradients are taken with respect to images; token ids have none "
                                 "(ask for 'residual': block 0's residual holds the embeddings)")
            anchor = None if reduce is None else torch.zeros((), device=self.device, requires_grad=True)
            scored = sorted({block % self.num_blocks for block in layer_scores.blocks}) if layer_scores else []
            recorder = Recorder(self.num_blocks, fields, blocks, wanted, anchor, scored)
            backward = bool(wanted) or input_grad or bool(recorder.reduced_blocks)
            lowest = [block for block in (recorder.first_gradient_block, *scored[:1]) if block is not None]
            gradient_from = 0 if input_grad else min(lowest, default=None)
            with evaluation_mode(self.model), torch.set_grad_enabled(backward), \
                    self.instrumented(sink=recorder, gradient_from=gradient_from,
                                      detach_attention_input="attn_input" in stop_gradient,
                                      separate_graphs=bool(scored)):
                if input_grad:
                    inputs = inputs.detach().requires_grad_(True)
                outputs = self.forward(inputs)
                resolved = resolve_target(target, outputs.detach())
                scores = resolved.score(outputs, score)
                differentiated = scores if layer_scores is None else layer_scores.scored(
                    recorder, self.head, self.sequence_first, resolved, score)
                geometry = token_geometry(self, inputs, recorder.layouts, recorder.tokens[-1], recorder.readout_attn,
                                          recorder.readout_selection)
                recording = recorder.recording(self.blocks, outputs, resolved, scores, geometry)
                if backward:
                    recorder.backward(differentiated, recording, reduce, inputs if input_grad else None)
            return recording

    def logits_on_tokens(self, inputs: Any, keep: Tensor, *, batch_size: int = 256) -> Tensor:
        """Outputs when only some patch tokens of each image enter the encoder (:mod:`.token_subsets`).

        Args:
            inputs: images [B, C, H, W] (or what :meth:`check_inputs` takes).
            keep: patch indices to keep, [B, M, K] (M token subsets of K patches per image).
            batch_size: sequences run through the encoder at once; bounds memory independently of M.

        Returns:
            outputs [B, M, classes].
        """
        self.require_token_subsets("logits_on_tokens")
        inputs = self.received(inputs)
        batch = inputs.shape[0]
        if keep.ndim != 3 or keep.shape[0] != batch:
            raise ValueError(f"keep must be [B, M, K] patch indices with B={batch}, got {tuple(keep.shape)}")
        with torch.no_grad(), evaluation_mode(self.model), caller_precision(self.scope):  # in the model's own dtype
            outputs = subset_outputs(self.family, self.preprocessed(placed(self.model, inputs)), keep, batch_size)
        return outputs.float().reshape(*keep.shape[:2], -1)


class Call(ModelAdapter):
    """One call on a model (:meth:`ModelAdapter.call`): the adapter as its methods and protocols receive it, and
    pass on, within that call. Its type is the mark that what it receives was checked: its :attr:`inputs`, and
    what is derived from them (masked, noisy, interpolated copies), are only moved to the model
    (:func:`~.received.placed`), never checked again.

    Attributes:
        adapter: the adapter outside any call, whose call this is.
        inputs: the inputs the call took, checked and on the model (None if it took none).
        took_target: whether a target was taken (refused when not a class of a model without classes).
        scope: the float32 scope of the call (:func:`~.precision.float32_scope`), whose record of the caller's
            precision :meth:`logits` and the other scoring forwards run in.
        shared: what the call's user shares across the call's forwards, or None: the protocols' scoring of one
            batch (``evaluation.scoring``) hangs its store of perturbed images' logits here
            (:class:`vitexplain.metrics._perturb.SharedForwards`), the forward the batch's protocols receive.
    """

    def __init__(self, outer: ModelAdapter, inputs: Any, took_target: bool, scope: Scope, shared: Any = None):
        vars(self).update(vars(outer))  # the adapter's facts, as it read them once (and an outer call's fields)
        self.adapter: ModelAdapter = outer.adapter if isinstance(outer, Call) else outer
        self.inputs, self.took_target, self.scope, self.shared = inputs, took_target, scope, shared

    @contextlib.contextmanager
    def call(self, inputs: Any = None, target: TargetLike = None, *, reads_target: bool = True) -> Iterator[Call]:
        """A call within this one (a method's :meth:`record` within ``explain``): it trusts what this one checked,
        its ``inputs`` only moved to the model, in this call's scope; its target is refused only if no outer call
        took one (a control explaining another method, ``degraded``)."""
        if reads_target and not self.took_target:
            refuse_classes(target, self.head_reason)
        yield Call(self, None if inputs is None else self.received(inputs), reads_target or self.took_target,
                   self.scope, self.shared)

    def received(self, inputs: Any) -> Any:
        """``inputs`` on the model, only moved: within a call they are the call's or derived from them."""
        return placed(self.model, inputs)
