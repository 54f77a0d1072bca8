"""ROAD's noisy linear imputation: SciPy's LU on the CPU against batched conjugate gradients on the device.

    python benchmarks/road_imputation.py                      # CPU, 20 images at 112 and 224 px
    python benchmarks/road_imputation.py --device cuda --batch 128

A batch mixes what one chunk of ROAD's forwards imputes: image k has the removal mask of ROAD's fraction
k mod 7 (0.1 ... 0.9), most relevant first for even k and least relevant first for odd k, ranked on a random
14 x 14 token map upsampled (as a ViT-B/16 map is). Both solvers are timed through
:func:`vitexplain.metrics.road.linear_imputation` as ROAD calls it (float32 images on ``--device``, transfers
included), interleaved round by round; printed per size: the median seconds of each, their ratio, the
conjugate-gradient iterations and the largest difference of the imputed pixels (pixel units, [0, 1]; imputed
in float64 for this, so float32's rounding does not hide it).
``--per-fraction`` adds one row per fraction (every image of the batch at that fraction, most relevant first).
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from vitexplain.metrics._perturb import ranked_by_relevance
from vitexplain.metrics._stencil_cg import conjugate_gradient_imputation
from vitexplain.metrics.road import FRACTIONS, NEIGHBOURS, linear_imputation

from common import describe_machine, interleaved


def smooth_images(batch: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Random images in [0, 1] with some spatial correlation (a 5 x 5 box blur of uniform noise)."""
    noise = torch.rand(batch, 3, size + 4, size + 4, generator=generator)
    return F.avg_pool2d(noise, 5, 1)


def road_masks(batch: int, size: int, fractions: list[float], generator: torch.Generator) -> torch.Tensor:
    """Removal masks [batch, size, size]: image k at fraction k mod len(fractions), MoRF for even k, LeRF odd."""
    maps = torch.rand(batch, 14, 14, generator=generator)
    dummy = torch.empty(batch, 1, size, size)
    most, least = ranked_by_relevance(maps, dummy, True), ranked_by_relevance(maps, dummy, False)
    count = size * size
    masks = []
    for k in range(batch):
        f = fractions[k % len(fractions)]
        if k % 2 == 0 or len(fractions) == 1:
            masks.append(most[k] < int(count * f))
        else:
            masks.append(least[k] < count - int(count * (1 - f)))
    return torch.stack(masks).view(batch, size, size)


def compare(images: torch.Tensor, removed: torch.Tensor, device: torch.device, repeats: int) -> str:
    times = interleaved({"lu": lambda: linear_imputation(images, removed, solver="lu"),
                         "cg": lambda: linear_imputation(images, removed, solver="cg")}, device, repeats)
    lu, cg = (statistics.median(times[name]) for name in ("lu", "cg"))
    _, iterations = conjugate_gradient_imputation(images, removed, NEIGHBOURS)
    exact = images.double()                                   # the solvers' own difference, not float32's rounding
    gap = (linear_imputation(exact, removed, solver="cg") - linear_imputation(exact, removed, solver="lu")).abs().max()
    return f"{lu:9.3f} {cg:9.3f} {lu / cg:9.2f} {iterations:6d} {gap.item():10.1e}"


def table(device: torch.device, batch: int, sizes: list[int], repeats: int, per_fraction: bool = False) -> None:
    """Print the comparison (see the module docstring), one row per image size (and fraction)."""
    generator = torch.Generator().manual_seed(0)
    print(f"{batch} images per call; seconds per call (median of {repeats})")
    print(f"{'size':>5} {'removed':>10} {'LU (CPU)':>9} {'CG':>9} {'LU / CG':>9} {'iters':>6} {'max |diff|':>10}")
    for size in sizes:
        images = smooth_images(batch, size, generator).to(device)
        rows = [("mixed", list(FRACTIONS))] + ([(f"{f:.0%}", [f]) for f in FRACTIONS] if per_fraction else [])
        for label, fractions in rows:
            removed = road_masks(batch, size, fractions, generator).to(device)
            print(f"{size:5d} {label:>10} {compare(images, removed, device, repeats)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=20, help="images imputed at once (ROAD's chunk: its batch_size)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[112, 224])
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    parser.add_argument("--per-fraction", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(describe_machine(device))
    table(device, args.batch, args.sizes, args.repeats, args.per_fraction)


if __name__ == "__main__":
    main()
