"""The real bench at ImageNet-Segmentation size: images/s per phase and the projected wall time (issue 34, item 4).

    python benchmarks/bench_scale.py                               # CPU: a 64-image slice, ViT-Ti
    python benchmarks/bench_scale.py --device cuda                 # GPU: the whole set, ViT-B/16
    python benchmarks/bench_scale.py --torchrun 2                  # 2 processes against 1, same results?
    python benchmarks/bench_scale.py --torchrun 2 --images 4 --batch-size 1 --threads 1   # bitwise identity

The set is generated, the size of ImageNet-Segmentation's 4,276 test images at 224 px (Guillaumin et
al.'s masks, as Chefer et al. and TokenTM / GradToken use them): each image noise with a brighter
ellipse, the ellipse as its mask, a label drawn per image; the model has random weights (nothing is
downloaded). The bench runs the single-pass methods with the segmentation test and both perturbation
tests (positive and negative), as the papers' Table 1 and 2 do, through ``run_benchmark`` itself: the
phases' times are the bench's own (``BenchResult.timings``). A slice of N images projects to the
whole set by its per-image time. What no phase times (start-up and reports, but also the prediction
that picks each batch's target, generating the images and writing the cache, which grow with the
images) is projected both as fixed and as per-image: the projection is a range.

``--torchrun N`` runs the bench under ``torchrun`` with 1 and with N processes, one after the other,
each process with the CPU cores shared out as threads (``--threads`` sets them), reports the 1-process
run's phases, the two wall times and every score compared bitwise. A batch of other images or another
thread count can round an image's maps differently in the last bits (the CPU's matrix kernels block
the work by shape and thread), so scores that rank pixels (the segmentation test's mean threshold and
AP) may differ in their last digits; with ``--batch-size 1`` and equal ``--threads`` every image is
computed alike in both runs and the scores are bitwise identical. Nothing here is a test.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

IMAGENET_SEG_IMAGES = 4276
SINGLE_PASS = ["raw_attention", "rollout", "attn_gradcam", "gae", "gradtoken", "tokentm"]
METRICS = ["segmentation", {"name": "perturbation", "options": {"direction": "both"}}]


class GeneratedSegmentation(Dataset):
    """``size`` images of 224 px, each noise with a brighter ellipse (its mask) and a label, made from its index."""

    provides = ("masks",)

    def __init__(self, size: int, pixels: int = 224, classes: int = 1000):
        self.size, self.pixels, self.classes = size, pixels, classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        generator = torch.Generator().manual_seed(index)
        image = 0.5 * torch.randn(3, self.pixels, self.pixels, generator=generator)
        centre = torch.rand(2, generator=generator) * 0.5 + 0.25
        radii = torch.rand(2, generator=generator) * 0.2 + 0.1
        grid = (torch.arange(self.pixels) + 0.5) / self.pixels
        inside = ((grid[:, None] - centre[0]) / radii[0]) ** 2 + ((grid[None, :] - centre[1]) / radii[1]) ** 2 <= 1
        image[:, inside] += 1.0
        label = int(torch.randint(0, self.classes, (1,), generator=generator))
        return {"image": image, "label": label, "id": f"generated-{index:05d}", "mask": inside}


def run(args: argparse.Namespace) -> dict:
    """One bench run (this process, or one rank of torchrun); the rank-0 summary as a dict."""
    import timm

    from vitexplain.bench import BenchConfig, run_benchmark

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, num_classes=1000).eval()
    config = BenchConfig(models={args.model: model}, methods=SINGLE_PASS, metrics=METRICS,
                         dataset=GeneratedSegmentation(args.images), batch_size=args.batch_size,
                         output_dir=args.output, device=args.device, progress=False, gallery=0, sanity=None,
                         target="predicted", precision=args.precision)
    started = time.perf_counter()
    result = run_benchmark(config)
    return {"wall": time.perf_counter() - started, "timings": result.timings.get(args.model, {}),
            "scores": result.scores, "errors": len(result.errors), "images": args.images}


def report(found: dict, images: int, total: int) -> None:
    phases: dict[str, float] = {}
    for spent in found["timings"].values():
        for phase, seconds in spent.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    timed = sum(phases.values())
    print(f"{images} images, {len(SINGLE_PASS)} methods; wall {found['wall']:.1f} s, of which the bench's timed phases "
          f"{timed:.1f} s ({found['errors']} errors); images/s: images through the phase for all the methods")
    print(f"{'phase':24s} {'seconds':>9s} {'images/s':>10s} {'projected to ' + str(total):>18s}")
    for phase, seconds in sorted(phases.items(), key=lambda item: -item[1]):
        per_image = seconds / images
        print(f"{phase:24s} {seconds:9.2f} {images / seconds if seconds else math.inf:10.3g} "
              f"{per_image * total / 60:15.1f} min")
    untimed = found["wall"] - timed
    fixed = timed / images * total + untimed
    scaled = found["wall"] / images * total
    print(f"{'untimed':24s} {untimed:9.2f} {'':10s} {untimed / 60:15.1f} min to "
          f"{untimed / images * total / 60:.1f} min")
    print(f"projected wall time for {total} images: {fixed / 60:.1f} min (the untimed part fixed) to "
          f"{scaled / 60:.1f} min (all of it per image); goal on one H100: under 10 min")


def compare_torchrun(args: argparse.Namespace, processes: int) -> dict:
    """The same bench in 1 and in ``processes`` torchrun processes, one after the other (separate outputs): wall
    times and whether every score is identical. Returns the 1-process run's findings (for :func:`report`)."""
    found = {}
    for count in (1, processes):
        with tempfile.TemporaryDirectory() as folder:
            summary = Path(folder) / "summary.json"
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={count}", __file__,
                       "--worker", str(summary), "--model", args.model, "--images", str(args.images),
                       "--batch-size", str(args.batch_size), "--device", args.device, "--output",
                       str(Path(folder) / "bench"), "--precision", args.precision]
            threads = args.threads or max(1, (os.cpu_count() or 1) // count)   # default: the cores shared out
            started = time.perf_counter()
            subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
            found[count] = {**json.loads(summary.read_text()), "launched": time.perf_counter() - started}
    walls = {count: found[count]["launched"] for count in found}
    differences = _differences(found[1]["scores"], found[processes]["scores"])
    largest = max(differences.values(), default=0.0)
    print(f"torchrun: 1 process {walls[1]:.1f} s, {processes} processes {walls[processes]:.1f} s (launch to exit): "
          f"speed-up {walls[1] / walls[processes]:.2f}x; run_benchmark alone {found[1]['wall']:.1f} s against "
          f"{found[processes]['wall']:.1f} s: {found[1]['wall'] / found[processes]['wall']:.2f}x")
    print(f"identical scores: {not differences} ({_count(found[1]['scores'])} numbers compared bitwise, "
          f"{len(differences)} differ, largest difference {largest:.3g})")
    for where, difference in sorted(differences.items(), key=lambda item: -item[1])[:5]:
        print(f"  {where}: {difference:.3g}")
    return found[1]


def _count(scores) -> int:
    return sum(_count(value) for value in scores.values()) if isinstance(scores, dict) else 1


def _differences(first, second, where: str = "") -> dict[str, float]:
    """Every number of two nested score mappings that differs: its path and the absolute difference."""
    if isinstance(first, dict) and isinstance(second, dict):
        found = {}
        for key in sorted(set(first) | set(second)):
            found.update(_differences(first.get(key), second.get(key), f"{where}/{key}"))
        return found
    if isinstance(first, (int, float)) and isinstance(second, (int, float)):
        same = first == second or (math.isnan(first) and math.isnan(second))
        return {} if same else {where: abs(first - second)}
    return {} if first == second else {where: math.inf}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if gpu else "cpu")
    parser.add_argument("--model", help="timm name (default: vit_base_patch16_224 on a GPU, vit_tiny_patch16_224 on "
                                        "the CPU)")
    parser.add_argument("--images", type=int, help=f"images benchmarked (default: all {IMAGENET_SEG_IMAGES} on a "
                                                   "GPU, 64 on the CPU)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--output", help="bench output folder (default: a temporary one)")
    parser.add_argument("--torchrun", type=int, default=0, metavar="N",
                        help="run the bench in N torchrun processes against one: times, scores compared")
    parser.add_argument("--threads", type=int, default=0,
                        help="with --torchrun: threads of every process (default: the CPU cores shared out)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    args.model = args.model or ("vit_base_patch16_224" if on_gpu else "vit_tiny_patch16_224")
    args.images = args.images or (IMAGENET_SEG_IMAGES if on_gpu else 64)
    if args.worker:                                   # one rank of compare_torchrun
        found = run(args)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.worker).write_text(json.dumps(found))
        return
    where = torch.cuda.get_device_name() if on_gpu else f"{os.cpu_count()} CPU cores"
    print(f"device {args.device} ({where}), {args.model}, random weights, torch {torch.__version__}; "
          f"load average {_load()}")
    if args.torchrun:                                 # its 1-process run is the run reported
        found = compare_torchrun(args, args.torchrun)
    else:
        with tempfile.TemporaryDirectory() as folder:
            args.output = args.output or str(Path(folder) / "bench")
            found = run(args)
    report(found, args.images, IMAGENET_SEG_IMAGES)
    print(f"load average at the end {_load()}")


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"


if __name__ == "__main__":
    main()
