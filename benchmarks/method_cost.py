"""Cost of explanation methods relative to one forward+backward of the same model on the same batch.

    python benchmarks/method_cost.py                       # the foundation's attention methods
    python benchmarks/method_cost.py --methods tokentm gradtoken --batch 16
    python benchmarks/method_cost.py --methods all --model vit_base_patch16_224

The model is built with random weights (nothing is downloaded). The reference is the plain model:
one forward of the batch and one backward of the summed predicted-class logits to the images (the
model's parameters frozen, as a user explaining a model has them). A second reference, a training
step's forward+backward (parameter gradients too), is printed beside it. Prints, per method, seconds
per image and the ratios method time / reference time, all measured in this run (median of --repeats).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import timm
import torch

import vitexplain

ATTENTION_METHODS = ["raw_attention", "rollout", "attn_gradcam", "gae"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def forward_backward(model, images, parameters: bool = False):
    """One forward and one backward of the predicted-class logits: to the images, or (``parameters``)
    to the parameters as a training step does."""
    def run():
        x = images.detach().requires_grad_(not parameters)
        with torch.enable_grad():
            for parameter in model.parameters():
                parameter.requires_grad_(parameters)
            logits = model(x)
            logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
            for parameter in model.parameters():
                parameter.requires_grad_(False)
                parameter.grad = None
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--methods", nargs="+", default=ATTENTION_METHODS, help="method names or 'all'")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="method option, e.g. tis.n_masks=256 (value parsed as Python literal)")
    args = parser.parse_args()

    import ast

    options: dict[str, dict] = {}
    for item in args.option:
        key, value = item.split("=", 1)
        method, name = key.split(".", 1)
        options.setdefault(method, {})[name] = ast.literal_eval(value)
    methods = vitexplain.available_methods() if args.methods == ["all"] else args.methods

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).to(device).eval()
    size = model.patch_embed.img_size
    images = torch.randn(args.batch, 3, *size, device=device)
    for p in model.parameters():
        p.requires_grad_(False)  # as a user explaining a frozen model; the reference backward goes to the images

    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"model {args.model}, batch {args.batch}, device {device} ({machine}), torch {torch.__version__}, timm {timm.__version__}")
    reference = timed(forward_backward(model, images), device, args.repeats)
    training = timed(forward_backward(model, images, parameters=True), device, args.repeats)
    print(f"{'forward+backward':24s} {reference / args.batch * 1e3:9.2f} ms/image   ratio 1.00   "
          f"(training step: {training / args.batch * 1e3:.2f} ms/image)")
    for method in methods:
        kwargs = options.get(method, {})
        seconds = timed(lambda: vitexplain.explain(model, images, method, **kwargs), device, args.repeats)
        print(f"{method:24s} {seconds / args.batch * 1e3:9.2f} ms/image   ratio {seconds / reference:.2f}   "
              f"(/ training step {seconds / training:.2f})")


if __name__ == "__main__":
    main()
