"""Control: a real method's maps degraded on purpose (noise, blur, shuffle), MetaQuantus-style disruptive perturbations.

Hedström et al., "The Meta-Evaluation Problem in Explainable AI: Identifying Reliable Estimators with
MetaQuantus", TMLR 2023, ask of a trustworthy evaluation metric that its verdict *change* under perturbations
that ruin an explanation (adversarial reactivity). A degraded copy of a real map is such a perturbation of
the map itself: in the bench a metric that cannot tell GAE from GAE with its values shuffled over the image
does not measure what GAE's map says on this data (docs/decisions/metric-trust.md).
"""
from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ..instrumentation import ModelAdapter
from ..instrumentation.targets import is_score_target
from ..options import NonNegative
from ..registry import METHODS, MethodSpec, register_method
from ..seeding import seeded_draw

#: a Gaussian blur's kernel reaches this many sigmas on each side (scipy.ndimage.gaussian_filter's default)
TRUNCATE = 4.0


def wrapped_method(of: str) -> MethodSpec:
    """The method whose maps are degraded: a registered, token-level image method that is not a control; else
    a one-line ValueError."""
    if not isinstance(of, str) or of not in METHODS:
        raise ValueError(f"degraded: of={of!r} is not a registered method; "
                         f"give one of: {', '.join(degradable_methods())}")
    spec = METHODS.get(of)
    if spec.control or "image" not in spec.modalities or spec.resolution != "token":
        why = ("a control" if spec.control else "not an image method" if "image" not in spec.modalities
               else "pixel-level (a degraded copy is registered token-level, so its maps keep the patch grid)")
        raise ValueError(f"degraded: of={of!r} is {why}; give a token-level image method that is not a control")
    return spec


def degradable_methods() -> list[str]:
    """Every method ``degraded`` can take as ``of``."""
    return [name for name in METHODS.names() if not METHODS.get(name).control
            and "image" in METHODS.get(name).modalities and METHODS.get(name).resolution == "token"]


def gaussian_kernel(sigma: float, truncate: float = TRUNCATE) -> Tensor:
    """A normalised 1-D Gaussian of standard deviation ``sigma``, radius ``ceil(truncate * sigma)`` (float64)."""
    radius = max(int(math.ceil(truncate * sigma)), 0)
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    return kernel / kernel.sum()


def blur(maps: Tensor, sigma: float) -> Tensor:
    """``maps`` [B, h, w] blurred by a separable Gaussian of ``sigma`` map cells, edges extended by their nearest
    value (``scipy.ndimage.gaussian_filter(mode="nearest", truncate=4)`` on each map)."""
    if sigma <= 0:
        return maps.clone()
    kernel = gaussian_kernel(sigma).to(maps.device)
    radius = kernel.numel() // 2
    out = maps.double()[:, None]
    for dim in (2, 3):  # rows, then columns
        pad = (0, 0, radius, radius) if dim == 2 else (radius, radius, 0, 0)
        shape = (1, 1, -1, 1) if dim == 2 else (1, 1, 1, -1)
        out = F.conv2d(F.pad(out, pad, mode="replicate"), kernel.reshape(shape))
    return out[:, 0].to(maps.dtype)


def degrade(maps: Tensor, kind: str, strength: float, seed: int) -> Tensor:
    """``maps`` [B, h, w] degraded as :func:`degraded` says; one draw of ``seed`` shared by every map."""
    height, width = maps.shape[-2:]
    if kind == "noise":
        noise = seeded_draw(seed, lambda generator: torch.randn(height, width, generator=generator), maps.device)
        spread = maps.flatten(1).std(1)[:, None, None]
        return maps + strength * spread.nan_to_num(0.0) * noise
    if kind == "blur":
        return blur(maps, strength)
    # "shuffle" (the registry has checked ``kind`` against its annotation)
    order = seeded_draw(seed, lambda generator: torch.randperm(height * width, generator=generator), maps.device)
    return maps.flatten(1)[:, order].reshape(maps.shape)


def _cost(options: dict[str, Any]) -> float:
    try:
        return wrapped_method(options.get("of", "gae")).passes(options.get("options") or {})
    except ValueError:
        return float("nan")


@register_method(control=True, cost=_cost)
def degraded(adapter: ModelAdapter, images: Tensor, target=None, *, of: str = "gae",
             kind: Literal["noise", "blur", "shuffle"] = "noise", strength: NonNegative = 1.0, seed: int = 0,
             options: dict | None = None) -> Tensor:
    """Control, not an explanation: the maps of method ``of`` (with ``options``), degraded on purpose.

    MetaQuantus-style disruptive perturbation of real maps (Hedström et al., TMLR 2023): a metric that
    cannot tell a method from its degraded copy does not react to what the map says, on this model and
    data (the bench's "beats its degraded copies", docs/decisions/metric-trust.md).

    ``kind``: ``noise`` adds ``strength`` × the map's standard deviation × a standard-normal field;
    ``blur`` applies a Gaussian blur of ``strength`` grid cells (patches) as its sigma, edges extended by their
    nearest value, kernel to 4 sigmas; ``shuffle`` permutes the map's values over the grid (``strength``
    unused). The random field and the permutation are drawn once from ``seed`` (on the CPU) and shared by every
    image, so a map depends on neither its batch nor the device. ``of`` is any registered token-level
    image method that is not a control (checked with a one-line error); its model passes are this method's.
    """
    spec = wrapped_method(of)
    wrapped_options = dict(options or {})
    spec.check_options(wrapped_options)
    adapter.require(spec.reads, spec.name)
    if is_score_target(target) and not spec.score_targets:
        raise ValueError(f"degraded: method {of!r} explains classes only; give target= class indices")
    with adapter.call(target=target) as call:  # the wrapped method takes the target this control's call did not
        maps = spec.fn(call, images, target, **wrapped_options).float()
    return degrade(maps, kind, float(strength), seed)
