"""How class-specific each method's maps are on a trained model: a class-token ViT beside an average-pooled twin.

    python benchmarks/class_specificity.py --models digits_vit /path/to/digits_vit_avg.safetensors
    python benchmarks/class_specificity.py --models digits_vit --methods gae tokentm --images 64
    python benchmarks/class_specificity.py --option rise.n_masks=500 --costly-classes 2

For every class-specific method (``available_methods("image")`` with ``class_specific``, controls left out) and
every model, on the first ``--images`` canvases of the digits test split, each image is explained for its
``--classes`` highest-scoring classes (the top-1 first). Per image:

* ``r(top1, top2)``: Pearson correlation of the maps for the top-1 and the top-2 class. 1 means the map does not
  depend on which of the two classes is explained (up to scale); undefined where either map is constant (e.g. an
  all-zero map), counted in ``undefined``.
* ``spread``: the class-dependent part of the map, relative to the map. Each class's map is scaled to a mean
  absolute value of 1 (an all-zero map stays zero), then the standard deviation over the classes is averaged
  over the tokens. 0 means every class gets the same map up to a positive factor; differences of scale alone
  (e.g. LRP conserving different logits) do not count.

Each cell prints the median over the images with a 95 % bootstrap interval of the median (2,000 resamples), and
the lowest and highest image. ``zero maps`` counts the (image, class) maps that are zero everywhere.

Methods whose cost is above ``--costly-passes`` model passes per map (RISE, TIS, ViT-CX, IG, SmoothGrad, the
Beyond-Intuition methods, TAM) are explained for ``--costly-classes`` classes only, to keep a CPU run short;
``--option method.name=value`` changes a method's option (printed above the table).
"""
from __future__ import annotations

import argparse
import ast
import time
import warnings

import torch

import vitexplain
from vitexplain import get_method
from vitexplain.datasets import get_dataset
from vitexplain.models import load_model

from common import describe_machine


def class_specific_methods() -> list[str]:
    """The image methods registered as class-specific, controls left out."""
    return [name for name in vitexplain.available_methods("image", controls=False) if get_method(name).class_specific]


def pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row Pearson correlation of [B, ...] maps; NaN where either row is constant."""
    a, b = a.flatten(1).double(), b.flatten(1).double()
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    denominator = a.norm(dim=1) * b.norm(dim=1)
    return torch.where(denominator > 0, (a * b).sum(1) / denominator, torch.full_like(denominator, float("nan")))


def relative_spread(maps: torch.Tensor) -> torch.Tensor:
    """[K classes, B, ...] maps -> [B]: the mean over tokens of the standard deviation over the classes of the maps,
    each scaled to mean absolute value 1 (all-zero maps stay zero)."""
    flat = maps.flatten(2).double()
    scale = flat.abs().mean(-1, keepdim=True)
    scaled = torch.where(scale > 0, flat / scale.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(flat))
    return scaled.std(0, unbiased=False).mean(-1)


def summary(values: torch.Tensor, seed: int = 0, resamples: int = 2000) -> str:
    """``median [95 % bootstrap interval of the median] (lowest..highest)`` of the defined values."""
    values = values[~values.isnan()]
    if values.numel() == 0:
        return "undefined"
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(values), (resamples, len(values)), generator=generator)
    medians = values[picks].median(1).values
    low, high = medians.quantile(torch.tensor([0.025, 0.975], dtype=values.dtype)).tolist()
    return f"{values.median():.3g} [{low:.3g}, {high:.3g}] ({values.min():.3g}..{values.max():.3g})"


def explain_top_classes(model, images: torch.Tensor, method: str, order: torch.Tensor, classes: int,
                        options: dict) -> torch.Tensor:
    """Maps [classes, B, h, w]: row k explains each image's (k+1)-th highest-scoring class."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the all-zero notice: counted in the table instead
        return torch.stack([vitexplain.explain(model, images, method, target=order[:, k], **options)
                            for k in range(classes)])


def parse_options(pairs: list[str]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        method, _, name = key.partition(".")
        if not name or not value:
            raise SystemExit(f"--option takes method.name=value, got {pair!r}")
        try:
            found.setdefault(method, {})[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            found.setdefault(method, {})[name] = value
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["digits_vit"],
                        help="shipped names or checkpoints with their model cards")
    parser.add_argument("--methods", nargs="+", default=None, help="default: every class-specific image method")
    parser.add_argument("--images", type=int, default=32, help="digits test canvases (the first ones)")
    parser.add_argument("--classes", type=int, default=10, help="top classes explained per image (>= 2)")
    parser.add_argument("--costly-passes", type=float, default=10, help="methods above this many passes per map ...")
    parser.add_argument("--costly-classes", type=int, default=2, help="... are explained for this many classes")
    parser.add_argument("--batch", type=int, default=32, help="images per explain call")
    parser.add_argument("--option", action="append", default=[], help="method.name=value")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if min(args.classes, args.costly_classes) < 2:
        raise SystemExit("--classes and --costly-classes need at least 2 (top-1 and top-2)")
    methods = args.methods or class_specific_methods()
    options = parse_options(args.option)
    data = get_dataset("digits", split="test", n=args.images)
    images, _ = data.render(range(args.images))
    labels = torch.tensor([data[i]["label"] for i in range(args.images)])
    print(f"# class specificity, {args.images} digits test canvases; {describe_machine(torch.device('cpu'))}")
    for method, chosen in options.items():
        print(f"# {method} options: {chosen}")
    print("| model | method | classes | r(top1, top2) median [95% CI] (min..max) | undefined r | "
          "spread median [95% CI] (min..max) | zero maps | s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model, _ = load_model(name, device="cpu")
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        with torch.no_grad():
            logits = torch.cat([model(images[i:i + args.batch]) for i in range(0, args.images, args.batch)])
        order = logits.argsort(1, descending=True)
        accuracy = (order[:, 0] == labels).float().mean().item()
        label = f"{name.rsplit('/', 1)[-1]} ({getattr(model, 'global_pool', '?')}, acc {accuracy:.3f} here)"
        for method in methods:
            classes = args.costly_classes if get_method(method).passes(options.get(method)) > args.costly_passes \
                else args.classes
            start = time.perf_counter()
            maps = torch.cat([explain_top_classes(model, images[i:i + args.batch], method,
                                                  order[i:i + args.batch], classes, options.get(method, {}))
                              for i in range(0, args.images, args.batch)], dim=1)
            seconds = time.perf_counter() - start
            r = pearson(maps[0], maps[1])
            zero = int((maps.flatten(2) == 0).all(-1).sum())
            print(f"| {label} | {method} | {classes} | {summary(r)} | {int(r.isnan().sum())} | "
                  f"{summary(relative_spread(maps))} | {zero} of {maps.shape[0] * maps.shape[1]} | {seconds:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
