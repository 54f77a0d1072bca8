"""ROAD: Remove And Debias (Rong, Leemann, Borisov, Kasneci & Kasneci, ICML 2022, "A Consistent and Efficient
Evaluation Strategy for Attribution Methods").

Removing pixels by setting them to a constant leaks the removal mask into the image: the model can
read *where* pixels were removed, and so the class, from the shape of the hole (the paper's "class
information leakage"), and MoRF and LeRF then rank methods inconsistently. ROAD replaces the removed
pixels by a *noisy linear imputation* and needs no retraining. This follows
``road/imputations.py`` (``NoisyLinearImputer``) and ``road/imputed_dataset.py`` of tleemann/road_evaluation:

* every removed pixel i becomes the weighted mean of its 8 neighbours inside the image, removed or
  not, with weight 1/6 for the 4 sharing an edge and 1/12 for the 4 diagonal ones. The removed
  pixels are coupled into one sparse linear system per image, shared by the channels:
  d_i x_i - sum_{j removed} w_ij x_j = sum_{j kept} w_ij x_j, with d_i = sum_j w_ij over the
  neighbours inside the image (symmetric positive definite while a pixel is kept); then Gaussian
  noise of standard deviation ``noise`` (0.01, the authors' default) is added to the removed pixels;
* as in the authors' code the imputation works on pixel values in [0, 1], before normalisation: the
  images are un-normalised with the batch's ``mean`` / ``std``, imputed, and normalised again;
* pixels are ranked on the map upsampled bilinearly and min-max normalised (the authors min-max
  normalise too); MoRF at fraction f removes the ``int(H * W * f)`` most relevant pixels, LeRF keeps
  the ``int(H * W * (1 - f))`` most relevant and removes the others (the authors' code parametrises
  LeRF by the share kept); fractions 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9 (the authors' runs);
* score = softmax probability of the explained class, as their ``road_eval``'s average probability of
  the class the map explains.

Where the authors' code is random or silent (ours, docs/decisions/metrics.md): ties in the map are
removed in raster order, as in every other protocol here (the authors add a fixed 1e-4 Gaussian jitter);
the noise is one seeded draw of the image's shape (``seeding.seeded_draw``) shared by every image,
fraction and order, so no value depends on the batch; reported per order is the mean of the curve over
the fractions.

The ``solver`` option says how the system is solved, in float64 either way. ``"lu"``: exactly on the CPU
(SciPy's sparse LU, one factorisation per image and fraction for all channels: 4 to 90 ms for a 112 x 112
image with 10 to 90 % removed), the imputed images then going back to the model's device. ``"cg"``: by
Jacobi-preconditioned conjugate gradients for the whole chunk of images and channels at once, matrix-free, on
the images' device (``_stencil_cg.py``), to a relative residual of 1e-10, which agrees with the exact solve to
about 1e-9 in pixel units. ``"auto"`` (the default) takes CG on a CUDA device and LU elsewhere, as on CPUs
the batched solve is many times slower than SciPy's (docs/decisions/metrics.md, ROAD).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch
from scipy.sparse import csc_matrix
from scipy.sparse.linalg import splu
from torch import Tensor

from ..options import NonNegative, OpenShare, PositiveInt
from ..seeding import seeded_draw
from ._common import check_image_batch, check_maps, check_targets
from ._perturb import mixed_logits, normalisation, ranked_by_relevance
from ._stencil_cg import conjugate_gradient_imputation
from .base import Curves, EvalBatch, register_metric

#: the removal fractions of the authors' runs (``noretrain_params.json``, RoadBenchmarkDemo.ipynb)
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9)
#: (row offset, column offset, weight) of the 8 neighbours in the imputation
NEIGHBOURS = ((-1, -1, 1 / 12), (-1, 0, 1 / 6), (-1, 1, 1 / 12), (0, -1, 1 / 6), (0, 1, 1 / 6),
              (1, -1, 1 / 12), (1, 0, 1 / 6), (1, 1, 1 / 12))
#: how the system is solved: ``"lu"`` exactly on the CPU, ``"cg"`` by conjugate gradients on the images' device,
#: ``"auto"`` the second on a CUDA device and the first elsewhere
Solver = Literal["auto", "lu", "cg"]


def _on_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def chosen_solver(solver: Solver, device: torch.device) -> str:
    """``"lu"`` or ``"cg"``: ``solver`` itself, or for ``"auto"`` the one suited to ``device``."""
    if solver == "auto":
        return "cg" if _on_cuda(device) else "lu"
    return solver


def linear_imputation(images: Tensor, removed: Tensor, solver: Solver = "auto") -> Tensor:
    """``images`` [N, C, H, W] with their ``removed`` pixels [N, H, W] (bool) imputed, without noise.

    Solves the module docstring's system in float64, with ``solver`` (see :data:`Solver`): exactly on the CPU
    by SciPy's LU, as many images at once as torch has threads (the same values as one at a time), or by
    conjugate gradients on the images' device for the whole batch (``_stencil_cg.py``); the result has the
    images' device and dtype. An image needs at least one kept pixel.
    """
    if removed.reshape(images.shape[0], -1).all(1).any():
        raise ValueError("linear imputation needs at least one kept pixel per image; a fraction must be below 1")
    if chosen_solver(solver, images.device) == "cg":
        filled, _ = conjugate_gradient_imputation(images.detach(), removed.to(images.device), NEIGHBOURS)
        return filled.to(images.dtype)
    height, width = images.shape[-2:]
    neighbour, weight = _neighbour_table(height, width)
    pixels = images.detach().to("cpu", torch.float64).flatten(2).numpy()
    gone = removed.detach().cpu().reshape(images.shape[0], -1).numpy()
    filled = pixels.copy()

    def fill(row: int) -> None:
        unknown = np.flatnonzero(gone[row])
        if unknown.size:
            filled[row][:, unknown] = _solve(pixels[row], gone[row], unknown, neighbour, weight).T

    # SuperLU releases the GIL while it factorises: the images' systems are solved side by side on torch's threads
    with ThreadPoolExecutor(max(1, min(torch.get_num_threads(), len(filled)))) as pool:
        list(pool.map(fill, range(len(filled))))
    return torch.from_numpy(filled).view(images.shape).to(images.device, images.dtype)


def _neighbour_table(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For every pixel (row-major), its 8 neighbours' indices and weights [H*W, 8] (weight 0 outside the image)."""
    row, column = np.divmod(np.arange(height * width), width)
    indices, weights = [], []
    for d_row, d_column, w in NEIGHBOURS:
        r, c = row + d_row, column + d_column
        inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        indices.append(np.where(inside, r * width + c, 0))
        weights.append(np.where(inside, w, 0.0))
    return np.stack(indices, 1), np.stack(weights, 1)


def _solve(values: np.ndarray, removed: np.ndarray, unknown: np.ndarray, neighbour: np.ndarray,
           weight: np.ndarray) -> np.ndarray:
    """The imputed values [n, C] of the ``unknown`` pixels of one image ``values`` [C, H*W]."""
    count = unknown.size
    variable = np.full(removed.size, -1)
    variable[unknown] = np.arange(count)
    near, w = neighbour[unknown], weight[unknown]
    coupled = removed[near] & (w > 0)
    known_sum = np.einsum("nk,cnk->nc", np.where(coupled, 0.0, w), values[:, near])
    equation = np.broadcast_to(np.arange(count)[:, None], near.shape)[coupled]
    diagonal = np.arange(count)
    matrix = csc_matrix((np.concatenate([-w[coupled], w.sum(1)]),
                         (np.concatenate([equation, diagonal]), np.concatenate([variable[near[coupled]], diagonal]))),
                        shape=(count, count))
    return splu(matrix, permc_spec="MMD_AT_PLUS_A", options={"SymmetricMode": True}).solve(known_sum)


def road(forward: Callable[[Tensor], Tensor], images: Tensor, maps: Tensor, targets: Tensor, *,
         pixel_mean: Sequence[float], pixel_std: Sequence[float], fractions: Sequence[float] = FRACTIONS,
         noise: float = 0.01, batch_size: int = 128, seed: int = 0, solver: Solver = "auto") -> dict[str, Tensor]:
    """Per-image ROAD curves, most and least relevant first.

    Args:
        forward, images, maps, pixel_mean, pixel_std, batch_size: as in
            :func:`vitexplain.metrics.perturbation.perturbation_test` (the imputation and its noise work
            on pixel values, as the authors').
        targets: class whose probability is followed (the explained class) [B].
        fractions: shares of the pixels removed, each in [0, 1).
        noise: standard deviation of the Gaussian noise on imputed pixels, in pixel units ([0, 1] range).
        seed: seed of the noise.
        solver: how the imputation's system is solved (:data:`Solver`; the same values to ~1e-9 in pixel units).

    Returns:
        ``morf`` and ``lerf``: [B, len(fractions)] probabilities of the explained class.
    """
    check_image_batch(images)
    maps = check_maps(maps.to(images.device), images.shape[0])
    targets = check_targets(targets, images)
    mean, std = normalisation(images, pixel_mean, pixel_std)
    pixels = images * std + mean
    jitter = noise * seeded_draw(seed, lambda generator: torch.randn(images.shape[1:], generator=generator),
                                 images.device).to(images.dtype)

    def imputed(image: Tensor, taken: Tensor) -> Tensor:
        return (linear_imputation(pixels[image], taken[:, 0], solver) + jitter - mean) / std

    count = images.shape[-2] * images.shape[-1]
    index = targets[:, None, None].expand(-1, len(fractions), 1)
    curves = {}
    for name, most_relevant_first in (("morf", True), ("lerf", False)):
        removed = [int(count * f) if most_relevant_first else count - int(count * (1 - f)) for f in fractions]
        rank = ranked_by_relevance(maps, images, most_relevant_first)
        logits = mixed_logits(forward, images, imputed, rank, torch.tensor(removed), batch_size)
        curves[name] = logits.float().softmax(-1).gather(2, index)[..., 0]
    return curves


def reduce_road(values: dict[str, Tensor]) -> dict[str, float]:
    """Mean over fractions and images: MoRF (lower is better), LeRF (higher is better), and their gap."""
    morf = values["morf"].to(torch.float64).mean().item()
    lerf = values["lerf"].to(torch.float64).mean().item()
    return {"morf": morf, "lerf": lerf, "lerf_minus_morf": lerf - morf}


@register_metric(
    "road",
    reduce=reduce_road,
    higher_is_better={"morf": False, "lerf": True, "lerf_minus_morf": True},
    cost=lambda options, method: 2 * len(options["fractions"]),
    group="faithfulness",
    curves=Curves(lambda options, points: [float(f) for f in options["fractions"]],
                  "share of the pixels imputed (noisy linear imputation)",
                  {"morf": "probability of the explained class, most relevant imputed first (MoRF)",
                   "lerf": "probability of the explained class, least relevant imputed first (LeRF)"}),
    reference=("latec", "quantus"),
    departures="Quantus's ROAD (LATEC: noise 0.1, 1 … 99 % in steps of 2) removes the most relevant pixels only, "
               "imputes the normalised image with fresh NumPy noise and scores whether the top class stays the "
               "label; ours follows the authors' code: both orders at their seven fractions, imputation in pixel "
               "units with noise 0.01 drawn once from `seed`, the explained class's probability.",
)
def _compute(batch: EvalBatch, *, fractions: Sequence[OpenShare] = FRACTIONS, noise: NonNegative = 0.01,
             batch_size: PositiveInt = 128, seed: int = 0, solver: Solver = "auto") -> dict[str, Tensor]:
    return road(batch.logits, batch.images, batch.maps, batch.targets, pixel_mean=batch.mean, pixel_std=batch.std,
                fractions=fractions, noise=noise, batch_size=batch_size, seed=seed, solver=solver)
