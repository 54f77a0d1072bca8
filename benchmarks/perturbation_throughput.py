"""Throughput of the perturbation-style metrics against plain batched forwards (issue 4's target: >= 80%).

    python benchmarks/perturbation_throughput.py --batch 16 --steps 224

For each metric (perturbation test, insertion/deletion with one baseline, AOPC), one run times the
metric on a batch and the plain model on exactly as many images as the metric forwards, in batches
of the same size, and prints throughput(metric) / throughput(plain forward).
"""
from __future__ import annotations

import argparse

import timm
import timm.data
import torch

from vitexplain.metrics.aopc import aopc_log_odds
from vitexplain.metrics.insertion_deletion import insertion_deletion
from vitexplain.metrics.perturbation import perturbation_test

from common import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=224, help="insertion / deletion steps")
    parser.add_argument("--forward-batch", type=int, default=64, help="images per forward inside the metrics")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).to(device).eval()
    size = model.patch_embed.img_size
    images = torch.randn(args.batch, 3, *size, device=device)
    maps = torch.rand(args.batch, size[0] // 16, size[1] // 16, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    config = timm.data.resolve_data_config(model=model)
    black = {"pixel_mean": config["mean"], "pixel_std": config["std"]}      # the preprocessing's normalisation

    def plain(count: int):
        def run():
            with torch.no_grad():
                for start in range(0, count, args.forward_batch):
                    n = min(args.forward_batch, count - start)
                    model(images.repeat(-(-n // args.batch), 1, 1, 1)[:n])
        return run

    cases = {
        "perturbation (both directions)": lambda: perturbation_test(model, images, maps, labels,
                                                                    batch_size=args.forward_batch, **black),
        f"insertion+deletion ({args.steps} steps, blur)":
            lambda: insertion_deletion(model, images, maps, labels, n_steps=args.steps, baseline="blur",
                                       batch_size=args.forward_batch),
        "aopc / log-odds": lambda: aopc_log_odds(model, images, maps, labels, batch_size=args.forward_batch, **black),
    }
    seen = []
    counter = model.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].shape[0]))
    print(f"model {args.model}, batch {args.batch}, device {device}")
    for name, run in cases.items():
        seen.clear()
        run()
        count = sum(seen)  # images the metric really forwards
        metric = timed(run, device, 1)
        reference = timed(plain(count), device, 1)
        seen.clear()
        print(f"{name:40s} {count:6d} forwards  metric {metric:7.2f} s  plain {reference:7.2f} s  "
              f"throughput ratio {reference / metric:.2f}")


    counter.remove()


if __name__ == "__main__":
    main()
