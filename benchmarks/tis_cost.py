"""TIS cost against the cost of its mask forwards alone (issue 3's target: total <= 1.2x).

    python benchmarks/tis_cost.py --batch 16 --masks 1024          # the target's setting (GPU)
    python benchmarks/tis_cost.py --batch 1 --masks 1024           # what a 2-core CPU manages

Times, in one run on random-weight ViT-B/16: (a) the whole `tis` method; (b) the same number of
token-subset forwards through `adapter.logits_on_tokens` with random subsets of the same size and
the same `batch_size`. Prints (a)/(b); the difference is k-means, the recording forward, top-k and
the weighted sum.
"""
from __future__ import annotations

import argparse

import timm
import torch

import vitexplain
from vitexplain.instrumentation import adapter_for

from common import timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--masks", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=128, help="sequences per encoder call")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).to(device).eval()
    images = torch.randn(args.batch, 3, *model.patch_embed.img_size, device=device)
    adapter = adapter_for(model)
    patches = adapter.grid_size(images)[0] * adapter.grid_size(images)[1]
    keep = torch.rand(args.batch, args.masks, patches, device=device).argsort(-1)[..., : patches // 2]

    print(f"model {args.model}, {args.batch} images x {args.masks} masks, device {device}")
    forwards = timed(lambda: adapter.logits_on_tokens(images, keep, batch_size=args.batch_size), device, args.repeats)
    method = timed(lambda: vitexplain.explain(model, images, "tis", n_masks=args.masks, batch_size=args.batch_size),
                   device, args.repeats)
    print(f"mask forwards alone  {forwards:8.2f} s")
    print(f"tis                  {method:8.2f} s")
    print(f"ratio tis / mask forwards = {method / forwards:.3f}  "
          f"(k-means and bookkeeping {100 * (method / forwards - 1):.1f}%)")


if __name__ == "__main__":
    main()
