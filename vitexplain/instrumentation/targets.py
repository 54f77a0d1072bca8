"""What an explanation explains: a class, or any score of the model's output.

A user's ``target`` becomes a :class:`Target`, one per input:

* None — each input's predicted class (a model with a classifier head);
* an int, a sequence of ints or an integer tensor [B] — classes;
* a float tensor [D] or [B, D] — an embedding direction: the score is the cosine similarity of the
  model's output (for a model without a head, ``num_classes=0``: its pooled embedding) to it, e.g. a
  CLIP text embedding for zero-shot classification, or another image's embedding for retrieval (a float
  scalar is neither: it is refused as a class that is not an integer);
* a callable ``outputs [R, ...] -> [R]`` — any score of the output, applied to every row alike.

For class targets the score of a method is the logit, the softmax probability or its log (the
method's ``score`` option); for the other two the score is the given one, whatever that option says.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Union

import torch
import torch.nn.functional as F
from torch import Tensor

SCORES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "logit": lambda logits, classes: logits.gather(1, classes[:, None])[:, 0],
    "probability": lambda logits, classes: logits.softmax(-1).gather(1, classes[:, None])[:, 0],
    "log_probability": lambda logits, classes: logits.log_softmax(-1).gather(1, classes[:, None])[:, 0],
}

TargetLike = Union[None, int, Sequence[int], Tensor, Callable[[Tensor], Tensor], "Target"]


@dataclass(frozen=True)
class Target:
    """The target of each input of a batch.

    Attributes:
        classes: the class per input [B] (long), or None when the target is a score.
        direction: an embedding direction per input [B, D], or None.
        function: a score function of the outputs, or None.
    """

    classes: Tensor | None = None
    direction: Tensor | None = None
    function: Callable[[Tensor], Tensor] | None = None

    @property
    def is_class(self) -> bool:
        return self.classes is not None

    def labels(self, batch: int, device: torch.device) -> Tensor:
        """The classes [B], or -1 for every input when the target is a score."""
        return self.classes if self.is_class else torch.full((batch,), -1, dtype=torch.long, device=device)

    def select(self, rows: Tensor) -> Target:
        """The targets of the inputs ``rows`` (e.g. the inputs behind masked or noisy copies)."""
        if self.function is not None:
            return self
        if self.classes is not None:
            return Target(classes=self.classes[rows.to(self.classes.device)])
        return Target(direction=self.direction[rows.to(self.direction.device)])

    def score(self, outputs: Tensor, score: str | Callable[[Tensor, Tensor], Tensor] = "logit") -> Tensor:
        """The target score of each row of ``outputs`` [B, ...] -> [B].

        ``score`` ("logit", "probability", "log_probability" or a callable (logits, classes) -> [B])
        applies to class targets; a direction or a score function gives its own score.
        """
        if self.function is not None:
            found = self.function(outputs)
            if not isinstance(found, Tensor) or found.shape != outputs.shape[:1]:
                raise ValueError(f"a target score function must return one value per row [{outputs.shape[0]}], "
                                 f"got {getattr(found, 'shape', type(found).__name__)}")
            return found
        if self.direction is not None:
            return F.cosine_similarity(outputs.flatten(1), self.direction.to(outputs.dtype), dim=1)
        if callable(score):
            return score(outputs, self.classes)
        try:
            return SCORES[score](outputs, self.classes)
        except KeyError:
            raise ValueError(f"unknown score {score!r}; choose one of {sorted(SCORES)}") from None


def _is_direction(target: object) -> bool:
    return isinstance(target, Tensor) and target.dtype.is_floating_point and target.ndim > 0


def is_score_target(target: object) -> bool:
    """Whether ``target`` names a score of the output (a direction or a function) rather than classes."""
    if isinstance(target, Target):
        return not target.is_class
    return _is_direction(target) or (callable(target) and not isinstance(target, Tensor))


def refuse_classes(target: TargetLike, reason: str | None) -> None:
    """Refuse a class target (None, the predicted class, included) of outputs that are not class logits, for
    ``reason`` (None: they are class logits)."""
    if reason is not None and not is_score_target(target):
        raise ValueError(f"{reason}, so it has no classes to explain: give target= an embedding direction (float "
                         "tensor [D] or [B, D]) or a score function of the outputs, or explain(..., classes=True) "
                         "if its outputs are classes after all")


def class_indices(target: int | Sequence[int] | Tensor, batch: int, device: torch.device | str | None = None) -> Tensor:
    """One class index per input [B] from an int (for all), one index, or one per input; refuses booleans
    and floats (a float tensor [D] or [B, D] is read as an embedding direction, never as classes)."""
    if isinstance(target, bool) or (isinstance(target, Tensor) and target.dtype == torch.bool):
        raise TypeError("target must hold integer class indices, not booleans")
    if isinstance(target, int):
        return torch.full((batch,), target, dtype=torch.long, device=device)
    classes = torch.as_tensor(target, device=device)
    if classes.dtype.is_floating_point or classes.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices, got dtype {classes.dtype} (only a float tensor "
                        "[D] or [B, D] is read otherwise: as an embedding direction)")
    classes = classes.long().reshape(-1)
    if classes.numel() == 1 and batch != 1:
        classes = classes.expand(batch)
    if classes.numel() != batch:
        raise ValueError(f"target has {classes.numel()} entries for a batch of {batch} inputs")
    return classes


def resolve_target(target: TargetLike, outputs: Tensor, *, has_classes: bool = True) -> Target:
    """Turn the user's ``target`` into a :class:`Target` for the batch whose outputs are ``outputs`` [B, ...].

    A class target of outputs that are not class logits is refused by the call on the model, before it runs
    (:meth:`~vitexplain.instrumentation.adapter.ModelAdapter.call`); ``has_classes=False`` refuses one here, for
    the callers that do not run in such a call (LRP's ``relevance``).
    """
    batch = outputs.shape[0]
    if isinstance(target, Target):
        return target
    if callable(target) and not isinstance(target, Tensor):
        return Target(function=target)
    refuse_classes(target, None if has_classes else "this model's outputs are not class logits")
    if target is None:
        return Target(classes=outputs.argmax(-1))
    if _is_direction(target):
        direction = target.to(outputs.device)
        direction = direction.expand(batch, -1) if direction.ndim == 1 else direction
        width = outputs.flatten(1).shape[1]
        if direction.ndim != 2 or direction.shape != (batch, width):
            raise ValueError(f"an embedding direction must be [D] or [B, D] with D = {width} (the output's width) "
                             f"and B = {batch}, got {tuple(target.shape)}")
        return Target(direction=direction)
    num_classes = outputs.shape[-1]
    classes = class_indices(target, batch, outputs.device)
    bad = (classes < 0) | (classes >= num_classes)
    if bad.any():
        raise ValueError(f"target {classes[bad][0].item()} is outside the model's {num_classes} classes")
    return Target(classes=classes)


def resolve_targets(target: TargetLike, logits: Tensor) -> Tensor:
    """One class index per input [B] (classes only; kept for callers that need class indices)."""
    return resolve_target(target, logits).labels(logits.shape[0], logits.device)
