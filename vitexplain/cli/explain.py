"""``vitexplain explain IMAGE...``: heatmap overlays and raw maps for image files.

Everything the user gives is checked before any image is read (output folder, device, methods,
options, model, target). Images are then read batch by batch, so memory follows ``--batch-size``,
not the number of files. A file that cannot be read, or a method that fails, is reported on stderr
naming it; the rest still runs, and the exit code is 1. Output names follow :data:`NAMING`.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shared import add_method_options, add_precision_option, method_options, output_folder, positive_int, \
    probability_text

NAMING = """\
output names:
  OUTPUT/STEM.METHOD.npy (raw map) and OUTPUT/STEM.METHOD.png (overlay), or with several methods
  (a list, or all) OUTPUT/STEM.all.png (grid) and one .npy per method. STEM is the file name without its extension
  (photo.jpg -> photo). When inputs of one call share a stem, those keep their extension
  (photo.jpg, photo.png), and when that is still ambiguous their parent folders too, as subfolders
  of OUTPUT (a/photo.jpg, b/photo.jpg): names that clash grow, one step at a time, until none does.
  The same file given twice is explained once."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", description="Explain the predictions of a Vision Transformer for image files: a heatmap "
                               "overlay (PNG) and the raw map (.npy) per image and method.",
        epilog=NAMING, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any mode PIL reads)")
    parser.add_argument("--model", required=True, help="shipped model name, timm model name, or checkpoint file")
    parser.add_argument("--arch", help="timm architecture of a checkpoint file")
    parser.add_argument("--method", required=True,
                        help="a method name (see `vitexplain methods`), several separated by commas (gae,tokentm,tis: "
                             "one grid per image), or 'all' (every method that explains images, without the controls)")
    add_method_options(parser)
    parser.add_argument("--target", type=int, help="class to explain (default: each image's prediction)")
    parser.add_argument("-o", "--output", default="vitexplain-out", help="output folder (default: %(default)s)")
    parser.add_argument("--batch-size", type=positive_int, default=16,
                        help="images read and explained together (default: %(default)s)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_precision_option(parser, default="float32")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar (on stderr, it counts images x methods)")
    parser.add_argument("--html", action="store_true",
                        help="also write OUTPUT/explorer.html: one offline page to browse the images and methods, "
                             "compare them side by side and read each token's value (kept in memory until the end)")
    parser.set_defaults(func=run)


def output_names(paths: list[Path]) -> list[str]:
    """Unique output names of distinct absolute paths, as :data:`NAMING` describes: the stem, else the
    file name, else with parent folders; only names that clash grow, so a name does not depend on the
    order of the inputs."""
    def name(path: Path, level: int) -> str:
        return path.stem if level == 0 else "/".join(path.parts[-level:])

    levels = [0] * len(paths)
    while True:
        names = [name(path, level) for path, level in zip(paths, levels)]
        counts = Counter(names)
        clashing = [i for i, text in enumerate(names) if counts[text] > 1 and levels[i] < len(paths[i].parts) - 1]
        if not clashing:
            return names
        for i in clashing:
            levels[i] += 1


@dataclass
class Setup:
    """What the checks before the first image leave: where outputs go, the methods with their options, the model."""

    out: Path
    methods: list[str]
    options: dict[str, dict[str, Any]]
    model: Any
    config: dict[str, Any]
    class_names: list[str]


def prepare(args, out: Path) -> Setup:
    """Check the rest of what the user gave, cheapest first, before any image is read; raises ValueError,
    TypeError or ModelLoadError with a one-line message. Nothing is created: a refused command, or one
    whose every image fails, leaves no folder behind."""
    from ..models import class_names_for, load_model, resolve_device
    from ..registry import available_methods, get_method

    device = resolve_device(args.device)
    methods = (available_methods("image", controls=False) if args.method == "all"
               else list(dict.fromkeys(get_method(name.strip()).name for name in args.method.split(","))))
    options = method_options(methods, args.options)
    model, config = load_model(args.model, arch=args.arch, device=device)
    names = class_names_for(model, config)
    if args.target is not None and not 0 <= args.target < len(names):
        raise ValueError(f"--target {args.target} is not a class of this model "
                         f"(it has {len(names)} classes, 0 to {len(names) - 1})")
    return Setup(out, methods, options, model, config, names)   # the folder is made by the first output written


def unique_files(images: list[str]) -> dict[Path, str]:
    """Each file once (by its resolved path), with the spelling the user first gave it."""
    given: dict[Path, str] = {}
    for text in images:
        given.setdefault(Path(text).resolve(), text)
    return given


def save_outputs(stem: Path, shown, maps: dict[str, Any], title: str, grid: bool) -> None:
    """One image's raw maps (``STEM.METHOD.npy``) and its overlay (``STEM.METHOD.png``) or grid (``STEM.all.png``)."""
    import numpy as np

    from ..viz import save_grid, save_overlay

    stem.parent.mkdir(parents=True, exist_ok=True)
    for method, saliency in maps.items():
        np.save(f"{stem}.{method}.npy", saliency.numpy())
        if not grid:
            save_overlay(f"{stem}.{method}.png", shown, saliency, title=f"{method}: {title}")
    if grid and maps:
        save_grid(f"{stem}.all.png", shown, maps, title=title)


def explorer_item(setup: Setup, name: str, shown, maps: dict[str, Any], probabilities, target: int, batch):
    """One image of the explorer page: its maps, the options each was made with, the top-5 classes."""
    from ..explorer import ExplorerItem
    from ..instrumentation import adapter_for
    from ..registry import get_method

    top = probabilities.topk(min(5, probabilities.numel()))
    return ExplorerItem(
        name=name, image=shown, maps={method: saliency.numpy() for method, saliency in maps.items()},
        options={method: {**get_method(method).options, **setup.options[method]} for method in maps},
        top5=[(setup.class_names[int(c)], float(p)) for p, c in zip(top.values, top.indices)],
        target=setup.class_names[target], grid=tuple(adapter_for(setup.model).grid_size(batch)))


def explained_title(class_names: list[str], target: int, predicted: int, probabilities) -> str:
    """What a map explains: the predicted class and its probability, or the class asked for with its
    probability beside the prediction and its own."""
    def probability(cls: int) -> str:
        return f"p = {probability_text(float(probabilities[cls]))}"

    if target == predicted:
        return f"predicted {class_names[target]} ({probability(target)})"
    return (f"explained class {class_names[target]} ({probability(target)}; predicted {class_names[predicted]}, "
            f"{probability(predicted)})")


def refuse(error: Exception) -> int:
    print(f"error: {error}", file=sys.stderr)
    return 2


def run(args) -> int:
    try:
        out = output_folder(args.output)  # checked before torch is imported: in a fraction of a second
    except ValueError as error:
        return refuse(error)
    from ..models import ModelLoadError

    try:
        setup = prepare(args, out)
    except (ValueError, TypeError, OSError, ModelLoadError) as error:
        return refuse(error)

    import torch
    from tqdm import tqdm

    from ..api import explain
    from ..image_files import ImageLoadError, display_image, load_image, make_transform
    from ..instrumentation.precision import precision_mode

    given = unique_files(args.images)
    files = list(given)
    stems = dict(zip(files, output_names(files)))
    transform = make_transform(setup.config)
    device = next(setup.model.parameters()).device
    errors: list[str] = []
    bar = tqdm(total=len(files) * len(setup.methods), unit="map", file=sys.stderr, disable=not args.progress)

    def report(message: str) -> None:
        errors.append(message)
        bar.write(f"error: {message}", file=sys.stderr)

    pages = []  # explorer items, with --html
    written = False
    with precision_mode(args.precision, device):  # the model's forwards in the user's precision
        for start in range(0, len(files), args.batch_size):
            chunk = files[start:start + args.batch_size]
            kept, tensors, shown = [], [], []
            for path in chunk:  # read here, one batch at a time: memory follows --batch-size
                try:
                    picture = load_image(given[path])
                except ImageLoadError as error:
                    report(str(error))
                    continue
                kept.append(path)
                tensors.append(transform(picture))
                shown.append(display_image(picture, setup.config))
            if not kept:
                bar.update(len(chunk) * len(setup.methods))
                continue
            batch = torch.stack(tensors).to(device)
            with torch.no_grad():
                probabilities = setup.model(batch).softmax(-1).cpu()
            predicted = probabilities.argmax(-1)
            targets = predicted if args.target is None else torch.full_like(predicted, args.target)
            maps = {}
            for method in setup.methods:
                bar.set_postfix_str(method)
                try:
                    maps[method] = explain(setup.model, batch, method, target=targets.to(device), **setup.options[method]).cpu()
                except Exception as error:  # noqa: BLE001 - one failing method must not lose the others
                    report(f"method {method} on {', '.join(given[path] for path in kept)}: {error}")
                bar.update(len(chunk))
            for i, path in enumerate(kept):
                cls = int(targets[i])
                title = explained_title(setup.class_names, cls, int(predicted[i]), probabilities[i])
                try:
                    save_outputs(setup.out / stems[path], shown[i], {m: s[i] for m, s in maps.items()}, title,
                                 grid=len(setup.methods) > 1)
                except OSError as error:
                    report(f"{given[path]}: cannot write its outputs ({error})")
                    continue
                written = True
                bar.write(f"{given[path]} -> {title}", file=sys.stdout)
                if args.html:
                    pages.append(explorer_item(setup, given[path], shown[i], {m: s[i] for m, s in maps.items()},
                                               probabilities[i], cls, batch))
    bar.close()
    if pages:
        from ..explorer import write_explorer

        print(f"wrote {write_explorer(setup.out / 'explorer.html', pages, title=f'vitexplain: {args.model}')}")
    if written:
        print(f"wrote {setup.out}/")
    if errors:
        print(f"{len(errors)} error(s); see above", file=sys.stderr)
    return 1 if errors else 0
