"""The adapter: everything vitexplain does to a model, done through the model's family description.

:class:`ModelAdapter` reads a :class:`~vitexplain.instrumentation.families.base.Family` once and offers the
methods what they need, one way: the model's facts (its attributes), calls on the model whose checks are made
once (:meth:`ModelAdapter.call`), plain forwards, an instrumented forward that records what a method asks for
(:meth:`ModelAdapter.record`), forwards on token subsets (TIS), and the context in which LRP rules run
(:meth:`ModelAdapter.instrumented`). Every change to the model happens inside a context manager that undoes it
(hooks removed, ``forward`` methods and train / eval flags restored), also when an exception is raised.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Callable, ContextManager

import torch
from torch import Tensor, nn

from .blocks import BlockParts
from .families import ForwardOnly
from .families.base import Family, ProbeParts, UnsupportedModelError, check_images
from .geometry import TokenGeometry
from .inputs import TokenBatch
from .instrumented import instrumented_forward
from .layer_scores import LayerScores, refuse_layer_scores
from .patching import ModelPatch
from .precision import caller_precision, float32_scope
from .readouts import readout_weights
from .recording import BLOCK_FIELDS, HEAD_FIELDS, BlockRecord, Recorder, Recording
from .targets import Target, TargetLike, refuse_classes, resolve_target
from .token_subsets import subset_outputs
from .windows import WindowLayout, stage_grids

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
class _Call:
    """A call on a model that is running (:meth:`ModelAdapter.call`): whose, and whether it took a target."""

    adapter: ModelAdapter
    took_target: bool


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("vitexplain_call", default=None)


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
        return self.family.grid_size(inputs if self.preprocessing is None else self._as_seen(inputs))

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
    @contextlib.contextmanager
    def call(self, inputs: Any = None, target: TargetLike = None, *, reads_target: bool = True) -> Iterator[Any]:
        """One call on the model (``explain``'s, or a method's own — :meth:`record`, :meth:`target` … — called
        directly), whose checks are made once: within the block the model is seen in float32 (:mod:`.precision`),
        a class target (None included) is refused when the outputs are not classes, and ``inputs`` (if given)
        come back checked and on the model.

        A call within a call of this adapter (a method's :meth:`record` within ``explain``) trusts what the outer
        one checked: its inputs, derived from the checked ones, are only moved to the model, and its target is
        refused only if no outer call took one (a control explaining another method, ``degraded``).
        ``reads_target``: False for a call that reads no target (the controls, :meth:`differentiable_forward`).
        """
        within = self._within_call()
        taken = within and _CALL.get().took_target
        with contextlib.nullcontext() if within else float32_scope(self.model):
            if reads_target and not taken:
                refuse_classes(target, self.head_reason)
            received = None if inputs is None else self._received(inputs)
            token = _CALL.set(_Call(self, reads_target or taken))
            try:
                yield received
            finally:
                _CALL.reset(token)

    def _within_call(self) -> bool:
        call = _CALL.get()
        return call is not None and call.adapter is self

    def _received(self, inputs: Any) -> Any:
        """``inputs`` on the model: checked (:meth:`check_inputs`) unless they come within a :meth:`call`, whose
        inputs were (what derives from them is trusted, only moved)."""
        return self._placed(inputs) if self._within_call() else self.check_inputs(inputs)

    def check_inputs(self, inputs: Any) -> Any:
        """What the user passed, checked and moved to the model's device (and, for images, dtype); with
        preprocessing, images are checked as the described model sees them (preprocessed)."""
        if self.preprocessing is None:
            checked = self.family.check_inputs(inputs)
        else:
            checked = check_images(inputs, grid_size=lambda images: None)
            self.family.check_inputs(self._as_seen(checked))
        return self._placed(checked)

    def _placed(self, inputs: Any) -> Any:
        """Checked ``inputs`` on the model's device (images also in its dtype)."""
        if isinstance(inputs, TokenBatch):
            return inputs.to(self.device)
        return inputs.to(device=self.device, dtype=self.dtype)

    def check_images(self, images: Any) -> Tensor:
        """``images`` checked (within a :meth:`call`, trusted) and on the model; refuses a text model."""
        if self.modality != "image":
            raise TypeError(f"{self.model_name} explains tokenised text, not images")
        return self._received(images)

    def preprocessed(self, inputs: Any) -> Any:
        """``inputs`` as the described model takes them: through the preprocessing, if any."""
        return inputs if self.preprocessing is None else self.preprocessing(inputs)

    def _as_seen(self, images: Tensor) -> Tensor:
        """``images`` preprocessed without gradients, in eval mode: what the described model would check."""
        with torch.no_grad(), evaluation_mode(self.model):
            return self.preprocessed(images.to(device=self.device, dtype=self.dtype))

    # -- plain forwards ---------------------------------------------------------------------------
    def forward(self, inputs: Any) -> Tensor:
        """Outputs [B, classes] (or [B, D]) of a plain forward on checked inputs (current mode and grad setting),
        the preprocessing first."""
        return self.family.forward(self.preprocessed(inputs))

    def logits(self, inputs: Any) -> Tensor:
        """Float32 outputs of a plain batched forward in eval mode, no gradients.

        A forward that only scores inputs: within an explanation it runs in the caller's precision
        (autocast, TF32, low-precision weights; see :mod:`.precision`)."""
        with torch.no_grad(), evaluation_mode(self.model), caller_precision():
            return self.forward(self._received(inputs)).float()

    def features(self, inputs: Any) -> Tensor:
        """Float32 [B, D]: the representation the model's classifier reads, the input of the linear layer whose
        output is the model's output (the pre-logits), from a plain forward as :meth:`logits` computes it. Refused,
        in one line, when the last linear layer the forward runs does not compute the output from a [B, D] input
        (two heads averaged, a scaled similarity, an embedding model's output)."""
        last: list[tuple[Tensor, Tensor]] = []

        def keep(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
            last[:] = [(args[0], output)]

        hooks = [module.register_forward_hook(keep) for module in self.model.modules() if isinstance(module, nn.Linear)]
        try:
            with torch.no_grad(), evaluation_mode(self.model), caller_precision():
                outputs = self.forward(self._received(inputs))
        finally:
            for hook in hooks:
                hook.remove()
        if not last or last[0][1] is not outputs or last[0][0].dim() != 2:
            raise UnsupportedModelError(f"no linear classifier of this {self.model_name} computes its outputs from a "
                                        "[B, D] representation, so the representation its classifier reads is unknown")
        return last[0][0].float()

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
        with self.call(inputs, target) as inputs, torch.no_grad(), evaluation_mode(self.model):
            outputs = self.forward(inputs)
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
        if set(stop_gradient) - {"attn_input"}:
            raise ValueError(f"stop_gradient supports only 'attn_input', got {sorted(stop_gradient)}")
        if isinstance(self.family, ForwardOnly):
            raise UnsupportedModelError(f"record reads the model's blocks; {self.family.unreachable}")
        wanted = dict(grads) if isinstance(grads, Mapping) else {name: None for name in grads}
        input_grad = wanted.pop("input", False) is not False
        for name in set(wanted) | set(fields or ()):
            if name not in BLOCK_FIELDS + HEAD_FIELDS:
                raise ValueError(f"cannot record {name!r}; choose from {list(BLOCK_FIELDS + HEAD_FIELDS) + ['input']}")
        refuse_layer_scores(layer_scores, set(wanted) | set(fields or ()), input_grad, self.probe, self.readout)
        with self.call(inputs, target) as inputs:  # internals and gradients are read in float32 (precision.py)
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
                geometry = self.token_geometry(inputs, recorder.layouts, recorder.tokens[-1], recorder.readout_attn,
                                               recorder.readout_selection)
                recording = recorder.recording(self.blocks, outputs, resolved, scores, geometry)
                if backward:
                    recorder.backward(differentiated, recording, reduce, inputs if input_grad else None)
            return recording

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
            readout=readout_weights(self.family, last_tokens, inputs.shape[0], self.device, probe_attn, selection),
            stages=stage_grids(layouts, grid),
            layouts=list(layouts), token_mask=inputs.attention_mask if isinstance(inputs, TokenBatch) else None)

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
        inputs = self._received(inputs)
        batch = inputs.shape[0]
        if keep.ndim != 3 or keep.shape[0] != batch:
            raise ValueError(f"keep must be [B, M, K] patch indices with B={batch}, got {tuple(keep.shape)}")
        with torch.no_grad(), evaluation_mode(self.model), caller_precision():  # in the model's own dtype
            outputs = subset_outputs(self.family, self.preprocessed(self._placed(inputs)), keep, batch_size)
        return outputs.float().reshape(*keep.shape[:2], -1)
