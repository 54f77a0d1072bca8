"""Model randomisation (Adebayo et al., NeurIPS 2018): do a method's maps change when the model's weights are destroyed?

Adebayo, Gilmer, Muelly, Goodfellow, Hardt, Kim, "Sanity Checks for Saliency Maps", NeurIPS 2018, Sec. 3.1
("cascading randomization", their Fig. 2 / Fig. 4): the trained model's weights are re-initialised from the top
layer down, one layer more at each level, and each partly random model's map of the image is compared with the
trained model's by Spearman rank correlation. A method whose maps stay the same although the model no longer
computes anything meaningful does not explain the model. Per image::

    correlation[l] = Spearman(e(x; f), e(x; f_l)),      f_l: levels 0 ... l re-initialised (top first),

the class kept the one explained on the trained model (the batch's targets), as Adebayo et al. keep it fixed.

The levels and how each is re-drawn are the model family's declaration (:mod:`vitexplain.instrumentation
.randomisation`: ``head``, ``block L-1`` ... ``block 0``, ``embedding``; timm's ViT initialisation, every level
drawn from one CPU generator seeded with ``seed``), the model changed only within :attr:`EvalBatch.modified`, as the
smooth and efficient MPRT protocols change it. Spearman is :func:`vitexplain.metrics.correlation.spearman` (average
ranks for ties; two constant maps correlate 1, a constant and a varying map 0); ``absolute`` compares |map|, the
paper's second variant.

A correlation is read against a noise floor, what the method's maps share for a reason that is not the model (the
verdict of the bench's check, :mod:`vitexplain.bench.randomisation`; docs/decisions/default-bench.md):

* a randomised method (:attr:`EvalBatch.randomised`): its map of the same image by the trained model with another
  seed, ``derived_seed(seed, 0)`` (seed-to-seed: a map dominated by its own sampling, RISE with few masks, is closer
  to the random model's map with the same seed than to the trained model's with another); per image, in
  ``compute`` (``seed_floor``; NaN for a deterministic method);
* a deterministic method: the trained model's map of the previous image of the evaluated set (the first with the
  last; image-to-image: what unrelated maps of the method share, whatever the image). It pairs images across the
  whole set, so ``compute`` carries each image's map (``map``, :attr:`~vitexplain.metrics.base.Metric.carried`) and
  ``reduce`` forms the floor over every image in dataset order: a number that does not depend on the batching.

Reported (:func:`reduce_model_randomisation`): ``excess``, the mean over images of the fully random model's
correlation less the floor (about 0 for a map that depends on the model, above 0 for one that does not; lower is
better); ``correlation`` and ``floor``, their means; ``unchanged``, the share of images whose map did not change at
all (correlation 1 with the whole model random: the constant map). The per-level correlations are curves.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..instrumentation.randomisation import Randomisation
from ..seeding import derived_seed
from ._common import check_image_batch, check_maps
from ._randomise import check_explained, modifier_of
from .base import Curves, EvalBatch, register_metric
from .correlation import spearman
from .smooth_mprt import NOMINAL_LEVELS

#: a correlation this close to 1 counts as "the map did not change"
UNCHANGED = 1 - 1e-9


def cascade_correlations(explain, modified, images: Tensor, maps: Tensor, targets: Tensor, *, seed: int = 0,
                         absolute: bool = False) -> Tensor:
    """Spearman correlation of each image's map with the map of the model randomised down to each level, top first
    [B, levels] (float64, as :func:`~vitexplain.metrics.correlation.spearman` gives it).

    Args:
        explain: (images, targets) -> maps, the method under test (run on the changed model within ``modified``).
        modified: :attr:`EvalBatch.modified`.
        images, maps, targets: the batch's images, the method's maps of them on the trained model, their classes.
        seed: seeds the re-initialisation: the model at level l is that of levels 0 ... l drawn from ``seed``.
        absolute: compare the absolute values of the maps.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])

    def correlation(change: Randomisation) -> Tensor:
        with modified(change):
            random = check_explained(explain(images, targets), maps, "of the randomised model")
        return spearman(maps.to(random), random, absolute=absolute)

    first = Randomisation(0, seed)
    columns = [correlation(first)]
    columns += [correlation(Randomisation(level, seed)) for level in range(1, len(first.levels))]
    return torch.stack(columns, 1)


def floors(values: dict[str, Tensor]) -> Tensor:
    """Each image's noise floor [n] (float64): its ``seed_floor`` where it has one (a randomised method), else the
    Spearman correlation of its carried ``map`` with the previous image's (the first with the last); NaN on one
    image of a deterministic method (no other image to compare with)."""
    seed_floor = values["seed_floor"].double()
    deterministic = seed_floor.isnan()
    if not deterministic.any():
        return seed_floor
    maps = values["map"]
    if maps.shape[0] < 2:
        return torch.full_like(seed_floor, float("nan"))
    image = spearman(maps, maps.roll(1, 0)).double()
    return torch.where(deterministic, image, seed_floor)


def reduce_model_randomisation(values: dict[str, Tensor]) -> dict[str, float]:
    last = values["correlation"].double()[:, -1]
    floor = floors(values)
    return {"excess": (last - floor).mean().item(), "correlation": last.mean().item(), "floor": floor.mean().item(),
            "unchanged": (last >= UNCHANGED).double().mean().item()}


@register_metric(
    "model_randomisation",
    reduce=reduce_model_randomisation,
    requires=("explain", "model"),
    higher_is_better={"excess": False, "correlation": False},
    # one explanation per level (a ViT-B's 14), and a randomised method's map with another seed (its floor)
    cost=lambda options, method: (NOMINAL_LEVELS + 1) * method,
    group="randomisation",
    curves=Curves(lambda options, points: [float(k) for k in range(1, points + 1)],
                  "levels of the model randomised, top first (head, blocks from the last, embedding)",
                  {"correlation": "Spearman correlation of the trained and the randomised model's maps"}),
    carried=("map",),
)
def _compute(batch: EvalBatch, *, seed: int = 0, absolute: bool = False) -> dict[str, Tensor]:
    modified = modifier_of(batch, "model_randomisation")
    correlation = cascade_correlations(batch.explain, modified, batch.images, batch.maps, batch.targets, seed=seed,
                                       absolute=absolute)
    maps = check_maps(batch.maps.to(batch.images.device), batch.images.shape[0])
    if batch.randomised:
        other = check_explained(batch.explain(batch.images, batch.targets, seed=derived_seed(seed, 0)), maps,
                                "with another seed")
        seed_floor = spearman(maps, other.to(maps), absolute=absolute)
    else:
        seed_floor = torch.full((maps.shape[0],), float("nan"), dtype=correlation.dtype, device=maps.device)
    shown = maps.abs() if absolute else maps
    return {"correlation": correlation, "seed_floor": seed_floor, "map": shown.flatten(1).float()}
