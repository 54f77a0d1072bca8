"""The GPU check: every method's maps in the precisions users run, seeds across devices, the default bench's
wall time, and method costs at batch 64 — one run, under 5 minutes on one GPU. Measured on an H100 (2026-11-26):
fidelity 16-21 s, bench 120 s, road 31 s; seeds 56 s at 32 canvases and cost 115 s with RISE at 256 masks, both
made smaller since (8 canvases; the bench's 150 masks), not re-timed.

    python benchmarks/gpu_check.py                              # on cuda: everything
    python benchmarks/gpu_check.py --device cpu --images 4 --parts fidelity   # a smoke run on a CPU

Parts (``--parts``, default all):

* ``fidelity``: for every method and both shipped models, each of ``--images`` digits test canvases is
  explained in float32 and in every reduced precision mode (TF32 products and convolutions, autocast
  bfloat16 and float16 on the device, bfloat16 and float16 weights); printed: Pearson r of each canvas's
  map to its float32 map, the lowest and the median, and the method's time in each mode relative to float32.
  Sampling methods take the default bench's sample counts (``vitexplain/bench/default_digits.yaml``).
* ``seeds``: every seeded method's float32 maps on the CPU and on the device with the same seed, on ``--seed-images``
  canvases: r, lowest and median.
* ``bench``: the default bench (``vitexplain bench``) on the device, in each of ``--bench-precisions`` (default
  float32): wall seconds, where they went, and its timeline (``BenchResult.timeline``): each method's stretch,
  the sanity check, gallery, reduction and reports, then every phase summed over the methods, each with its share
  of the wall time; on a GPU also the share of the wall time the GPU was busy (kineto's trace of the GPU's
  kernels and copies, overlaps counted once), overall and per phase. ``--stand-in`` runs it on cost-free
  stand-ins of its models (width 12, one head), leaving the bench's host-side work.
* ``cost``: ``method_cost.py`` at batch 64 (ViT-B/16, random weights): ratios to one forward+backward in
  float32, and each method's time under bfloat16 autocast relative to its float32 time.
* ``road``: ``road_imputation.py`` with ``--batch`` images: ROAD's imputation by SciPy's LU on the CPU against
  conjugate gradients on the device (what ``solver="auto"`` picks there), at 112 and 224 px, one timed round.
"""
from __future__ import annotations

import argparse
import bisect
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from road_imputation import table as road_table
from torch.profiler import ProfilerActivity, profile

import vitexplain
from vitexplain.bench import DEFAULT_CONFIG, BenchConfig, run_benchmark
from vitexplain.bench.config import read_yaml
from vitexplain.datasets.base import collate, get_dataset
from vitexplain.instrumentation.precision import precision_mode
from vitexplain.models import load_model
from vitexplain.options import PRECISIONS
from vitexplain.registry import get_method

from common import describe_machine, pearson

SHIPPED = ("digits_vit", "digits_deit")
PARTS = ("fidelity", "seeds", "bench", "cost", "road")
#: the methods of method_cost's batch-64 part: the single-pass ones, then two samplers at the bench's sample counts
COST_METHODS = ["raw_attention", "rollout", "attn_gradcam", "gae", "gradtoken", "tokentm", "transformer_attribution",
                "lrp", "attcat", "agcam"]
COST_SAMPLERS = ("tis", "rise")


def bench_options() -> dict[str, dict]:
    """Each method's options in the default bench (its sample counts), with large batches for a GPU."""
    options = {}
    for entry in read_yaml(DEFAULT_CONFIG)["methods"]:
        if isinstance(entry, dict) and entry.get("label", entry["name"]) == entry["name"]:
            options[entry["name"]] = dict(entry.get("options", {}))
    for name in vitexplain.available_methods("image"):
        if "batch_size" in get_method(name).options:
            options.setdefault(name, {})["batch_size"] = 512
    return options


def canvases(count: int, device: torch.device) -> torch.Tensor:
    dataset = get_dataset("digits", split="test", n=count)
    return collate([dataset[i] for i in range(count)])["images"].to(device)


def modes(device: torch.device) -> dict[str, tuple[str | None, torch.dtype | None]]:
    """Reduced precision modes: name -> (precision_mode name or None, weight dtype or None)."""
    found = {"tf32": ("tf32", None)} if device.type == "cuda" else {}
    found[f"{device.type} autocast bf16"] = ("bfloat16", None)
    found[f"{device.type} autocast fp16"] = ("float16", None)
    found["bf16 weights"] = (None, torch.bfloat16)
    found["fp16 weights"] = (None, torch.float16)
    return found


def timed_explain(model, images, method, options, device) -> tuple[torch.Tensor, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    maps = vitexplain.explain(model, images, method, **options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return maps, time.perf_counter() - start


def fidelity(device: torch.device, count: int, methods: list[str]) -> None:
    images = canvases(count, device)
    options = bench_options()
    names = list(modes(device))
    print(f"\n## Maps in reduced precision: r to the float32 map, lowest / median of {count} canvases "
          f"(time relative to float32)\n")
    print("| method | model | " + " | ".join(names) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for model_name in SHIPPED:
        model, _ = load_model(model_name, device=device)
        for method in methods:
            given = options.get(method, {})
            vitexplain.explain(model, images[:2], method, **given)  # warm-up
            reference, seconds = timed_explain(model, images, method, given, device)
            cells = []
            for mode, (precision, dtype) in modes(device).items():
                try:
                    # the float32 model stays as it is
                    held = model if dtype is None else copy.deepcopy(model).to(dtype)
                    with precision_mode(precision or "float32", device):
                        maps, spent = timed_explain(held, images, method, given, device)
                    r = pearson(maps, reference)
                    bad = "" if torch.isfinite(maps).all() else " NaN"
                    cells.append(f"{r.min():.3f} / {r.median():.3f} ({spent / seconds:.2f}x){bad}")
                except Exception as error:  # noqa: BLE001 - a crash is a finding, printed in its cell
                    cells.append(f"error: {str(error).splitlines()[0][:60]}")
            print(f"| {method} | {model_name} | " + " | ".join(cells) + " |", flush=True)


def seeds(device: torch.device, count: int) -> None:
    images = canvases(count, device)
    options = bench_options()
    seeded = [m for m in vitexplain.available_methods("image") if get_method(m).randomised]
    print(f"\n## One seed, two devices: r of the {device} maps to the CPU maps, lowest / median of {count} canvases\n")
    print("| method | " + " | ".join(SHIPPED) + " |\n| --- | " + " | ".join("---" for _ in SHIPPED) + " |")
    cpu = torch.device("cpu")
    rows = {method: [] for method in seeded}
    for model_name in SHIPPED:
        model, _ = load_model(model_name, device=device)
        for method in seeded:
            here = vitexplain.explain(model, images, method, **options.get(method, {}))
            there = vitexplain.explain(model.to(cpu), images.to(cpu), method, **options.get(method, {}))
            model.to(device)
            r = pearson(here, there)
            rows[method].append(f"{r.min():.4f} / {r.median():.4f}")
    for method, cells in rows.items():
        print(f"| {method} | " + " | ".join(cells) + " |")


def where_the_time_went(timings: dict[str, dict[str, dict[str, float]]], top: int = 5) -> str:
    """The bench's largest seconds by phase (maps, each metric, sanity) and by method, summed over the models."""
    phases: dict[str, float] = {}
    methods: dict[str, float] = {}
    for per_method in timings.values():
        for method, spent in per_method.items():
            for phase, seconds in spent.items():
                phases[phase] = phases.get(phase, 0.0) + seconds
                methods[method] = methods.get(method, 0.0) + seconds

    def largest(found: dict[str, float]) -> str:
        ranked = sorted(found.items(), key=lambda item: -item[1])[:top]
        return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in ranked)

    return f"largest phases: {largest(phases)}; methods: {largest(methods)}"


def row_name(interval: dict[str, Any]) -> str:
    """What a timeline row is about: the method for its maps and metrics, else the phase (sanity, gallery,
    reduce, reports), so that a method's stretch is one row and the sanity check, which cycles through the
    methods, another."""
    return interval["method"] if interval["method"] and interval["phase"] != "sanity" else interval["phase"]


def timeline_rows(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive intervals of the same model and :func:`row_name` merged: first start, last end, the seconds
    of the parts (end - start less the untimed host work between them) and the ``parts``."""
    rows: list[dict[str, Any]] = []
    for interval in sorted(timeline, key=lambda found: found["start"]):
        name, spent = row_name(interval), interval["end"] - interval["start"]
        if rows and (rows[-1]["model"], rows[-1]["name"]) == (interval["model"], name):
            rows[-1]["end"] = interval["end"]
            rows[-1]["seconds"] += spent
            rows[-1]["parts"].append(interval)
        else:
            rows.append({"model": interval["model"], "name": name, "start": interval["start"],
                         "end": interval["end"], "seconds": spent, "parts": [interval]})
    return rows


def folded(rows: list[dict[str, Any]], wall: float, least: float) -> list[dict[str, Any]]:
    """``rows`` with each run of consecutive rows of one model under ``least`` of ``wall`` folded into one
    ("n rows"), so that a long bench prints a short table."""
    found: list[dict[str, Any]] = []
    for row in rows:
        small = row["seconds"] < least * wall
        last = found[-1] if found else None
        if small and last is not None and last.get("folded") and last["model"] == row["model"]:
            last["folded"] += 1
            last.update(name=f"{last['folded']} rows", end=row["end"], seconds=last["seconds"] + row["seconds"],
                        parts=last["parts"] + row["parts"])
        else:
            found.append({**row, "folded": 1} if small else row)
    return found


def phase_totals(timeline: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase over every model and method: the first start, the last end and the seconds of its intervals."""
    totals: dict[str, dict[str, float]] = {}
    for interval in timeline:
        found = totals.setdefault(interval["phase"], {"start": interval["start"], "end": interval["end"],
                                                      "seconds": 0.0})
        found["start"], found["end"] = min(found["start"], interval["start"]), max(found["end"], interval["end"])
        found["seconds"] += interval["end"] - interval["start"]
    return totals


def merged_spans(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``spans`` as sorted, disjoint spans (kernels on several streams overlap)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def busy_within(merged: list[tuple[float, float]], start: float, end: float,
                ends: list[float] | None = None) -> float:
    """Seconds of the disjoint sorted spans ``merged`` inside [start, end]; ``ends``, their ends, saves
    listing them again on each call."""
    ends = [e for _, e in merged] if ends is None else ends
    total = 0.0
    for span_start, span_end in merged[bisect.bisect_left(ends, start):]:
        if span_start >= end:
            break
        total += min(span_end, end) - max(span_start, start)
    return total


def gpu_busy(run: Callable[[], Any], device: torch.device) -> tuple[Any, float, list[tuple[float, float]] | None]:
    """``run()``'s result, its wall seconds and the GPU's activity (kernels, copies, fills) while it ran, as
    (start, end) seconds from its start: kineto traces the device alone (no CPU operators recorded, so the host
    runs as it would), and its clock is the epoch one, read once when ``run`` starts. None when the trace
    holds no GPU activity at all (no CUPTI)."""
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        epoch, started = time.time_ns(), time.perf_counter()
        result = run()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
    spans = [((event.start_ns() - epoch) / 1e9, (event.end_ns() - epoch) / 1e9)
             for event in trace.profiler.kineto_results.events()
             if event.device_type() == torch.autograd.DeviceType.CUDA and event.end_ns() > event.start_ns()]
    return result, wall, spans or None


def timeline_table(timeline: list[dict[str, Any]], wall: float, spans: list[tuple[float, float]] | None = None,
                   least: float = 0.0) -> str:
    """The timeline as two markdown tables, each row with its seconds and share of ``wall`` (and, given the
    GPU's activity ``spans``, the share of the row's intervals the GPU was busy): the rows of
    :func:`timeline_rows` in time order (those under ``least`` of the wall :func:`folded`), then
    :func:`phase_totals`; then the timed and GPU-busy shares."""
    merged = merged_spans(spans) if spans is not None else None
    ends = [e for _, e in merged] if merged is not None else None

    def busy(intervals: list[dict[str, Any]], seconds: float) -> str:
        if merged is None:
            return ""
        inside = sum(busy_within(merged, i["start"], i["end"], ends) for i in intervals)
        return f" {inside / seconds:.0%} |" if seconds > 0 else " – |"

    gpu_header, gpu_rule = (" GPU busy |", " ---: |") if merged is not None else ("", "")
    lines = [f"| model | row | start s | end s | seconds | share of wall |{gpu_header}",
             f"| --- | --- | ---: | ---: | ---: | ---: |{gpu_rule}"]
    for row in folded(timeline_rows(timeline), wall, least):
        lines.append(f"| {row['model'] or '–'} | {row['name']} | {row['start']:.2f} | {row['end']:.2f} | "
                     f"{row['seconds']:.2f} | {row['seconds'] / wall:.1%} |{busy(row['parts'], row['seconds'])}")
    lines += ["", f"| phase | first start s | last end s | seconds | share of wall |{gpu_header}",
              f"| --- | ---: | ---: | ---: | ---: |{gpu_rule}"]
    for phase, total in sorted(phase_totals(timeline).items(), key=lambda item: -item[1]["seconds"]):
        parts = [i for i in timeline if i["phase"] == phase]
        lines.append(f"| {phase} | {total['start']:.2f} | {total['end']:.2f} | {total['seconds']:.2f} | "
                     f"{total['seconds'] / wall:.1%} |{busy(parts, total['seconds'])}")
    timed = sum(i["end"] - i["start"] for i in timeline)
    lines += ["", f"timed phases {timed:.1f} s of {wall:.1f} s wall ({timed / wall:.0%}); the rest is untimed host "
                  "work (loading models and images, reading and writing the cache, building the metrics' batches)"]
    if merged is not None:
        busy_seconds = busy_within(merged, 0.0, wall, ends)
        lines.append(f"GPU busy {busy_seconds:.1f} s of {wall:.1f} s wall ({busy_seconds / wall:.0%})")
    return "\n".join(lines)


def stand_ins(names: list[str]) -> dict[str, torch.nn.Module]:
    """Cost-free stand-ins of the shipped models ``names``: the same timm architecture and geometry (112 px, 8-px
    patches, 4 blocks, 10 classes, their normalisation), width 12 and one head, random weights; every method and
    metric runs as on the real models, the model's arithmetic all but gone."""
    import timm

    from vitexplain.models import shipped_models

    found = {}
    for name in names:
        shipped = shipped_models()[name]
        torch.manual_seed(0)
        model = timm.create_model(shipped.arch, pretrained=False, **{**shipped.config, "embed_dim": 12, "num_heads": 1})
        found[f"{name}~stand-in"] = model.eval()
    return found


def bench(device: torch.device, limit: int | None, precisions: list[str], stand_in: bool = False) -> None:
    models = "cost-free stand-ins of its models (width 12, one head)" if stand_in else "its models"
    print(f"\n## The default bench on this device (wall seconds, one process, fresh cache; {models})\n")
    for precision in precisions:
        with tempfile.TemporaryDirectory() as folder:
            data = {**read_yaml(DEFAULT_CONFIG), "output_dir": folder, "device": str(device), "progress": False,
                    "precision": precision}
            data = {**data, "limit": limit or data["limit"]}
            if stand_in:
                data["models"] = stand_ins(data["models"])
            config = BenchConfig.from_dict(data)
            spans = None
            if device.type == "cuda":       # traced: the GPU's busy time, at the cost of kineto's bookkeeping
                result, wall, spans = gpu_busy(lambda: run_benchmark(config), device)
            else:
                start = time.perf_counter()
                result = run_benchmark(config)
                wall = time.perf_counter() - start
            print(f"- {precision}: {wall:.1f} s, {len(result.errors)} error(s); "
                  f"{where_the_time_went(result.timings)}", flush=True)
            for error in result.errors[:5]:
                print(f"  error: {error['model']} / {error['method']} / {error['metric']}: {error['error'][:100]}")
            print(f"\nTimeline ({precision}; seconds from the run's start):\n")
            print(timeline_table(result.timeline, wall, spans, least=0.01))
            if device.type == "cuda" and spans is None:
                print("GPU busy: not measured (the trace holds no GPU activity)")


def cost(device: torch.device, model: str, batch: int, repeats: int) -> None:
    from method_cost import REFERENCE, measure, print_model

    options = {name: bench_options()[name] for name in COST_SAMPLERS}
    methods = COST_METHODS + list(COST_SAMPLERS)
    print(f"\n## method_cost at batch {batch}, {model} (random weights)\n")
    found = {}
    for precision in ("float32", "bfloat16"):
        with precision_mode(precision, device):
            found[precision] = measure(model, {}, methods, batch, repeats, device, options, False)
        print(f"{precision}:")
        print_model(found[precision], batch, False)
    print("\nbfloat16 autocast / float32, seconds per image:")
    for name in [REFERENCE, *methods]:
        fast, slow = found["bfloat16"].get(name), found["float32"].get(name)
        if fast and slow:
            print(f"  {name:26s} {fast[3] / slow[3]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--images", type=int, default=32, help="digits test canvases per model (fidelity part)")
    parser.add_argument("--seed-images", type=int, default=8, help="digits test canvases per model (seeds part)")
    parser.add_argument("--methods", nargs="+", default=None, help="methods of the fidelity part (default: all)")
    parser.add_argument("--limit", type=int, help="images per model of the bench part (default: the bench's)")
    parser.add_argument("--bench-precisions", nargs="+", default=["float32"], choices=PRECISIONS,
                        help="precisions of the bench part")
    parser.add_argument("--stand-in", action="store_true",
                        help="bench part on cost-free stand-ins of the models: the bench's host-side work alone")
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model of the cost part")
    parser.add_argument("--batch", type=int, default=64, help="batch of the cost and road parts")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the cost part")
    args = parser.parse_args()
    device = torch.device(args.device)
    methods = args.methods or [m for m in vitexplain.available_methods("image") if m != "constant_baseline"]
    print(f"# GPU check — {describe_machine(device)}")
    started = time.perf_counter()
    for part in args.parts:
        begun = time.perf_counter()
        if part == "fidelity":
            fidelity(device, args.images, methods)
        elif part == "seeds":
            seeds(device, args.seed_images)
        elif part == "bench":
            bench(device, args.limit, args.bench_precisions, args.stand_in)
        elif part == "road":
            print("\n## ROAD's imputation: LU on the CPU against conjugate gradients on the device\n")
            road_table(device, args.batch, [112, 224], 1)
        else:
            cost(device, args.model, args.batch, args.repeats)
        print(f"\n({part}: {time.perf_counter() - begun:.0f} s)", flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
