"""Peak memory of explanation methods relative to one forward+backward of the same model and batch.

    python benchmarks/method_memory.py                                           # ViT-B/16, batch 16
    python benchmarks/method_memory.py --model vit_large_patch16_384 --batch 4
    python benchmarks/method_memory.py --families --batch 8                      # every family beside plain ViT

Each measurement runs in a fresh subprocess (so allocator caches of earlier runs cannot hide or add
memory): the model (random weights, nothing downloaded, 1,000 classes, parameters frozen) and the batch
are built, then the process's memory is read, the work runs once, and the peak is read again. On a GPU
the figures are ``torch.cuda.max_memory_allocated`` above the memory held before the work; on the CPU
the peak resident set size (``VmHWM``) above the resident set before it. The reference is the plain
model: one forward of the batch and one backward of the summed predicted-class logits to the images.
Prints, per method, the extra memory in MiB (median of ``--repeats`` subprocesses) and the ratio
method / reference (target: <= 1.5 for methods that run one forward and at most one backward);
``--families`` prints the ratios of every family of ``common.FAMILIES`` beside plain ViT's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

#: methods that run one instrumented forward (and at most one backward)
SINGLE_PASS = ["raw_attention", "rollout", "attn_gradcam", "gae", "gradcam", "tokentm", "gradtoken", "attcat", "agcam"]
REFERENCE = "forward+backward"


def _resident(key: str) -> int:
    """A line of /proc/self/status in bytes (VmRSS: now, VmHWM: peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(model_name: str, img_size: int | None, method: str, batch: int, device: str, options: dict) -> None:
    """Run one measurement and print {"extra": bytes} as JSON
    ({"refused": reason} when the method refuses the model)."""
    import torch

    import vitexplain
    from vitexplain.instrumentation import UnsupportedModelError

    from common import build_model, forward_backward, image_batch

    model = build_model(model_name, device=device, **{**options, **({"img_size": img_size} if img_size else {})})
    images = image_batch(model, batch, device)
    work = forward_backward(model, images) if method == REFERENCE else lambda: vitexplain.explain(model, images, method)
    try:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            work()
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - before
        else:
            before = _resident("VmRSS")
            work()
            extra = _resident("VmHWM") - before
    except UnsupportedModelError as error:
        print(json.dumps({"refused": str(error)}))
        return
    print(json.dumps({"extra": extra}))


def measure(model_name: str, img_size: int | None, method: str, batch: int, device: str, repeats: int,
            options: dict) -> float | None:
    """Median extra bytes over ``repeats`` fresh subprocesses (None: the method refuses the model)."""
    command = [sys.executable, __file__, "--child", method, "--model", model_name, "--batch", str(batch),
               "--device", device, "--model-options", json.dumps(options)]
    command += ["--img-size", str(img_size)] if img_size else []
    found = []
    for _ in range(repeats):
        printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        output = json.loads(printed.strip().splitlines()[-1])
        if "refused" in output:
            return None
        found.append(output["extra"])
    return statistics.median(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224", help="any timm model name")
    parser.add_argument("--img-size", type=int, default=None,
                        help="image size the model is built for (default: its own)")
    parser.add_argument("--families", action="store_true", help="every family of common.FAMILIES beside plain ViT")
    parser.add_argument("--methods", nargs="+", default=SINGLE_PASS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="subprocesses per measurement (the median is shown)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        child(args.model, args.img_size, args.child, args.batch, args.device, json.loads(args.model_options))
        return
    from common import FAMILIES, FAMILY_TOLERANCE, MEMORY_TARGET

    models = FAMILIES if args.families else {args.model: (args.model, {})}
    found: dict[str, dict[str, float | None]] = {}
    for label, (name, options) in models.items():
        found[label] = {case: measure(name, args.img_size, case, args.batch, args.device, args.repeats, options)
                        for case in [REFERENCE, *args.methods]}
    size = f" at {args.img_size} px" if args.img_size else ""
    print(f"batch {args.batch}{size}, device {args.device}, median of {args.repeats} subprocess(es); "
          "extra memory over the loaded model")
    if not args.families:
        extra = found[args.model]
        print(f"model {args.model}")
        for case, value in extra.items():
            target = f"<= {MEMORY_TARGET}" if case in SINGLE_PASS else ""
            if value is None:
                print(f"{case:24s} refused")
            else:
                print(f"{case:24s} {value / 2**20:9.0f} MiB   ratio {value / extra[REFERENCE]:5.2f}   {target}")
        return
    labels = list(found)
    width = max(12, *(len(label) for label in labels)) + 1
    ratio = {label: {case: None if value is None else value / found[label][REFERENCE]
                     for case, value in found[label].items()}
             for label in labels}

    def cell(label: str, case: str, relative: bool = False) -> str:
        value, base = ratio[label][case], ratio[labels[0]][case]
        if value is None or (relative and base is None):
            return f"{'—':>{width}s}"
        return f"{value / base - 1:+{width}.0%}" if relative else f"{value:{width}.2f}"

    print(f"{'ratio':24s}" + "".join(f"{label:>{width}s}" for label in labels) + "   target")
    for case in ratio[labels[0]]:
        print(f"{case:24s}" + "".join(cell(label, case) for label in labels)
              + (f"   <= {MEMORY_TARGET}" if case in SINGLE_PASS else ""))
    print(f"\n{'vs ' + labels[0] + ' (relative)':24s}" + "".join(f"{label:>{width}s}" for label in labels[1:])
          + f"   target: within {FAMILY_TOLERANCE:.0%}")
    for case in args.methods:
        print(f"{case:24s}" + "".join(cell(label, case, relative=True) for label in labels[1:]))


if __name__ == "__main__":
    main()
