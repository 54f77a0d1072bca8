"""What the stability protocols share: the maps rescaled per image, the maps of perturbed copies of the images
(each copy one ``explain`` call on the whole batch, numbered so that the random control draws afresh for it), the
distance of two sets of maps, horizontal translations, and a model made to absorb a constant input shift.

Used by max- and avg-sensitivity, the local Lipschitz estimate, continuity and input invariance
(docs/decisions/metrics-latec-robustness.md).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from ..maps import min_max
from ._common import check_maps, explain_copy

Normalise = Literal["none", "minmax", "max", "maxabs"]


def normalise_maps(maps: Tensor, normalise: Normalise) -> Tensor:
    """Maps [B, h, w] rescaled per image: ``"minmax"`` (m - min) / (max - min), 0 for a constant map;
    ``"max"`` m / max, unchanged where the maximum is 0; ``"maxabs"`` m / max |m| (Quantus's ``normalise_by_max``),
    unchanged where the map is 0; ``"none"`` as they are."""
    if normalise == "none":
        return maps
    if normalise == "minmax":
        return min_max(maps, constant=0.0)
    high = maps.flatten(1).max(1).values if normalise == "max" else maps.flatten(1).abs().max(1).values
    high = high.view(-1, 1, 1)
    return maps / torch.where(high == 0, torch.ones_like(high), high)


def explained_copies(explain: Callable[..., Tensor], copies: Iterable[Tensor], targets: Tensor, maps: Tensor,
                     seeds: Sequence[int | None] | None = None, what: str = "a perturbed image") -> Iterator[Tensor]:
    """The maps of each perturbed copy of the images, in order: copy k (1, 2, ...) is one call
    ``explain(copy_images, targets, copy=k)`` on the whole batch (:func:`._common.explain_copy`: the random control
    draws afresh for each copy, every method ignores it), with ``seed=seeds[k-1]`` where one is given; each checked
    finite and of the shape of ``maps`` [B, h, w]."""
    for copy, images in enumerate(copies, start=1):
        seed = None if seeds is None else seeds[copy - 1]
        found = explain_copy(explain, images, targets, copy, **({} if seed is None else {"seed": seed}))
        perturbed = check_maps(found.to(maps.device), maps.shape[0], what=f"explanation map of {what}")
        if perturbed.shape != maps.shape:
            raise ValueError(f"explain returned maps of shape {tuple(perturbed.shape)} for {what}, expected "
                             f"{tuple(maps.shape)} (those of the unperturbed images)")
        yield perturbed


def norm_of_difference(a: Tensor, b: Tensor, order: float = 2.0) -> Tensor:
    """Per image ``‖a - b‖_order`` of the flattened maps (or images) [B, ...] -> [B]."""
    return torch.linalg.vector_norm((a - b).flatten(1), ord=order, dim=1)


def translated(images: Tensor, shift: int, fill: Tensor) -> Tensor:
    """The images [B, C, H, W] moved ``shift`` pixels along x (positive: to the right), the columns uncovered filled
    with ``fill`` (broadcast to [B or 1, C, H, |shift|]); a shift of the whole width or more leaves only the fill."""
    width = images.shape[-1]
    shift = max(-width, min(width, int(shift)))
    filled = fill.to(images.dtype).expand(images.shape[0], images.shape[1], images.shape[2], abs(shift))
    if shift >= 0:
        return torch.cat([filled, images[..., :width - shift]], dim=-1)
    return torch.cat([images[..., -shift:], filled], dim=-1)


#: the attribute that marks a tensor the shift hooks have already shifted
_SHIFTED = "_vitexplain_input_shifted"


def absorbed_shift(shift: float, probe: Tensor) -> Callable[[nn.Module], None]:
    """``change(model)`` (for :attr:`EvalBatch.modified`): the model computes f(x - shift), so that it gives on
    ``x + shift`` what it gave on ``x`` (Kindermans et al.'s f2, which absorbs the input's constant shift in its first
    layer, made by subtracting it where the images enter the model).

    The images enter through the model's forward and, for methods that run the model piece by piece (token subsets,
    a preprocessing run apart from the model), through the modules that receive the same tensor in a forward. Those
    modules are found by one forward of ``probe`` (one image, on the model's device): every module whose forward
    receives ``probe`` itself gets a pre-hook that subtracts the shift from it; the result is marked, so that a module
    further in (the patch embedding within the model) does not subtract it twice.
    """
    def change(model: nn.Module) -> None:
        weight = next((p for p in model.parameters() if p.is_floating_point()), None)
        entries = _entry_points(model, probe if weight is None else probe.to(weight.dtype))

        def subtract(module: nn.Module, args: tuple, kwargs: dict, where: int | str = 0):
            found = args[where] if isinstance(where, int) else kwargs[where]
            if getattr(found, _SHIFTED, False):
                return None
            moved = found - shift
            setattr(moved, _SHIFTED, True)
            if isinstance(where, int):
                return (*args[:where], moved, *args[where + 1:]), kwargs
            return args, {**kwargs, where: moved}

        for module, where in entries:
            module.register_forward_pre_hook(lambda m, a, k, where=where: subtract(m, a, k, where), with_kwargs=True)

    return change


def _entry_points(model: nn.Module, probe: Tensor) -> list[tuple[nn.Module, int | str]]:
    """The modules whose forward receives ``probe`` itself in ``model(probe)``, each with where (argument index or
    keyword); the model first."""
    found: list[tuple[nn.Module, int | str]] = []

    def look(module: nn.Module, args: tuple, kwargs: dict) -> None:
        where = next((i for i, arg in enumerate(args) if arg is probe), None)
        if where is None:
            where = next((key for key, arg in kwargs.items() if arg is probe), None)
        if where is not None:
            found.append((module, where))

    handles = [module.register_forward_pre_hook(look, with_kwargs=True) for module in model.modules()]
    try:
        with torch.no_grad():
            model(probe)
    finally:
        for handle in handles:
            handle.remove()
    if not found:
        found.append((model, 0))
    return found
