"""``vitexplain train``: train a small ViT, or a DeiT taught by it, on the ``digits`` benchmark (a CPU is enough)."""
from __future__ import annotations

import dataclasses
import shlex
import sys

from ..models import ModelLoadError
from ..training import DISTILLATIONS, TrainingRecipe, train_digits
from .shared import output_file

#: model-shape options passed to timm when given (None: the architecture's own value)
SHAPE_OPTIONS = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "global_pool")
#: readouts a digits model may be trained with (timm's ``global_pool``): the class token, or the mean of the patch
#: tokens
GLOBAL_POOLS = ("token", "avg")
RECIPE_OPTIONS = tuple(field.name for field in dataclasses.fields(TrainingRecipe))


def add_parser(subparsers) -> None:
    defaults = TrainingRecipe(steps=1)
    parser = subparsers.add_parser(
        "train", help="train a ViT (or a DeiT with a teacher) on the digits benchmark, from scratch or from --init",
        description="Train a timm Vision Transformer on digits canvases (112 x 112, test split held out) and write "
                    "a safetensors checkpoint with its JSON model card, loadable by `vitexplain explain --model PATH`.")
    parser.add_argument("--arch", required=True,
                        help="timm architecture, e.g. vit_tiny_patch16_224, "
                             "or deit_tiny_distilled_patch16_224 with --teacher")
    shape = parser.add_argument_group("model shape (default: the architecture's, except 8 px patches)")
    shape.add_argument("--patch-size", type=int, default=8)
    shape.add_argument("--embed-dim", type=int)
    shape.add_argument("--depth", type=int)
    shape.add_argument("--num-heads", type=int)
    shape.add_argument("--mlp-ratio", type=float)
    shape.add_argument("--global-pool", choices=GLOBAL_POOLS,
                       help="what the class head reads: the class token, or the average of the patch tokens "
                            "(timm's global_pool; with --init from a class-token model, its final norm becomes "
                            "the pooled model's fc_norm)")
    recipe = parser.add_argument_group("training (see vitexplain.training.TrainingRecipe)")
    recipe.add_argument("--steps", type=int, required=True, help="optimiser steps")
    for name, kind, text in (
            ("batch_size", int, "canvases per step"), ("lr", float, "peak learning rate"),
            ("min_lr", float, "learning rate at the end of the cosine decay"), ("warmup_steps", int, "linear warmup"),
            ("weight_decay", float, "AdamW weight decay"), ("label_smoothing", float, "on the true labels"),
            ("clip_grad", float, "gradient norm clip (0: none)"),
            ("focus", float, "fraction of the steps (the first ones) on a window of tokens around the digit"),
            ("focus_window", int, "side of that window, in tokens"),
            ("rotation", float, "training canvases turned by up to this many degrees about the digit"),
            ("shear", float, "training canvases sheared by up to this factor about the digit"),
            ("nearest", float, "share of training canvases whose scans are scaled by nearest neighbour"),
            ("stroke", int, "training strokes thickened or thinned by up to this many pixels"),
            ("contrast", float, "grey range of each training canvas squeezed by up to this share, and lifted"),
            ("gradient", float, "brightness ramp of up to this much added across each training canvas"),
            ("noise", float, "per-pixel Gaussian noise of standard deviation up to this on training canvases"),
            ("tau", float, "temperature of soft distillation"), ("seed", int, "initialisation, order, windows"),
            ("train_size", int, "fixed training set of this many canvases (default: a new canvas for every example)"),
            ("data_seed", int, "seed of the training canvases"), ("split_seed", int, "train/test split of the scans"),
            ("test_size", int, "test canvases of the reported accuracy"),
            ("test_seed", int, "seed of the test canvases")):
        recipe.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(defaults, name),
                            help=f"{text} (default: %(default)s)")
    recipe.add_argument("--teacher", help="trained digits model (shipped name or checkpoint) for DeiT distillation")
    recipe.add_argument("--distillation", choices=DISTILLATIONS, default=defaults.distillation)
    recipe.add_argument("--init", help="start from this digits model's weights (shipped name or checkpoint of the "
                        "same architecture and shape, or a plain ViT of a DeiT's shape) instead of a random "
                        "initialisation: fine-tuning")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available; the shipped models "
                                          "were trained on the CPU: --device cpu retrains them as they were)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's setting)")
    parser.add_argument("--eval-every", type=int, help="also report the test accuracy every that many steps")
    parser.add_argument("--snapshot-every", type=int, help="save the training state every that many steps to "
                        "OUT.snapshot.pt and resume from it when it exists (deleted at the end)")
    parser.add_argument("-o", "--out", required=True,
                        help="checkpoint path (.safetensors); the model card goes beside it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def command_line(args) -> str:
    """The ``vitexplain train`` command with every option spelt out (what the model card records)."""
    words = ["vitexplain", "train"]
    for name, value in vars(args).items():
        if name in ("command", "func") or value is None or value is False:
            continue
        if name == "plugins":      # --plugin, repeatable (common to every subcommand)
            words += [word for plugin in value for word in ("--plugin", plugin)]
            continue
        words += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return shlex.join(words)


def run(args) -> int:
    model_kwargs = {name: getattr(args, name) for name in SHAPE_OPTIONS if getattr(args, name) is not None}
    recipe = {name: getattr(args, name) for name in RECIPE_OPTIONS}
    recipe["clip_grad"] = recipe["clip_grad"] or None
    try:
        output_file(args.out)  # train_digits then checks the device, before any model is built or canvas drawn
        result = train_digits(args.arch, model_kwargs, teacher=args.teacher, init=args.init, threads=args.threads,
                              device=args.device, out=args.out,
                              command=command_line(args), eval_every=args.eval_every,
                              snapshot_every=args.snapshot_every,
                              progress=not args.no_progress, **recipe)
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"test accuracy {result['test_accuracy']:.4f} on {args.test_size} test canvases; {result['parameters']:,} "
          f"parameters; trained in {result['wall_seconds']:.0f} s wall, {result['cpu_seconds']:.0f} s CPU "
          f"({result['threads']} threads) on {result['device']}")
    print(f"wrote {result['checkpoint']} and {result['card']}")
    return 0
