"""ROAD's imputation system solved by conjugate gradients for a whole batch at once, on the images' device.

The system (vitexplain/metrics/road.py): every removed pixel i satisfies d_i x_i - sum_{j removed} w_ij x_j =
sum_{j kept} w_ij x_j over its neighbours j inside the image, d_i = sum_j w_ij. Its matrix is symmetric positive
definite while the image keeps a pixel, and the same for every channel, so each (image, channel) pair is one
independent SPD system. Here it is never built: the product with a vector on the removed pixels is the
neighbour stencil applied to the whole image (8 shifted views of a zero-padded copy) masked to the removed
pixels, so every image and channel of a batch iterates together (Hestenes & Stiefel 1952, preconditioned CG
with the Jacobi preconditioner 1 / d_i; Saad, "Iterative Methods for Sparse Linear Systems", Algorithm 9.1).

Float64 throughout: for a hole of width D pixels the matrix's condition number grows as D^2 (of order 10^4 to
10^5 for a 224 px image with 90 % removed), and float32's rounding leaves the solution 1e-4 off the exact one
whatever the tolerance, while float64 at 1e-10 lands within ~1e-9 (measurements in docs/decisions/metrics.md,
ROAD).

Each system stops on its own (its step is zeroed once its residual is below the tolerance), so a value does not
depend on which other images share the batch; the host checks for convergence only every
``CHECK_EVERY`` iterations, so a GPU is not synchronised at every step.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

#: default relative residual ||b - A x|| / ||b|| at which a system stops (see the module docstring)
TOLERANCE = 1e-10
#: the residual recomputed from the solution (b - A x) may exceed the updated one by rounding: this factor is allowed
TRUE_RESIDUAL_SLACK = 10.0
#: iterations between two host-side checks that every system has converged
CHECK_EVERY = 16


def iteration_cap(height: int, width: int) -> int:
    """Default iteration limit: CG's iterations grow with the square root of the condition number, i.e. with
    the width of the largest hole, at most the image's; 8 (H + W) is several times what 90 % holes need."""
    return 8 * (height + width) + 100


def conjugate_gradient_imputation(pixels: Tensor, removed: Tensor, neighbours: Sequence[tuple[int, int, float]], *,
                                  tolerance: float = TOLERANCE, max_iterations: int | None = None
                                  ) -> tuple[Tensor, int]:
    """``pixels`` [N, C, H, W] with their ``removed`` pixels [N, H, W] (bool) replaced by the system's solution,
    and the iterations it took (a multiple of ``CHECK_EVERY``, or the limit).

    ``neighbours``: (row offset, column offset, weight) of the stencil. Works in float64 on the pixels' device
    and returns float64. Raises RuntimeError naming the worst residual if, after ``max_iterations`` (default
    :func:`iteration_cap`), the residual recomputed from some system's solution exceeds ``TRUE_RESIDUAL_SLACK``
    times ``tolerance``.
    """
    height, width = pixels.shape[-2:]
    values = pixels.to(torch.float64)
    gone = removed[:, None].to(values)
    limit = iteration_cap(height, width) if max_iterations is None else max_iterations

    def weighted_sum(u: Tensor) -> Tensor:
        """sum_j w_ij u_j over the neighbours j of every pixel i inside the image."""
        padded = F.pad(u, (1, 1, 1, 1))
        views = [(padded[..., 1 + d_row:1 + d_row + height, 1 + d_column:1 + d_column + width], weight)
                 for d_row, d_column, weight in neighbours]
        total = views[0][0] * views[0][1]
        for view, weight in views[1:]:
            total.add_(view, alpha=weight)
        return total

    def system(u: Tensor) -> Tensor:
        """The matrix times ``u`` (zero on the kept pixels), on the removed pixels."""
        return gone * (diagonal * u - weighted_sum(u))

    def dot(a: Tensor, b: Tensor) -> Tensor:
        """Per image and channel, sum_i a_i b_i [N, C, 1, 1] (one kernel, no product kept)."""
        return torch.linalg.vecdot(a.flatten(-2), b.flatten(-2))[..., None, None]

    diagonal = weighted_sum(torch.ones_like(values[:1, :1]))
    rhs = gone * weighted_sum(values * (1 - gone))
    threshold = tolerance ** 2 * dot(rhs, rhs)
    solution = torch.zeros_like(values)
    residual = rhs.clone()
    preconditioned = residual / diagonal
    direction = preconditioned.clone()
    product = dot(residual, preconditioned)
    active = dot(residual, residual) > threshold
    iterations = 0
    while iterations < limit and (iterations % CHECK_EVERY or active.any()):
        iterations += 1
        mapped = system(direction)
        step = torch.where(active, product / dot(direction, mapped), 0.0)
        solution.addcmul_(step, direction)
        residual.addcmul_(step, mapped, value=-1)
        preconditioned = residual / diagonal
        renewed = dot(residual, preconditioned)
        direction = preconditioned + torch.where(active, renewed / product, 0.0) * direction
        product = renewed
        active &= dot(residual, residual) > threshold
    true_residual = rhs - system(solution)
    unmet = dot(true_residual, true_residual) > TRUE_RESIDUAL_SLACK ** 2 * threshold
    if unmet.any():
        worst = (dot(true_residual, true_residual) / dot(rhs, rhs)).sqrt()[unmet].max().item()
        raise RuntimeError(f"ROAD's conjugate-gradient imputation did not reach relative residual {tolerance:g} in "
                           f"{limit} iterations ({int(unmet.sum())} of {unmet.numel()} image channels left, worst "
                           f"{worst:.1e}); use solver='lu'")
    return torch.where(gone.bool(), solution, values), iterations
