"""Pixel flipping: the explained class's probability while the most relevant pixels are removed, a step of pixels
at a time (Bach, Binder, Montavon, Klauschen, Müller & Samek, "On Pixel-Wise Explanations for Non-Linear Classifier
Decisions by Layer-Wise Relevance Propagation", PLoS ONE 10(7), 2015, the pixel-flipping experiments), as Quantus's
``PixelFlipping`` computes it.

The paper flips the pixels of highest relevance first and follows the classifier's score: a faithful map makes it
fall fast. Quantus's ``PixelFlipping`` removes ``features_in_step`` input entries a step, most relevant first and
cumulatively, fills them with its ``"black"`` baseline and records the class's softmax probability after every step
(no point before the first). That is the deletion curve of insertion / deletion (TIS's code,
:func:`vitexplain.metrics.insertion_deletion.replacement_curves`), whose arithmetic this module reuses:

* the map upsampled bilinearly to the image, its pixels ranked (ties: raster order); ``ceil(H * W / n_steps)``
  pixels, all channels, per step; point s = 1 ... n_steps after s steps (``n_steps`` 224: insertion / deletion's;
  Quantus's default of one input entry a step is n_steps = H * W but for its channels, removed one by one);
* the fill (``fill``): ``"black"`` (default, Quantus's ``perturb_baseline="black"``) = black pixels, the batch's
  ``-mean / std`` (refused without them); ``"zero"``, ``"mean"``, ``"blur"`` as SRG's fills;
* f = the explained class's softmax probability (Quantus's ``softmax=True``);
* per image the curve and its area by RISE's ``auc`` (insertion / deletion's ``curve_auc``: the mean height over
  the n points spread over [0, 1]); Quantus's ``return_auc_per_sample`` is ``np.trapz(curve, dx=1)``, (n - 1) times
  it. Reported ``auc`` (lower is better), the mean over images.

Cost n_steps forwards per image. Quantus's black is the image's minimum: docs/decisions/metrics-latec-faithfulness.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from ..options import AtLeastTwo, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch
from .base import Curves, EvalBatch, even_steps, register_metric
from .insertion_deletion import curve_auc, replacement_curves
from .srg import Fill, fill_images


def pixel_flipping(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                   pixel_mean: Sequence[float] | None = None, pixel_std: Sequence[float] | None = None,
                   n_steps: int = 224, fill: str = "black", batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image pixel-flipping curves and their areas.

    Args:
        forward: the classifier's forward, images -> logits; called without gradients, in chunks of ``batch_size``.
        images: preprocessed images [B, C, H, W].
        maps: explanation maps [B, h, w] (upsampled bilinearly to the images).
        targets: class whose probability is followed (the explained class) [B].
        pixel_mean, pixel_std: per channel, the normalisation the images went through (``fill="black"`` only).
        n_steps: points per curve.
        fill: ``"black"``, ``"zero"``, ``"mean"`` or ``"blur"``.
        batch_size: perturbed images per forward.

    Returns:
        ``curve`` [B, n_steps] (probabilities) and ``auc`` [B].
    """
    check_image_batch(images)
    curve = replacement_curves(forward, images, maps, targets, lambda checked: fill_images(checked, fill, pixel_mean,
                                                                                          pixel_std),
                               n_steps=n_steps, batch_size=batch_size, orders=("deletion",))["deletion"]
    return {"curve": curve, "auc": curve_auc(curve.double()).float()}


reduce_pixel_flipping = Means(auc="auc")


@register_metric(
    "pixel_flipping",
    reduce=reduce_pixel_flipping,
    higher_is_better={"auc": False},
    cost=lambda options, method: options["n_steps"],
    group="faithfulness",
    # s / n_steps: exact when n_steps divides the pixels (else the last step is shorter)
    curves=Curves(lambda options, points: even_steps(1, points, options["n_steps"]),
                  "share of the pixels removed, most relevant first (no point at 0, as in Quantus)",
                  {"curve": "probability of the explained class, most relevant pixels removed first"}),
    reference=("latec", "quantus"),
    departures="Quantus flips single channel values (LATEC: 224 a step) into the image's minimum and sums the curve "
               "in steps; ours flips whole pixels in 224 steps into true black and reports the mean height over [0, "
               "1] (insertion / deletion's deletion curve). The curves agree with Quantus's to 0.003, where a step "
               "cuts tied pixels.",
)
def _compute(batch: EvalBatch, *, n_steps: AtLeastTwo = 224, fill: Fill = "black",
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return pixel_flipping(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                          pixel_std=batch.std, n_steps=n_steps, fill=fill, batch_size=batch_size)
