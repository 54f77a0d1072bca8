"""The contract every model-family adapter fulfils, and the parts of it that do not depend on the family."""
from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .recording import BLOCK_FIELDS, BlockRecord, Recording

SCORES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "logit": lambda logits, target: logits.gather(1, target[:, None])[:, 0],
    "probability": lambda logits, target: logits.softmax(-1).gather(1, target[:, None])[:, 0],
    "log_probability": lambda logits, target: logits.log_softmax(-1).gather(1, target[:, None])[:, 0],
}


class UnsupportedModelError(TypeError):
    """The model is not one vitexplain can instrument, or lacks what a method needs."""


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """A batch of tokenised text, the input of text classifiers (what a tokenizer returns, as tensors).

    Attributes:
        input_ids: token ids [B, T] (long).
        attention_mask: True for real tokens, False for padding [B, T] (bool).
        token_type_ids: segment ids [B, T] (long), or None for the model's default (all 0).
    """

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @property
    def lengths(self) -> Tensor:
        """Real (unpadded) tokens per sequence [B]."""
        return self.attention_mask.sum(1)

    def select(self, rows: Tensor, length: int | None = None) -> TokenBatch:
        """The sequences at ``rows``, cut to their first ``length`` positions (all when None)."""
        cut = slice(None, length)
        pick = lambda t: None if t is None else t[rows, cut]  # noqa: E731
        return TokenBatch(pick(self.input_ids), pick(self.attention_mask), pick(self.token_type_ids))

    def as_model_inputs(self) -> dict[str, Tensor]:
        """Keyword arguments of a transformers model's forward."""
        inputs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask.long()}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


def resolve_targets(target: int | Sequence[int] | Tensor | None, logits: Tensor) -> Tensor:
    """Turn the user's ``target`` into one class index per image [B] on the logits' device."""
    batch, num_classes = logits.shape
    if target is None:
        return logits.argmax(-1)
    if isinstance(target, int):
        targets = torch.full((batch,), target, dtype=torch.long, device=logits.device)
    else:
        targets = torch.as_tensor(target, device=logits.device)
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise TypeError(f"target must hold integer class indices, got dtype {targets.dtype}")
        targets = targets.long().reshape(-1)
        if targets.numel() == 1 and batch != 1:
            targets = targets.expand(batch)
        if targets.numel() != batch:
            raise ValueError(f"target has {targets.numel()} entries for a batch of {batch} images")
    bad = (targets < 0) | (targets >= num_classes)
    if bad.any():
        raise ValueError(f"target {targets[bad][0].item()} is outside the model's {num_classes} classes")
    return targets


def score_of(logits: Tensor, targets: Tensor, score: str | Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Per-image target score [B]: a name from :data:`SCORES` or a callable (logits, targets) -> [B]."""
    if callable(score):
        return score(logits, targets)
    try:
        return SCORES[score](logits, targets)
    except KeyError:
        raise ValueError(f"unknown score {score!r}; choose one of {sorted(SCORES)}") from None


@contextlib.contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Put every module in eval mode, and give each its own train/eval flag back afterwards."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


class ModelAdapter(ABC):
    """Knows one model family's internals; everything else in vitexplain goes through it.

    An adapter never changes the model outside its context managers, and each of those gives the
    model back exactly as it found it (hooks removed, patched methods and train/eval flags restored),
    also when an exception is raised inside.

    Inputs are image tensors [B, C, H, W] for vision models and :class:`TokenBatch` for text models;
    :meth:`check_inputs` turns what a user passes into the family's input, and :meth:`forward` runs
    the model on it. A family whose blocks differ from the pre-norm layout, or whose recordings read
    differently, says so with :attr:`block_record` and :meth:`_new_recording`.
    """

    #: Human-readable family name, used in error messages.
    family: str = ""

    #: The class each block's recorded tensors are gathered in.
    block_record: type[BlockRecord] = BlockRecord

    def __init__(self, model: nn.Module):
        self.model = model

    # -- what a family must provide -------------------------------------------------------------
    @classmethod
    @abstractmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        """None when this adapter can serve ``model``, else a sentence saying what is missing."""

    @property
    @abstractmethod
    def num_blocks(self) -> int: ...

    @property
    @abstractmethod
    def num_heads(self) -> int: ...

    @property
    @abstractmethod
    def num_prefix_tokens(self) -> int: ...

    @property
    @abstractmethod
    def class_token_index(self) -> int | None: ...

    @property
    @abstractmethod
    def patch_size(self) -> tuple[int, int]: ...

    @abstractmethod
    def grid_size(self, inputs: Any) -> tuple[int, ...]:
        """Patch grid (h, w) of a batch of images, or (T,) for a batch of T-token sequences."""

    @abstractmethod
    def _recording(self, store: list[dict[str, Tensor]], detach_attention_input: bool = False) -> contextlib.AbstractContextManager[None]:
        """Context in which a plain forward of the model fills ``store`` with one dict per block.

        With ``detach_attention_input`` every attention sublayer computes from a detached copy of its
        input, so gradients reach a block's attention only through the residual path above it.
        """

    @abstractmethod
    def embed(self, inputs: Any) -> Tensor:
        """Token sequence fed to the first block (prefix tokens first, position embedding added) [B, N, C]."""

    @abstractmethod
    def encode(self, tokens: Tensor) -> Tensor:
        """Run the blocks, the final norm and the head on a token sequence [B, N', C] -> logits [B, classes]."""

    def apply_lrp_rules(self, writer) -> None:
        """Place LRP rules on the family's own parts (attention, residual adds, embeddings, head).

        ``writer`` is a :class:`~vitexplain.instrumentation.lrp.RuleWriter`; see
        :func:`~vitexplain.instrumentation.lrp.lrp_rules`. Families without LRP code refuse.
        """
        raise UnsupportedModelError(
            "LRP rules are written for timm Vision Transformers and transformers' ViT / DeiT image "
            f"classifiers, not {type(self.model).__name__}")

    # -- shared behaviour -----------------------------------------------------------------------
    def require_class_token(self, method: str) -> int:
        if self.class_token_index is None:
            raise UnsupportedModelError(
                f"{method} explains through the class token, but this {type(self.model).__name__} has none "
                "(it pools its patch tokens)")
        return self.class_token_index

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def check_inputs(self, inputs: Any) -> Any:
        """What the user passed, checked and moved to the model's device: images unless the family says otherwise."""
        return self.check_images(inputs)

    def forward(self, inputs: Any) -> Tensor:
        """Logits [B, classes] of a plain forward on checked inputs (the current mode and grad setting)."""
        return self.model(inputs)

    def check_images(self, images: Tensor) -> Tensor:
        if not isinstance(images, Tensor):
            raise TypeError(f"images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
        if images.ndim != 4:
            raise ValueError(f"images must have shape [B, C, H, W], got shape {tuple(images.shape)}")
        if not images.dtype.is_floating_point:
            raise TypeError(f"images must be a preprocessed float tensor, got dtype {images.dtype}")
        if images.shape[0] == 0:
            raise ValueError("images is an empty batch")
        finite = torch.isfinite(images).flatten(1).all(1)
        if not finite.all():
            bad = ", ".join(str(i) for i in (~finite).nonzero()[:, 0].tolist())
            raise ValueError(f"NaN or infinite values in the batch's image(s) {bad} (counted from 0)")
        self.grid_size(images)  # raises on sizes the model cannot take
        return images.to(device=self.device, dtype=self.dtype)

    @contextlib.contextmanager
    def differentiable_forward(self) -> Iterator[Callable[[Tensor], Tensor]]:
        """Yield ``inputs -> logits`` with gradients enabled and the model in eval mode (restored on exit).

        For methods that drive their own backward passes (e.g. through Captum)."""
        with evaluation_mode(self.model), torch.enable_grad():
            yield self.forward

    def logits(self, inputs: Any) -> Tensor:
        """Plain batched forward in eval mode, no gradients."""
        with torch.no_grad(), evaluation_mode(self.model):
            return self.forward(self.check_inputs(inputs))

    def record(
        self,
        inputs: Any,
        target: int | Sequence[int] | Tensor | None = None,
        *,
        grads: Sequence[str] = (),
        score: str | Callable[[Tensor, Tensor], Tensor] = "logit",
        stop_gradient: Sequence[str] = (),
    ) -> Recording:
        """One instrumented forward over a batch and, if ``grads`` names any field, one backward.

        Args:
            inputs: preprocessed images [B, C, H, W], or a :class:`TokenBatch` for text models.
            target: None (each image's predicted class), an int, or one class per image.
            grads: names from :data:`~vitexplain.instrumentation.recording.BLOCK_FIELDS` whose gradient
                is wanted in every block, and/or ``"input"`` for the gradient with respect to the images
                (images only: token ids have none; block 0's ``residual`` holds the text embeddings).
            score: what is differentiated: ``"logit"``, ``"probability"``, ``"log_probability"`` of the
                target class, or a callable (logits, targets) -> [B]. Images are independent, so the sum
                over the batch gives each image its own gradient.
            stop_gradient: ``("attn_input",)`` makes every attention sublayer read a detached input, so
                that the backward does not flow through attention into lower blocks (as Leem & Seo's
                AG-CAM model does). The forward values are unchanged.
        """
        if set(stop_gradient) - {"attn_input"}:
            raise ValueError(f"stop_gradient supports only 'attn_input', got {sorted(stop_gradient)}")
        unknown = set(grads) - set(BLOCK_FIELDS) - {"input"}
        if unknown:
            raise ValueError(f"cannot record gradients of {sorted(unknown)}; choose from {list(BLOCK_FIELDS) + ['input']}")
        inputs = self.check_inputs(inputs)
        if "input" in grads and not isinstance(inputs, Tensor):
            raise ValueError("'input' gradients are taken with respect to images; token ids have none "
                             "(ask for 'residual': block 0's residual holds the embeddings)")
        store: list[dict[str, Tensor]] = []
        backward = bool(grads)
        with evaluation_mode(self.model), torch.set_grad_enabled(backward), \
                self._recording(store, detach_attention_input="attn_input" in stop_gradient):
            if backward and isinstance(inputs, Tensor):
                inputs = inputs.detach().requires_grad_(True)
            logits = self.forward(inputs)
            targets = resolve_targets(target, logits.detach())
            scores = score_of(logits, targets, score)
            blocks = [self.block_record(**entry) for entry in store]
            input_grad = None
            if backward:
                input_grad = self._backward(scores, blocks, grads, inputs if "input" in grads else None)
        detach = lambda t: t.detach() if isinstance(t, Tensor) else t  # noqa: E731
        for block in blocks:
            for name in (f.name for f in dataclasses.fields(block) if f.name != "grads"):
                setattr(block, name, detach(getattr(block, name)))
        return self._new_recording(
            inputs,
            logits=logits.detach(),
            targets=targets,
            scores=scores.detach(),
            blocks=blocks,
            input_grad=input_grad,
        )

    def _new_recording(self, inputs: Any, **fields) -> Recording:
        """The :class:`Recording` of one pass over ``inputs`` (``fields``: logits, targets, scores, blocks, input_grad)."""
        return Recording(grid=self.grid_size(inputs), num_prefix_tokens=self.num_prefix_tokens,
                         class_token_index=self.class_token_index, **fields)

    @staticmethod
    def _backward(scores: Tensor, blocks: list[BlockRecord], grads: Sequence[str], images: Tensor | None) -> Tensor | None:
        """Fill ``block.grads`` for the requested fields; return the input gradient if asked for."""
        block_fields = [name for name in grads if name != "input"]
        wanted = [getattr(block, name) for block in blocks for name in block_fields]
        if "input" in grads:
            wanted.append(images)
        found = torch.autograd.grad(scores.sum(), wanted, allow_unused=True)
        found = [torch.zeros_like(t) if g is None else g for t, g in zip(wanted, found)]
        input_grad = found.pop() if "input" in grads else None
        for i, block in enumerate(blocks):
            for j, name in enumerate(block_fields):
                block.grads[name] = found[i * len(block_fields) + j]
        return input_grad

    def logits_on_tokens(self, inputs: Any, keep: Tensor, *, batch_size: int = 256) -> Tensor:
        """Logits when only some patch tokens of each image enter the encoder.

        Prefix tokens are always kept. Tokens are dropped after the position embedding, so the kept
        ones keep their positions (the token-sampling forward of TIS, Englebert et al. 2023, Eq. 4).

        Args:
            inputs: images [B, C, H, W] (or what :meth:`check_inputs` takes).
            keep: patch indices to keep, [B, M, K] (M token subsets of K patches per image).
            batch_size: sequences run through the encoder at once; bounds memory independently of M.

        Returns:
            logits [B, M, classes].
        """
        inputs = self.check_inputs(inputs)
        batch = inputs.shape[0]
        if keep.ndim != 3 or keep.shape[0] != batch:
            raise ValueError(f"keep must be [B, M, K] patch indices with B={batch}, got {tuple(keep.shape)}")
        prefix = self.num_prefix_tokens
        with torch.no_grad(), evaluation_mode(self.model):
            tokens = self.embed(inputs)
            num_patches = tokens.shape[1] - prefix
            if keep.numel() and (keep.min() < 0 or keep.max() >= num_patches):
                raise ValueError(f"keep holds patch indices outside 0..{num_patches - 1}")
            b, m, k = keep.shape
            image_of = torch.arange(b, device=tokens.device).repeat_interleave(m)
            flat_keep = keep.to(tokens.device).reshape(b * m, k) + prefix
            outputs = []
            for start in range(0, b * m, batch_size):
                rows = image_of[start:start + batch_size]
                idx = flat_keep[start:start + batch_size]
                patches = tokens[rows[:, None], idx]
                sequence = torch.cat([tokens[rows, :prefix], patches], dim=1)
                outputs.append(self.encode(sequence))
        return torch.cat(outputs).reshape(b, m, -1)
