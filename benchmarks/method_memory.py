"""Peak memory of explanation methods relative to one forward+backward of the same model and batch.

    python benchmarks/method_memory.py                               # ViT-B/16, batch 16, single-pass methods
    python benchmarks/method_memory.py --model vit_large_patch16_384 --batch 4 --methods gae tokentm

Each measurement runs in a fresh subprocess (so allocator caches of earlier runs cannot hide or add
memory): the model (random weights, nothing downloaded) and the batch are built, then the process's
memory is read, the work runs once, and the peak is read again. On a GPU the figures are
``torch.cuda.max_memory_allocated`` above the memory held before the work; on the CPU the peak
resident set size (``VmHWM``) above the resident set before it. The reference is the plain model:
one forward of the batch and one backward of the summed predicted-class logits to the images.
Prints, per method, the extra memory in MiB and the ratio method / reference (target: <= 1.5 for
methods that run one forward and one backward).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: methods that run one instrumented forward (and at most one backward)
SINGLE_PASS = ["raw_attention", "rollout", "attn_gradcam", "gae", "gradcam", "tokentm", "gradtoken", "attcat", "agcam"]


def _resident(key: str) -> int:
    """A line of /proc/self/status in bytes (VmRSS: now, VmHWM: peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(model_name: str, method: str, batch: int, device: str) -> None:
    """Run one measurement and print {"extra": bytes} as JSON."""
    import timm
    import torch

    import vitexplain

    torch.manual_seed(0)
    model = timm.create_model(model_name, pretrained=False).to(device).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    images = torch.randn(batch, 3, *model.patch_embed.img_size, device=device)
    if method == "forward+backward":
        def work():
            x = images.detach().requires_grad_(True)
            logits = model(x)
            logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    else:
        def work():
            vitexplain.explain(model, images, method)
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
    print(json.dumps({"extra": extra}))


def measure(model_name: str, method: str, batch: int, device: str) -> int:
    command = [sys.executable, __file__, "--child", method, "--model", model_name, "--batch", str(batch), "--device", device]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])["extra"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--methods", nargs="+", default=SINGLE_PASS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        child(args.model, args.child, args.batch, args.device)
        return
    reference = measure(args.model, "forward+backward", args.batch, args.device)
    print(f"model {args.model}, batch {args.batch}, device {args.device}; extra memory over the loaded model")
    print(f"{'forward+backward':24s} {reference / 2**20:9.0f} MiB   ratio 1.00")
    for method in args.methods:
        extra = measure(args.model, method, args.batch, args.device)
        print(f"{method:24s} {extra / 2**20:9.0f} MiB   ratio {extra / reference:.2f}")


if __name__ == "__main__":
    main()
