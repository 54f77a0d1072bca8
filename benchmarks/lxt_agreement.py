"""attnlrp and cp_lrp against LXT (rachtibat/LRP-eXplains-Transformers) on the same model, in float64.

    pip install lxt                                              # LXT 2.1 and zennit 0.5.1 (the `test` extra has it)
    python benchmarks/lxt_agreement.py                           # or --lxt-path FOLDER: LXT installed elsewhere
    python benchmarks/lxt_agreement.py --layers 2 --images 3 --json out.json   # what tests/test_attnlrp.py runs

LXT explains torchvision's ViT: a tiny ``torchvision.models.VisionTransformer`` (32 px, patch 8, ``--layers``
blocks, ``--heads`` heads, width 48, MLP 96, 10 classes) gets random weights — biases, LayerNorm affines, class
token, position embedding and head included. vitexplain explains that very model (its ``nn.MultiheadAttention``
read through the packed projection's rows); the largest difference between the model's own logits and those of
vitexplain's forward under the rules is checked below 1e-10. LXT runs in a subprocess, since importing it patches
``torch.nn`` classes for the whole process: ``cp_LRP`` of ``lxt/efficient/models/vit_torch.py`` (the patch map of
LXT's ViT example), or AttnLRP assembled from LXT's own rules as its BERT patch does (the gradient halved at the
query, the key and the attention's output, written here as ``divide_gradient`` by 4 at the query and key and by 2
at the value; the softmax left to autograd), with zennit's ``Gamma`` on every Linear and the patch convolution as
in ``examples/vit_torch.py``, made Gradient×Input by ``monkey_patch_zennit``; the map is input × gradient at the
image, summed over channels. Printed per γ setting: Pearson r per image (lowest, mean) and the largest difference
over the map's largest magnitude.

LXT 2.1's ``lxt.efficient.models`` imports every Hugging Face patch it ships, one of which imports a module
transformers 5 no longer has; the subprocess stands that package in with an empty one, from which only
``vit_torch`` is loaded.

``--json`` also writes the figures (the logit difference; per variant and setting the lowest and mean r and the
largest difference). Also printed: ``conservative_lrp`` (Ali et al.'s rules, read at the token embeddings)
against LXT's CP-LRP with γ = 0, and what separates them (docs/decisions/lrp.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn


def settings(layers: int) -> list[tuple[float | tuple[float, ...], float]]:
    """(Linear γ, one value or one per block; patch-convolution γ): the default, LRP-0, the top of LXT's sweep, and
    γ = 0.25 on the lower half of the blocks with the ε-rule (γ = 0) above."""
    lower = layers // 2 or 1
    return [(0.05, 0.25), (0.0, 0.0), (1.0, 100.0), ((0.25,) * lower + (0.0,) * (layers - lower), 0.1)]


def torchvision_vit(layers: int, heads: int, seed: int) -> nn.Module:
    """torchvision's ViT, every parameter random (its head and class token start at zero otherwise)."""
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=layers, num_heads=heads, hidden_dim=48,
                              mlp_dim=96, num_classes=10).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or name in ("class_token", "encoder.pos_embedding"):
                parameter.normal_(0, 0.3)
            elif name.startswith("heads"):
                parameter.normal_(0, 0.5)
            elif ".ln" in name or name.startswith("encoder.ln"):
                parameter.normal_(1, 0.2)
    return model


def run_lxt(folder: Path, variant: str) -> None:
    """In the subprocess: LXT's maps for every setting, from the torchvision model saved in ``folder``."""
    import importlib.util
    import types
    from functools import partial

    models = types.ModuleType("lxt.efficient.models")  # see the module docstring
    models.__path__ = [os.path.join(importlib.util.find_spec("lxt").submodule_search_locations[0], "efficient",
                                    "models")]
    models.get_default_map = None  # lxt.efficient.core imports it; the patch map is given here
    sys.modules["lxt.efficient.models"] = models

    from lxt.efficient import monkey_patch, monkey_patch_zennit
    from lxt.efficient.models.vit_torch import cp_LRP
    from lxt.efficient.patches import patch_method
    from lxt.efficient.rules import divide_gradient
    from torchvision.models import vision_transformer
    from zennit.composites import NameMapComposite
    from zennit.rules import Gamma

    def attnlrp_attention(self, query, key, value, *args, **kwargs):
        return self.original_forward(divide_gradient(query, 4), divide_gradient(key, 4), divide_gradient(value, 2),
                                     *args, **kwargs)

    patches = dict(cp_LRP)
    if variant == "attnlrp":
        patches[vision_transformer.nn.MultiheadAttention] = partial(patch_method, attnlrp_attention, keep_original=True)
    monkey_patch(vision_transformer, patches)
    monkey_patch_zennit()
    saved = torch.load(folder / "inputs.pt", weights_only=False)
    model = saved["model"]
    maps = []
    for gamma, conv_gamma in settings(len(model.encoder.layers)):
        per_block = gamma if isinstance(gamma, tuple) else (gamma,) * len(model.encoder.layers)
        rules = [(["conv_proj"], Gamma(conv_gamma)), (["heads.head"], Gamma(per_block[-1]))]
        for block, value in enumerate(per_block):  # every Linear, as LayerMapComposite gives them
            layer = f"encoder.layers.encoder_layer_{block}"
            rules.append(([f"{layer}.mlp.0", f"{layer}.mlp.3", f"{layer}.self_attention.out_proj"], Gamma(value)))
        composite = NameMapComposite(rules)
        composite.register(model)
        images = saved["images"].clone().requires_grad_(True)
        logits = model(images)
        logits.gather(1, saved["targets"][:, None]).sum().backward()
        composite.remove()
        maps.append((images * images.grad).sum(1).detach())
    torch.save(maps, folder / f"{variant}.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lxt-path", default="",
                        help="a folder holding lxt and zennit, put first on the subprocess's path")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--run-lxt", nargs=2, metavar=("FOLDER", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_lxt:
        run_lxt(Path(args.run_lxt[0]), args.run_lxt[1])
        return

    import vitexplain
    from vitexplain.instrumentation import adapter_for
    from vitexplain.instrumentation.lrp import relevance

    from common import pearson

    model = torchvision_vit(args.layers, args.heads, args.seed)
    images = torch.randn(args.images, 3, 32, 32, generator=torch.Generator().manual_seed(args.seed + 1),
                         dtype=torch.float64)
    with torch.no_grad():
        theirs = model(images)
    targets = theirs.argmax(-1)
    ours = relevance(adapter_for(model), images, targets, "cplrp", at=("attn",), blocks=(-1,)).logits
    logit_difference = (theirs - ours).abs().max().item()
    print(f"torchvision ViT, {args.layers} blocks, {args.heads} heads, float64: largest difference of the logits under "
          f"vitexplain's rules from the model's own {logit_difference:.1e}")
    assert torch.allclose(theirs, ours, rtol=0, atol=1e-10)
    with tempfile.TemporaryDirectory() as folder:
        torch.save({"model": model, "images": images, "targets": targets}, Path(folder) / "inputs.pt")
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (args.lxt_path, os.environ.get("PYTHONPATH", "")) if p)}
        found = {}
        for variant in ("cp_lrp", "attnlrp"):
            subprocess.run([sys.executable, __file__, "--run-lxt", folder, variant], check=True, env=environment)
            found[variant] = torch.load(Path(folder) / f"{variant}.pt")

    def compare(label: str, mine: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
        r = pearson(mine, reference)
        difference = ((mine.double() - reference).abs().amax((1, 2)) / reference.abs().amax((1, 2))).max()
        print(f"{label:48s} r lowest {r.min():.6f}, mean {r.mean():.6f}; "
              f"largest difference / max |map| {difference:.1e}")
        return {"r_min": r.min().item(), "r_mean": r.mean().item(), "difference": difference.item()}

    figures = {"logit_difference": logit_difference, "maps": {}}
    for variant, maps in found.items():
        for (gamma, conv_gamma), reference in zip(settings(args.layers), maps):
            mine = vitexplain.explain(model, images, variant, targets, gamma=list(gamma) if isinstance(gamma, tuple)
                                      else gamma, conv_gamma=conv_gamma)
            label = f"{variant} gamma={gamma}, conv_gamma={conv_gamma}"
            figures["maps"][label] = compare(label, mine, reference)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))

    # conservative_lrp against LXT's CP-LRP at γ = 0 (LRP-0 at every Linear and at the convolution), on the patches
    lxt_zero = found["cp_lrp"][settings(args.layers).index((0.0, 0.0))]
    per_patch = lxt_zero.unflatten(1, (4, 8)).unflatten(-1, (4, 8)).sum((2, 4))
    adapter = adapter_for(model)
    compare("conservative_lrp (token embeddings), patch sums",
            vitexplain.explain(model, images, "conservative_lrp", targets),
            per_patch)
    conservative = relevance(adapter, images, targets, "conservative", at=("patches", "pixels"))
    compare("'conservative' rule set at the patch embeddings", conservative.patches.sum(-1).reshape(-1, 4, 4),
            per_patch)
    compare("'conservative' rule set at the pixels", conservative.pixels.sum(1), lxt_zero)


if __name__ == "__main__":
    main()
