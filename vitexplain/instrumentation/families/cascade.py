"""Which parameters a model-randomisation cascade re-initialises, level by level, as a family declares it beside its
blocks (:class:`Cascade`, a family's :attr:`~.base.Family.cascade`).

Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018, Sec. 3.1 ("cascading randomization"): the trained
model's weights are re-initialised from the top layer down, one layer more at each level. The levels, top first:
``head`` (the modules the family names in :attr:`Cascade.top`: the final norm, the pooling, the classifier heads),
then one level per block of the family's stack, the last block first (``block L-1`` ... ``block 0``), then
``embedding``: every parameter of the model not in an earlier level (patch embedding, class / distillation /
register tokens, position embedding), so that at the last level no trained weight is left. Within a level the
parameters come in the model's ``named_parameters()`` order, so the draws that re-initialise them (one generator,
level after level: :mod:`vitexplain.instrumentation.randomisation`) depend on the model and the seed only.

Each parameter is also told how it is re-initialised (:data:`Initial`), by :attr:`Cascade.initial`: by default as
timm initialises a ViT (:func:`timm_initial`: matrices and tokens drawn, norm scales and LayerScale gains one,
biases zero).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from .errors import UnsupportedModelError
from .stack import at

#: how a parameter is re-initialised: ``normal`` drawn (N(0, 0.02²) truncated), ``one`` all ones, ``zero`` all zeros
Initial = Literal["normal", "one", "zero"]


def timm_initial(owner: nn.Module, leaf: str, parameter: Tensor) -> Initial:
    """timm's ViT initialisation of the parameter ``leaf`` of the module ``owner``: matrices, tokens and position
    embeddings (2 dimensions or more) drawn; a norm's scale (``weight`` of a module whose class name holds "norm")
    and a LayerScale gain (``gamma``) one; everything else (biases) zero."""
    if parameter.ndim >= 2:
        return "normal"
    if ("norm" in type(owner).__name__.lower() and leaf == "weight") or leaf == "gamma":
        return "one"
    return "zero"


@dataclass(frozen=True)
class Level:
    """One level of the cascade: its name (``head``, ``block 3``, ``embedding``) and the parameters it re-initialises,
    each as (its name in the model, the parameter, how it is re-initialised), in the model's parameter order."""

    name: str
    parameters: tuple[tuple[str, nn.Parameter, Initial], ...]

    @property
    def names(self) -> list[str]:
        """The names of the level's parameters, in order."""
        return [name for name, _, _ in self.parameters]


@dataclass(frozen=True)
class Cascade:
    """A family's model-randomisation cascade (see the module docstring).

    Attributes:
        top: dotted paths from the model of the modules (or bare parameters) of the first level, ``head``: the
            final norm, pooling and classifier heads; a path the model lacks is skipped.
        initial: ``(owning module, parameter's own name, parameter) -> how it is re-initialised``.
    """

    top: tuple[str, ...]
    initial: Callable[[nn.Module, str, Tensor], Initial] = timm_initial

    def levels(self, model: nn.Module, blocks: Sequence[nn.Module], word: str = "block") -> list[Level]:
        """The levels of ``model`` whose Transformer blocks are ``blocks`` (in order, as the family's stack gives
        them), top first: ``head``, ``{word} L-1`` ... ``{word} 0``, ``embedding``."""
        if not blocks:
            raise UnsupportedModelError(f"model randomisation re-initialises a model block by block; this "
                                        f"{type(model).__name__} has no blocks")
        place: dict[int, int] = {}                                       # parameter -> its level (0: head)
        for path in self.top:
            found = at(model, path)
            for parameter in ([found] if isinstance(found, Tensor) else found.parameters() if found is not None
                              else []):
                place.setdefault(id(parameter), 0)
        for index, block in enumerate(blocks):
            for parameter in block.parameters():
                place.setdefault(id(parameter), len(blocks) - index)   # the last block right after the head
        modules = dict(model.named_modules())
        members: list[list[tuple[str, nn.Parameter, Initial]]] = [[] for _ in range(len(blocks) + 2)]
        for name, parameter in model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            members[place.get(id(parameter), len(blocks) + 1)].append(
                (name, parameter, self.initial(modules[owner], leaf, parameter)))
        names = ["head", *(f"{word} {i}" for i in reversed(range(len(blocks)))), "embedding"]
        return [Level(name, tuple(entries)) for name, entries in zip(names, members)]


__all__ = ["Cascade", "Initial", "Level", "timm_initial"]
