"""Where a method spends its time on a model: the operators that take the most device time, beside the reference.

    python benchmarks/method_profile.py --model beit_base_patch16_224 --method tokentm --batch 16
    python benchmarks/method_profile.py --families --method tokentm --batch 16 --top 8

One warm-up run, then one profiled run (``torch.profiler``) of the plain forward+backward and of the
method, on random-weight models as ``method_cost.py`` builds them. Prints, per model, the total
device time of each and the ``--top`` operators of the method by self device time (CUDA time on a
GPU, CPU time otherwise), so a family whose ratio to its forward+backward is above plain ViT's shows
which operators make the difference (a written-out bias add, a rotary table, a copy).
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import vitexplain

from common import FAMILIES, build_model, describe_machine, forward_backward, image_batch


def profiled(fn, device: torch.device):
    """(total self device seconds, profiler table rows) of one run of ``fn`` after a warm-up run."""
    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    attribute = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    rows = sorted(events, key=lambda e: getattr(e, attribute, 0), reverse=True)
    table = [(e.key, getattr(e, attribute, 0) / 1e6, e.count) for e in rows]
    return sum(getattr(e, attribute, 0) for e in events) / 1e6, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--families", action="store_true", help="every family of common.FAMILIES")
    parser.add_argument("--method", default="tokentm")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"{args.method}, batch {args.batch}; {describe_machine(device)}")
    models = FAMILIES if args.families else {args.model: (args.model, {})}
    for label, (name, options) in models.items():
        model = build_model(name, device=device, **options)
        images = image_batch(model, args.batch, device)
        reference, _ = profiled(forward_backward(model, images), device)
        spent, rows = profiled(lambda: vitexplain.explain(model, images, args.method), device)
        print(f"\n{label}: forward+backward {reference * 1e3:.1f} ms, {args.method} {spent * 1e3:.1f} ms "
              f"({spent / reference:.2f}x); top operators of {args.method} (ms, calls):")
        for key, seconds, count in rows[:args.top]:
            print(f"  {seconds * 1e3:8.2f} {count:5d}  {key[:90]}")


if __name__ == "__main__":
    main()
