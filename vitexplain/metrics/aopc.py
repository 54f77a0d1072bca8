"""Impact on probability: AOPC and log-odds while the most relevant pixels are removed (TokenTM Table 5).

TokenTM (Wu et al., CVPR 2024) Sec. 5.2 "Impact on Probability" reports the Area Over the
Perturbation Curve (AOPC, higher is better) and the log-odds score (LOdds, lower is better) "w.r.t.
the predicted label", citing Shrikumar et al. 2017, Nguyen 2018 and Chen et al. 2020, and gives no
further detail (no public code). Implemented as those references define them, on the pixel removal
of TokenTM's own perturbation test (:mod:`vitexplain.metrics.perturbation`, Chefer et al.'s protocol):

* x^(k) = the image with the first ``int(H * W * k / K)`` pixels of the explanation's ranking (most
  relevant first) set to black, k = 0 ... K - 1 (0 %, 10 %, ..., 90 % for K = 10); x^(0) = x;
* per image, with p = softmax probability of the explained class c (the predicted class when the
  maps explain the prediction, as in TokenTM):
  drop_k = p_c(x) - p_c(x^(k)) and log_odds_k = log(p_c(x^(k)) / p_c(x)) (from log-softmax, so it is
  finite even when a probability underflows);
* AOPC = 1 / K * sum_k <drop_k> over the K levels including the unperturbed one, whose drop is 0
  (Samek et al. 2017 / Nguyen 2018: 1 / (L + 1) * sum_{k=0}^{L}); LOdds = the mean of <log_odds_k>
  over the same K levels (Chen et al. 2020 define it at one level; TokenTM does not say which, so
  the whole curve is averaged, like AOPC). <.> is the mean over images.

Both are fractions (probabilities / natural-log odds), as in TokenTM's Table 5.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from ..options import AtLeastTwo, PositiveInt
from ..uncertainty import Means
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import black_pixel, mixed_logits, ranked_by_relevance, removal_counts
from .base import Curves, EvalBatch, even_steps, register_metric


def aopc_log_odds(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
                  pixel_mean: Sequence[float], pixel_std: Sequence[float], n_steps: int = 10,
                  batch_size: int = 128) -> dict[str, Tensor]:
    """Per-image probability drops and log-odds at every removal level.

    Args:
        forward, images, maps, pixel_mean, pixel_std, n_steps, batch_size: as in
            :func:`vitexplain.metrics.perturbation.perturbation_test`.
        targets: class whose probability is followed (the explained class) [B].

    Returns:
        ``probability_drop`` and ``log_odds``: [B, n_steps] (both 0 at the first, unperturbed level).
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    counts = removal_counts(images.shape[-2] * images.shape[-1], n_steps)
    rank = ranked_by_relevance(maps, images, most_relevant_first=True)
    return drops_along(forward, images, rank, counts, targets, pixel_mean=pixel_mean, pixel_std=pixel_std,
                       batch_size=batch_size)


def drops_along(forward: Callable[[Tensor], Tensor], images: Tensor, rank: Tensor, counts: Tensor, targets: Tensor, *,
                pixel_mean: Sequence[float], pixel_std: Sequence[float], batch_size: int = 128) -> dict[str, Tensor]:
    """The explained class's probability drops and log-odds along a removal order (AOPC's arithmetic, shared with
    :mod:`vitexplain.metrics.naopc`, which ranks patches instead of pixels).

    Args:
        rank: removal rank of every pixel [B, H*W] (``_common.removal_rank``; a patch's pixels may share one).
        counts: at level k the pixels of rank below ``counts[k]`` are black [K] (long, CPU); ``counts[0]`` = 0.
        forward, images, targets, pixel_mean, pixel_std, batch_size: as in :func:`aopc_log_odds`.

    Returns:
        ``probability_drop`` p_c(x) - p_c(x^(k)) and ``log_odds`` log(p_c(x^(k)) / p_c(x)), [B, K].
    """
    logits = mixed_logits(forward, images, black_pixel(images, pixel_mean, pixel_std), rank, counts, batch_size)
    log_p = logits.float().log_softmax(-1).gather(2, targets[:, None, None].expand(-1, counts.shape[0], 1))[..., 0]
    return {"probability_drop": log_p[:, :1].exp() - log_p.exp(), "log_odds": log_p - log_p[:, :1]}


reduce_aopc = Means(aopc="probability_drop", log_odds="log_odds")


@register_metric(
    "aopc",
    reduce=reduce_aopc,
    higher_is_better={"aopc": True, "log_odds": False},
    cost=lambda options, method: options["n_steps"],
    group="faithfulness",
    curves=Curves(lambda options, points: even_steps(0, points, options["n_steps"]),
                  "share of the most relevant pixels set to black (0 = the image itself)",
                  {"probability_drop": "drop of the explained class's probability",
                   "log_odds": "log(p / p of the image itself), explained class"}),
)
def _compute(batch: EvalBatch, *, n_steps: AtLeastTwo = 10,
             batch_size: PositiveInt = 128) -> dict[str, Tensor]:
    return aopc_log_odds(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean,
                         pixel_std=batch.std, n_steps=n_steps, batch_size=batch_size)
