"""``vitexplain reproduce``: a paper's table, reproduced beside the published numbers.

``vitexplain reproduce --list`` lists the recipes and what each needs; ``vitexplain reproduce
tokentm-table1 --imagenet-seg PATH`` runs one (resumable: run it again after an interruption).
"""
from __future__ import annotations

import argparse
import os
import sys

from .shared import add_precision_option, output_folder, positive_int


def add_parser(subparsers) -> None:
    from ..reproduce import DATA_INPUTS

    parser = subparsers.add_parser(
        "reproduce", description="Reproduce a table of the TokenTM, GradToken or TIS paper beside the published "
                                 "numbers. Writes OUTPUT/<recipe>/table.{md,csv,html,json}; the bench cache lives "
                                 "in OUTPUT/bench.")
    parser.add_argument("recipes", nargs="*", metavar="RECIPE", help="recipe name(s), see --list")
    parser.add_argument("--list", action="store_true", help="list the recipes and what each needs")
    for key, item in DATA_INPUTS.items():
        parser.add_argument(item.flag, dest=f"data_{key}", metavar="PATH", help=item.description)
    parser.add_argument("--model", action="append", default=[], metavar="KEY=SOURCE",
                        help="use a checkpoint file or another timm name for one of the recipe's models (repeatable)")
    parser.add_argument("-o", "--output", dest="output_dir", default="vitexplain-reproduce", help="output folder")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_precision_option(parser, default="float32")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--limit", type=positive_int, help="evaluate a random subset of this many images per setting "
                        "(a quick check; the numbers are then not comparable with the paper's)")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--force", action="store_true",
                        help="replace the files of an OUTPUT/bench folder vitexplain did not make")
    parser.set_defaults(func=run)


def describe_recipes() -> str:
    """The --list text: per recipe its table, rows, inputs, models, estimated GPU hours and pieces not yet in
    vitexplain."""
    from ..reproduce import DATA_INPUTS, MODELS, RECIPES, estimate_gpu_hours, plan_recipe

    lines = []
    for name in RECIPES:
        recipe = RECIPES.get(name)
        lines.append(f"{name}  {recipe.paper}, {recipe.title}")
        lines.append(f"    rows:    {', '.join(row.label for row in recipe.rows)}")
        inputs = [DATA_INPUTS[key].flag + (" (optional)" if DATA_INPUTS[key].optional else "")
                  for key in recipe.inputs()]
        lines.append(f"    data:    {', '.join(inputs)}")
        for key in recipe.models():
            spec = MODELS[key]
            weights = f"timm {spec.source}" if spec.source else \
                f"{'model directory' if spec.text else 'checkpoint'} required: --model {key}=PATH"
            lines.append(f"    model:   {key}: {weights}")
        hours = estimate_gpu_hours(recipe)
        shown = "< 0.1" if hours < 0.1 else f"~{hours:.1f}" if hours < 10 else f"~{hours:.0f}"
        lines.append(f"    cost:    {shown} GPU hours (rough estimate)")
        missing = sorted({reason for plan in plan_recipe(recipe)
                          for reason in [plan.reason, *plan.row_reasons.values(),
                                         *plan.metric_reasons.values()] if reason})
        for reason in missing:
            lines.append(f"    missing: {reason} (those cells are reported as not run)")
    lines.append("inputs:")
    lines += [f"    {item.flag} PATH: {item.description}" for item in DATA_INPUTS.values()]
    lines.append("GPU hours assume ~1500 batched ViT-B/16 forwards per second (backward = 2 forwards); see "
                 "vitexplain/reproduce/cost.py.")
    return "\n".join(lines)


def _models(assignments: list[str]) -> dict[str, str]:
    models = {}
    for text in assignments:
        key, equals, source = text.partition("=")
        if not equals or not key or not source:
            raise ValueError(f"--model expects KEY=SOURCE, got {text!r}")
        models[key] = source
    return models


def run(args: argparse.Namespace) -> int:
    from ..models import ModelLoadError
    from ..reproduce import DATA_INPUTS, get_recipe, run_recipe

    if args.list:
        print(describe_recipes())
        return 0
    if not args.recipes:
        print("error: name a recipe (see vitexplain reproduce --list)", file=sys.stderr)
        return 2
    data = {key: getattr(args, f"data_{key}") for key in DATA_INPUTS if getattr(args, f"data_{key}") is not None}
    status = 0
    try:
        output_folder(args.output_dir)
        models = _models(args.model)
        for name in args.recipes:
            recipe = get_recipe(name)
            table = run_recipe(name, data=data, models={k: v for k, v in models.items() if k in recipe.models()},
                               output_dir=args.output_dir, device=args.device, precision=args.precision,
                               batch_size=args.batch_size,
                               limit=args.limit, num_workers=args.num_workers, progress=args.progress,
                               force=args.force)
            if int(os.environ.get("RANK", "0")) != 0:
                continue
            print(table.markdown())
            print(f"wrote {', '.join(table.files.values())}")
            if table.errors:
                count = sum(len(error["images"]) for error in table.errors)
                print(f"{name}: {len(table.errors)} error(s) on {count} image(s); see the table's remarks",
                      file=sys.stderr)
                status = 1
    except (ValueError, TypeError, OSError, ModelLoadError) as error:  # RecipeInputError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    return status
