"""Model-randomisation sanity check, the verdict: do a method's maps change when the model's weights are destroyed?

Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018, Sec. 3.1 ("cascading
randomization"): the weights of a trained model are re-initialised from the top layer down, one
layer more at each level, and the maps of the partly random models are compared with the
original maps by Spearman rank correlation (their Fig. 2 / Fig. 4). A method whose maps stay the
same although the model no longer computes anything meaningful does not explain the model.

Here (decisions in docs/decisions/default-bench.md):

* Levels, top first: ``head`` (classifier heads and the final norm), then ``block L-1`` ...
  ``block 0`` (one Transformer block more per level), then ``embedding`` (patch embedding, class /
  distillation / register tokens, position embedding): at the last level no trained weight is left.
* Re-initialisation as timm initialises a ViT: matrices, tokens and position embeddings from
  N(0, 0.02^2) (``trunc_normal_(std=0.02)``), biases 0, normalisation scales and layer-scale gains 1.
  Drawn on a deep copy of the model from one ``torch.Generator`` seeded with ``seed``, level by level,
  so the randomised models depend on the seed only.
* The class explained stays the one explained on the trained model (its prediction, or the label),
  as Adebayo et al. keep the image's class fixed.
* Similarity = Spearman rank correlation of the raw maps (no absolute value; ``absolute=True``
  compares |map| as Adebayo et al.'s second variant), ties ranked by their average rank. Two
  constant maps correlate 1 (nothing changed), a constant and a non-constant map 0.
* The verdict compares the correlation with a noise floor, the correlation the method's maps keep for
  a reason that is not the model: for a randomised method, its map of the same image by the trained
  model with another seed (seed-to-seed: a map dominated by its own sampling, such as RISE with few
  masks, is closer to the random model's map with the same seed than to the trained model's with
  another); for a deterministic method, the trained model's map of another image of the check
  (image-to-image: what unrelated maps of the method share, whatever the image). A map that depends
  on the model falls to about its floor once the whole model is random; one that does not stays above
  it. So a method is flagged when, with the whole model random, the 95 % bootstrap interval over the
  images of the mean of (correlation - floor) lies above 0, or when its maps did not change at all
  (correlation 1 on every image: the constant map, whose floor is 1 too) (:data:`VERDICT_RULE`).
  The controls are flagged.

Which parameters form a level, and how each is re-initialised, is the model family's declaration beside its
blocks (:attr:`vitexplain.instrumentation.families.Family.cascade`), read through
:func:`vitexplain.instrumentation.randomisation.randomisation_levels`, as the smooth / efficient MPRT protocols
read it; Spearman is :mod:`vitexplain.metrics.correlation`'s. In a benchmark the check is the registered protocol
``model_randomisation`` (:mod:`vitexplain.metrics.model_randomisation`: the per-image correlations at every level
and the floors), run by the bench as any protocol (its cache, errors per item, seconds), a config's ``sanity`` key
its entry; :func:`summarise` turns its per-image values into the reports' verdict. :func:`cascading_randomisation`
is the same cascade on a copy of the model, for several methods at once, outside a bench.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..instrumentation.randomisation import randomisation_levels, reinitialise
from ..metrics.correlation import spearman
from ..metrics.model_randomisation import floors
from ..uncertainty import CONFIDENCE, bootstrap, interval

__all__ = ["CascadeResult", "VERDICT_RULE", "cascading_randomisation", "image_to_image", "summarise", "verdict"]

#: the verdict, as the reports state it (``images``: how many images the check ran on)
VERDICT_RULE = ("Verdict: a method is flagged when, with the whole model random, its maps are clearly more like the "
                "trained model's maps than its noise floor explains: the {images} images' mean of (correlation - "
                f"floor) has a {CONFIDENCE:.0%} bootstrap interval above 0, or its maps did not change at all "
                "(correlation 1 on every image). Floor: for a randomised method, the trained model's map of the same "
                "image with another seed; for a deterministic one, the trained model's map of another image.")


@dataclass
class CascadeResult:
    """Correlations of every method's maps with its original maps.

    Attributes:
        levels: level names, top first (the last has the whole model random).
        correlations: method -> Spearman correlation per image and level [B, levels].
        errors: method -> why it could not be checked (it raised on a randomised model).
    """

    levels: list[str]
    correlations: dict[str, Tensor] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def cascading_randomisation(model: nn.Module, images: Tensor, targets: Tensor, original: dict[str, Tensor],
                            explain: Callable[[str, nn.Module, Tensor, Tensor], Tensor], *, seed: int = 0,
                            absolute: bool = False) -> CascadeResult:
    """Adebayo et al.'s cascading randomisation for several methods at once.

    Args:
        model: the trained model (left untouched: a deep copy is randomised); a model whose family declares no
            cascade is refused (:class:`~vitexplain.instrumentation.UnsupportedModelError`) before any work.
        images: preprocessed images [B, 3, H, W] on the model's device.
        targets: the class each original map explains [B]; kept at every level.
        original: method -> its maps of ``images`` on the trained model [B, h, w].
        explain: (method, model, images, targets) -> maps; called once per method and level.
        seed: seeds the re-initialisation.
        absolute: compare absolute values of the maps.
    """
    randomised = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    levels = randomisation_levels(randomised)
    result = CascadeResult([level.name for level in levels])
    columns: dict[str, list[Tensor]] = {method: [] for method in original}
    for level in levels:
        reinitialise(level, generator)
        for method in [m for m in columns if m not in result.errors]:
            try:
                maps = explain(method, randomised, images, targets)
                if not torch.isfinite(maps).all():
                    raise ValueError("the maps of the randomised model contain NaN or infinite values")
                columns[method].append(spearman(original[method].to(maps), maps, absolute=absolute).cpu())
            except Exception as error:  # noqa: BLE001 - one method failing must not stop the others
                result.errors[method] = f"{type(error).__name__}: {error}"
    result.correlations = {m: torch.stack(c, 1) for m, c in columns.items() if m not in result.errors}
    return result


def image_to_image(maps: Tensor) -> Tensor:
    """Spearman correlation of each image's map with the previous image's (the first with the last) [B]:
    what a deterministic method's maps share whatever the image."""
    if maps.shape[0] < 2:
        raise ValueError("the image-to-image floor needs maps of at least two images")
    return spearman(maps, maps.roll(1, 0))


def verdict(correlations: Tensor, floor: Tensor, seed: int) -> dict[str, object]:
    """``excess``: the mean over images of the last level's correlation less the floor, with its bootstrap
    interval (value, low, high); ``flagged`` when that interval lies above 0 or the last level's maps equal
    the trained model's on every image (see the module docstring)."""
    excess = {"excess": (correlations[:, -1] - floor).double()}
    low, high = interval(bootstrap(excess, lambda values: {"excess": values["excess"].mean()}, seed)["excess"])
    unchanged = bool((correlations[:, -1] >= 1 - 1e-9).all())
    return {"excess": [excess["excess"].mean().item(), low, high], "flagged": low > 0 or unchanged}


def summarise(values: dict[str, Tensor], seed: int) -> dict[str, object]:
    """One method's entry of :attr:`vitexplain.bench.BenchResult.sanity` from the ``model_randomisation`` protocol's
    per-image values of the check's images (dataset order): ``correlation`` (mean per level), ``floor`` (mean) and
    its ``floor_kind`` (``seed``: a randomised method's map with another seed; ``image``: another image's map), and
    the :func:`verdict`, bootstrapped with ``seed``."""
    correlations = values["correlation"].double()
    floor = floors(values)
    kind = "image" if values["seed_floor"].isnan().any() else "seed"
    return {"correlation": correlations.mean(0).tolist(), "floor": floor.mean().item(), "floor_kind": kind,
            **verdict(correlations, floor, seed)}
