"""A family's blocks declared as data (:class:`Stack`): where they are, which classes it describes and the layout each
computes, what else each must be, and where a block keeps its parts (:class:`Parts`). A family's block parts and its
refusal of blocks it does not describe both follow from the declaration."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..attention import AttentionParts
from ..blocks import BlockParts
from .errors import UnsupportedModelError

#: one more thing a block must be: (its place, as a refusal names it, the block) -> a clause naming the place, or None
BlockCheck = Callable[[str, nn.Module], "str | None"]


def missing(module: nn.Module, names: Sequence[str]) -> str | None:
    """'its X has no a, b' for the dotted ``names`` that ``module`` lacks, or None."""
    absent = [name for name in names if at(module, name) is None]
    return f"its {type(module).__name__} has no {', '.join(absent)}" if absent else None


def needing(*names: str, within: str | None = None) -> BlockCheck:
    """The check that a block (or its part ``within``) holds the dotted attributes ``names``."""
    def check(place: str, block: nn.Module) -> str | None:
        absent = missing(at(block, within) if within else block, names)
        return f"{place}: {absent}" if absent else None

    return check


def optional(module: nn.Module | None) -> nn.Module | None:
    """``module`` unless it is absent or an Identity."""
    return None if module is None or isinstance(module, nn.Identity) else module


def layer_scale(module: nn.Module | Tensor | None) -> Callable[[], Tensor] | None:
    """The gain of a timm LayerScale module (None for an Identity), or of a bare gain parameter."""
    if module is None or isinstance(module, nn.Identity):
        return None
    gamma = module if isinstance(module, Tensor) else getattr(module, "gamma", None)
    if gamma is None:
        raise UnsupportedModelError(f"unknown layer-scale module {type(module).__name__}")
    return lambda: gamma


def at(owner: Any, path: str | tuple[str, ...] | None) -> Any:
    """What the dotted attribute ``path`` of ``owner`` holds, or None where a part of it is absent (a tuple of paths:
    the first that holds something)."""
    if isinstance(path, tuple):
        return next((found for found in (at(owner, one) for one in path) if found is not None), None)
    found = None if path is None else owner
    for name in () if path is None else path.split("."):
        found = getattr(found, name, None)
    return found


@dataclass(frozen=True)
class Parts:
    """Where a block keeps its parts: dotted attribute paths from the block (a tuple: the first one it has; None or
    absent: it has none), and the functions that read what one module does not say.

    Attributes:
        attention: the attention module (the family's :meth:`~.base.Family.attention` reads it).
        norm1, norm2, mlp, activation, drop1, drop2: as :class:`~vitexplain.instrumentation.blocks.BlockParts` has them.
        gamma1, gamma2: LayerScale modules or bare gains (read by :func:`layer_scale`).
        main_norm: a norm of the residual stream after the block's adds (an Identity counts as none).
        gated_mlp: of the feed-forward module, its branch written out with the gating product, or None (plain).
        windows: of the block, its windows (hierarchical models).
        inputs, output: the block's call read as tokens, and tokens given back as its forward returns them.
    """

    attention: str = "attn"
    norm1: str = "norm1"
    norm2: str = "norm2"
    mlp: str = "mlp"
    activation: str | tuple[str, ...] | None = "mlp.act"
    gamma1: str | None = None
    gamma2: str | None = None
    drop1: str | None = None
    drop2: str | None = None
    main_norm: str | None = None
    gated_mlp: Callable[[nn.Module], Any] | None = None
    windows: Callable[[nn.Module], Any] | None = None
    inputs: Callable[..., Any] | None = None
    output: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Stack:
    """Where a family's Transformer blocks are and which it describes.

    Attributes:
        at: the blocks' attribute path from the model (from each stage, with ``stages``), or a function of the model
            giving them in order.
        layouts: the block classes described, by class name, with the layout each computes (``pre_norm`` for any other).
        named: how a refusal names those classes ("timm's Block or ResPostBlock"); None: a block of any class is taken.
        word: what a refusal calls one block ("block 3", "layer 3").
        stages: the path of a hierarchical model's stages, each holding blocks at ``at`` ("stage 1 block 0").
        checks: what else each block must be, in order (after its class).
        parts: where each block keeps its parts.
    """

    at: str | Callable[[nn.Module], Sequence[nn.Module]]
    layouts: Mapping[str, str]
    named: str | None
    word: str = "block"
    stages: str | None = None
    checks: tuple[BlockCheck, ...] = ()
    parts: Parts = field(default_factory=Parts)

    def places(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """Every block in order, with its place as a refusal names it."""
        if self.stages is not None:
            return [(f"stage {i} {self.word} {j}", block) for i, stage in enumerate(at(model, self.stages))
                    for j, block in enumerate(at(stage, self.at))]
        blocks = self.at(model) if callable(self.at) else at(model, self.at)
        return [(f"{self.word} {i}", block) for i, block in enumerate(blocks)]

    def modules(self, model: nn.Module) -> list[nn.Module]:
        """The blocks in order (block indices count across stages)."""
        return [block for _, block in self.places(model)]

    def reason(self, model: nn.Module) -> str | None:
        """Why a block of ``model`` is not described — its class, then its :attr:`checks` — or None."""
        for place, block in self.places(model):
            kind = type(block).__name__
            if self.named is not None and kind not in self.layouts:
                return f"{place} is a {kind}, not {self.named}"
            for check in self.checks:
                if reason := check(place, block):
                    return reason
        return None

    def block(self, module: nn.Module, attention: Callable[[nn.Module], AttentionParts]) -> BlockParts:
        """Where the block ``module`` keeps its parts, ``attention`` reading its attention module's."""
        parts = self.parts
        mlp = at(module, parts.mlp)
        functions = dict(gated_mlp=parts.gated_mlp and parts.gated_mlp(mlp), inputs=parts.inputs, output=parts.output,
                         windows=parts.windows and parts.windows(module))
        return BlockParts(
            module=module, attention=attention(at(module, parts.attention)), norm1=at(module, parts.norm1),
            norm2=at(module, parts.norm2), mlp=mlp,
            activation=at(module, parts.activation), layout=self.layouts.get(type(module).__name__, "pre_norm"),
            gamma1=layer_scale(at(module, parts.gamma1)), gamma2=layer_scale(at(module, parts.gamma2)),
            drop1=at(module, parts.drop1), drop2=at(module, parts.drop2),
            main_norm=optional(at(module, parts.main_norm)),
            **{name: function for name, function in functions.items() if function is not None})


__all__ = ["BlockCheck", "Parts", "Stack", "layer_scale", "missing", "needing", "optional"]
