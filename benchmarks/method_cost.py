"""Time of explanation methods relative to one forward+backward of the same model on the same batch.

    python benchmarks/method_cost.py                                    # ViT-B/16, batch 16
    python benchmarks/method_cost.py --batch 1 --methods gae transformer_attribution
    python benchmarks/method_cost.py --model vit_large_patch16_384 --batch 2 --methods all
    python benchmarks/method_cost.py --families --batch 4               # every family beside plain ViT

Models are built with random weights (nothing is downloaded), 1,000 classes, parameters frozen. The
reference is the plain model: one forward of the batch and one backward of the summed predicted-class
logits to the images; a training step (parameter gradients too) is printed beside it. The reference and
the methods run in interleaved rounds (after a warm-up round), so a slow spell of a shared machine
touches them alike; a ratio is the median over the rounds of method time / that round's reference time
(the lowest and highest beside it). Beside it, from the same run, the ratio of floating-point operations (matrix
products, convolutions, attention; element-wise work not counted, as ``common.flops`` counts them), which does not
depend on the machine's load, and time ratio / FLOP ratio: how far a method's time is above what its arithmetic
alone predicts (issue 34's target for AttnLRP and CP-LRP, on a GPU at batch 64: within 15 %, <= 1.15); ``--no-flops``
leaves both out. For the methods with a ``recompute`` option the path taken is printed too (``recompute="auto"``:
``kept`` the rules' graphs or ``recomputed`` each block; docs/decisions/performance.md).

``--families`` builds the ViT-B-sized model of every family in ``common.FAMILIES`` and prints each
method's ratio per family, and each family's relative difference to plain ViT (target: within 20 %).
"""
from __future__ import annotations

import argparse
import ast

import torch

import vitexplain
from vitexplain.instrumentation import UnsupportedModelError
from vitexplain.instrumentation.lrp import memory
from vitexplain.instrumentation.precision import precision_mode
from vitexplain.options import PRECISIONS

from common import (
    BATCH1_TIME_TARGETS,
    FAMILIES,
    FAMILY_TOLERANCE,
    TIME_TARGETS,
    build_model,
    describe_machine,
    flops,
    forward_backward,
    image_batch,
    interleaved,
    ratios,
)

#: the default: the recording methods with a target, and GAE's, transformer attribution's, AttnLRP's and CP-LRP's
DEFAULT_METHODS = ["raw_attention", "rollout", "attn_gradcam", "gae", "gradtoken", "tokentm", "transformer_attribution",
                   "attnlrp", "cp_lrp"]
#: methods whose time ratio is held against their own FLOP ratio (issue 34: within 15 % on a GPU at batch 64)
FLOP_TARGETS = {"attnlrp": 1.15, "cp_lrp": 1.15}
REFERENCE = "forward+backward"


def measure(model_name: str, model_options: dict, methods: list[str], batch: int, repeats: int, device: torch.device,
            options: dict[str, dict], count_flops: bool, training: bool = True) -> dict:
    """{case: (median ratio, lowest, highest, seconds per image, flop ratio or None, path or None)} for one model
    (built with ``model_options``); a method that refuses the model gets None. The path: for a method with a
    ``recompute`` option, ``"recomputed"`` or ``"kept"`` (what its last run at this batch chose)."""
    model = build_model(model_name, device=device, **model_options)
    images = image_batch(model, batch, device)
    cases = {REFERENCE: forward_backward(model, images)}
    if training:
        cases["training step"] = forward_backward(model, images, parameters=True)
    refused = {}
    paths: dict[str, str] = {}

    def run(method: str) -> None:
        with memory.collecting() as made:
            vitexplain.explain(model, images, method, **options.get(method, {}))
        if made:
            paths[method] = "recomputed" if made[-1].recompute else "kept"

    for method in methods:
        try:
            vitexplain.explain(model, images[:1], method, **options.get(method, {}))
        except UnsupportedModelError as error:
            refused[method] = None
            print(f"  {model_name}: {method} refused ({error})")
            continue
        cases[method] = lambda method=method: run(method)
    times = interleaved(cases, device, repeats)
    reference_flops = flops(cases[REFERENCE]) if count_flops else None
    found = {}
    for name, seconds in times.items():
        median, low, high = ratios(seconds, times[REFERENCE])
        per_image = sorted(seconds)[len(seconds) // 2] / batch
        flop_ratio = flops(cases[name]) / reference_flops if count_flops else None
        found[name] = (median, low, high, per_image, flop_ratio, paths.get(name))
    return {name: found.get(name) for name in [*cases, *refused] if name in found or name in refused}


def _target(method: str, batch: int) -> str:
    targets = BATCH1_TIME_TARGETS if batch == 1 and method in BATCH1_TIME_TARGETS else TIME_TARGETS
    return f"<= {targets[method]}" if method in targets else ""


def print_model(found: dict, batch: int, count_flops: bool) -> None:
    """One table: per case the time per image, the time ratio (lowest-highest), and from the same run the FLOP ratio
    and time ratio / FLOP ratio (unless ``count_flops`` is off), the recompute path, the targets."""
    header = f"{'':26s} {'ms/image':>9s} {'time':>6s} {'(lowest-highest)':>17s}"
    header += f" {'flops':>6s} {'time/flops':>10s}" if count_flops else ""
    print(header + f" {'recompute':>10s}   target")
    for name, values in found.items():
        if values is None:
            print(f"{name:26s} refused")
            continue
        median, low, high, per_image, flop_ratio, path = values
        line = f"{name:26s} {per_image * 1e3:9.1f} {median:6.2f} {f'({low:.2f}-{high:.2f})':>17s}"
        if count_flops:
            line += f" {flop_ratio:6.2f} {median / flop_ratio:10.2f}"
        targets = [] if name == REFERENCE else [_target(name, batch)]
        if count_flops and name in FLOP_TARGETS:
            targets.append(f"time/flops <= {FLOP_TARGETS[name]} (GPU, batch 64)")
        print(f"{line} {path or '':>10s}   {'; '.join(target for target in targets if target)}")


def print_families(found: dict[str, dict], batch: int) -> None:
    """Each method's ratio per family, then each family's relative difference to plain ViT's ratio."""
    labels = list(found)
    plain = labels[0]
    width = max(12, *(len(label) for label in labels)) + 1
    print(f"{'ratio':26s}" + "".join(f"{label:>{width}s}" for label in labels) + "   target")
    def cell(label: str, name: str, relative: bool = False) -> str:
        values, base = found[label].get(name), found[plain].get(name)
        if values is None or (relative and base is None):
            return f"{'—':>{width}s}"
        return f"{values[0] / base[0] - 1:+{width}.0%}" if relative else f"{values[0]:{width}.2f}"

    for name in found[plain]:
        print(f"{name:26s}" + "".join(cell(label, name) for label in labels)
              + f"   {_target(name, batch) if name != REFERENCE else ''}")
    print(f"\n{'vs ' + plain + ' (relative)':26s}" + "".join(f"{label:>{width}s}" for label in labels[1:])
          + f"   target: within {FAMILY_TOLERANCE:.0%}")
    for name in found[plain]:
        if name == REFERENCE:
            continue
        print(f"{name:26s}" + "".join(cell(label, name, relative=True) for label in labels[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="any timm model name")
    parser.add_argument("--img-size", type=int, default=None,
                        help="image size the model is built for (default: its own)")
    parser.add_argument("--families", action="store_true", help="every family of common.FAMILIES beside plain ViT")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="method names, or 'all'")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="rounds measured after the warm-up round")
    parser.add_argument("--flops", action="store_true", default=True,
                        help="the ratio of floating-point operations beside the time's (the default)")
    parser.add_argument("--no-flops", dest="flops", action="store_false",
                        help="leave the FLOP ratios out (counting them runs every case once more)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="what the model runs in, for the reference and the methods alike (autocast, TF32)")
    parser.add_argument("--option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="method option, e.g. tis.n_masks=256 (value parsed as a Python literal)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    options: dict[str, dict] = {}
    for item in args.option:
        key, value = item.split("=", 1)
        method, name = key.split(".", 1)
        options.setdefault(method, {})[name] = ast.literal_eval(value)
    methods = vitexplain.available_methods("image") if args.methods == ["all"] else args.methods
    device = torch.device(args.device)
    models = FAMILIES if args.families else {args.model: (args.model, {})}
    print(f"batch {args.batch}, {args.repeats} rounds, {args.precision}; {describe_machine(device)}")
    found = {}
    for label, (name, model_options) in models.items():
        if args.img_size:
            model_options = {**model_options, "img_size": args.img_size}
        with precision_mode(args.precision, device):
            found[label] = measure(name, model_options, methods, args.batch, args.repeats, device, options, args.flops,
                                   training=not args.families)
        if not args.families:
            print(f"model {name}" + (f" at {args.img_size} px" if args.img_size else ""))
            print_model(found[label], args.batch, args.flops)
    if args.families:
        print_families(found, args.batch)
    print(f"after: {describe_machine(device).split('; ')[1]}")


if __name__ == "__main__":
    main()
