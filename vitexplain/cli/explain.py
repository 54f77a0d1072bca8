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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shared import (
    add_method_options,
    add_model_arguments,
    add_precision_option,
    method_options,
    output_folder,
    positive_int,
    probability_text,
)

NAMING = """\
output names:
  OUTPUT/STEM.METHOD.npy (raw map) and OUTPUT/STEM.METHOD.png (overlay), or with several methods
  (a list, or all) OUTPUT/STEM.all.png (grid) and one .npy per method. STEM is the file name without its extension
  (photo.jpg -> photo). When inputs of one call share a stem, those keep their extension
  (photo.jpg, photo.png), and when that is still ambiguous their parent folders too, as subfolders
  of OUTPUT (a/photo.jpg, b/photo.jpg): names that clash grow, one step at a time, until none does.
  The same file given twice is explained once.
  With --text, each text gets its own outputs: OUTPUT/STEM.TEXT.METHOD.npy and .png (or STEM.TEXT.all.png),
  TEXT the text in lower case with every run of other characters than letters and digits made one '_'
  (at most 40 characters; texts that still clash get -2, -3 ...)."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", description="Explain the predictions of a Vision Transformer for image files: a heatmap "
                               "overlay (PNG) and the raw map (.npy) per image and method.",
        epilog=NAMING, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any mode PIL reads)")
    add_model_arguments(parser, required=True)
    parser.add_argument("--method", required=True,
                        help="a method name (see `vitexplain methods`), several separated by commas (gae,tokentm,tis: "
                             "one grid per image), or 'all' (every method that explains images, without the controls)")
    add_method_options(parser)
    parser.add_argument("--target", type=int, help="class to explain (default: each image's prediction)")
    parser.add_argument("--classes", action="store_true",
                        help="the model's outputs are classes: explain them although its head looks like a CLIP-style "
                             "projection to an embedding (which is refused without this flag)")
    parser.add_argument("--text", action="append", metavar="TEXT",
                        help="explain the image's similarity to this text (CLIP / SigLIP two-tower models, with their "
                             "tokenizer: the cosine of the image and text embeddings); repeat it for several texts, "
                             "one map each")
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
    texts: list[str] | None = None
    classes: bool | None = None


def prepare(args, out: Path) -> Setup:
    """Check the rest of what the user gave, cheapest first, before any image is read; raises ValueError,
    TypeError or ModelLoadError with a one-line message. Nothing is created: a refused command, or one
    whose every image fails, leaves no folder behind."""
    from ..devices import resolve_device
    from ..models import class_names_for, load_model
    from ..registry import available_methods, get_method

    device = resolve_device(args.device)
    methods = (available_methods("image", controls=False) if args.method == "all"
               else list(dict.fromkeys(get_method(name.strip()).name for name in args.method.split(","))))
    options = method_options(methods, args.options)
    model, config = load_model(args.model, arch=args.arch, device=device, offline=args.offline or None)
    names = class_names_for(model, config)
    texts = check_texts(args, model, config)
    if texts:  # a text is a score target: 'all' means the methods that explain one, and a named LRP method is refused
        methods = [name for name in methods if args.method != "all" or get_method(name).score_targets]
        for name in methods:
            if not get_method(name).score_targets:
                raise ValueError(f"method {name} explains classes only (LRP starts from relevance on the class "
                                 "logits), not the similarity to a --text")
    classes = True if args.classes else None
    if not texts:
        check_classes(args.model, model, classes)
    if args.target is not None and not 0 <= args.target < len(names):
        raise ValueError(f"--target {args.target} is not a class of this model "
                         f"(it has {len(names)} classes, 0 to {len(names) - 1})")
    # the folder is made by the first output written
    return Setup(out, methods, options, model, config, names, texts, classes)


def check_classes(name: str, model, classes: bool | None) -> None:
    """Refuse, before any image is read, a model whose outputs are not class logits (a CLIP-style projection
    head, no classifier) unless ``--classes`` says they are (docs/decisions/targets.md)."""
    from ..instrumentation import adapter_for

    reason = adapter_for(model, classes=classes).head_reason
    if reason is not None:
        raise ValueError(f"{name}: {reason}, so it has no classes to explain: give --classes if its outputs are "
                         "classes after all (an embedding direction is explained with --text on a two-tower model, "
                         "or target= in Python)")


def check_texts(args, model, config: dict[str, Any]) -> list[str] | None:
    """The distinct ``--text`` values, once the model has embedded them (so a model without a text tower, or
    without its tokenizer, is refused before any image is read); None without ``--text``."""
    if not args.text:
        if config.get("two_tower"):
            raise ValueError(f"{args.model} is a two-tower model without a classifier: give --text (one or more)")
        return None
    if args.target is not None:
        raise ValueError("--target (a class) and --text are exclusive")
    texts = list(dict.fromkeys(args.text))
    if not all(text.strip() for text in texts):
        raise ValueError("--text must not be empty")
    from ..text_prompts import text_embeddings

    text_embeddings(model, texts)
    return texts


def text_slugs(texts: list[str]) -> list[str]:
    """Each text as a part of a file name (see :data:`NAMING`), distinct."""
    import re

    slugs, seen = [], Counter()
    for text in texts:
        slug = re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")[:40] or "text"
        seen[slug] += 1
        slugs.append(slug if seen[slug] == 1 else f"{slug}-{seen[slug]}")
    return slugs


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


def explorer_item(setup: Setup, name: str, shown, maps: dict[str, Any], target: str, top5=()):
    """One image of the explorer page: its maps, the options each was made with, what they explain and the
    top-5 classes (none for a text)."""
    import torch

    from ..explorer import ExplorerItem
    from ..instrumentation import adapter_for
    from ..registry import get_method

    return ExplorerItem(
        name=name, image=shown, maps={method: saliency.numpy() for method, saliency in maps.items()},
        options={method: {**get_method(method).options, **setup.options[method]} for method in maps},
        top5=list(top5), target=target,
        grid=tuple(adapter_for(setup.model).grid_size(torch.empty(1, 3, *shown.shape[:2]))))


def top_classes(class_names: list[str], probabilities) -> list[tuple[str, float]]:
    """The five most probable classes, by name, with their probabilities."""
    top = probabilities.topk(min(5, probabilities.numel()))
    return [(class_names[int(c)], float(p)) for p, c in zip(top.values, top.indices)]


def text_outputs(setup: Setup, item) -> Iterator[tuple[str, str, dict[str, Any], str]]:
    """--text: each text's part of an explained image: (its slug, the text, maps by method, the title with the
    image–text cosine)."""
    for t, (text, slug) in enumerate(zip(setup.texts, text_slugs(setup.texts))):
        yield (slug, text, {method: found[t] for method, found in item.maps.items()},
               f'"{text}" (cosine {float(item.cosines[t]):.3f})')


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


def _earlier_explorer(folder: Path) -> bool:
    """Whether the folder's explorer.html is a page vitexplain wrote (before output folders had the marker)."""
    try:
        with open(folder / "explorer.html", "rb") as page:
            return b"<title>vitexplain" in page.read(4096)
    except OSError:
        return False


def run(args) -> int:
    from ..output_folders import FolderNotOurs, check_folder

    try:
        out = output_folder(args.output)  # checked before torch is imported: in a fraction of a second
        # the per-image names are vitexplain's own (STEM.METHOD.npy ...): only a user's explorer.html could be lost
        check_folder(out, ["explorer.html"] if args.html else [], "explain --html", recognised=_earlier_explorer,
                     hint="name another folder (-o), or move that file")
    except (ValueError, FolderNotOurs) as error:
        return refuse(error)
    from ..models import ModelLoadError

    try:
        setup = prepare(args, out)
    except (ValueError, TypeError, OSError, ModelLoadError) as error:
        return refuse(error)

    from tqdm import tqdm

    from ..file_explanations import explain_files, explain_files_with_texts
    from ..instrumentation.precision import precision_mode

    given = unique_files(args.images)
    files = list(given)
    stems = {given[path]: setup.out / name for path, name in zip(files, output_names(files))}
    errors: list[str] = []
    bar = tqdm(total=len(files) * len(setup.methods), unit="map", file=sys.stderr, disable=not args.progress)

    def report(message: str) -> None:
        errors.append(message)
        bar.write(f"error: {message}", file=sys.stderr)

    def progress(images: int, method: str) -> None:
        bar.set_postfix_str(method)
        bar.update(images)

    def write(stem: Path, name: str, shown, maps: dict[str, Any], title: str) -> bool:
        """One image's outputs; False, reported, when they cannot be written, or none is left to write (every
        method failed on it, each reported)."""
        if not maps:
            return False
        try:
            save_outputs(stem, shown, maps, title, grid=len(setup.methods) > 1)
        except OSError as error:
            report(f"{name}: cannot write its outputs ({error})")
            return False
        bar.write(f"{name} -> {title}", file=sys.stdout)
        return True

    pages = []  # explorer items, with --html
    written = False
    common = dict(config=setup.config, options=setup.options, batch_size=args.batch_size, on_error=report,
                  on_progress=progress)
    inputs = [given[path] for path in files]
    device = next(setup.model.parameters()).device
    with precision_mode(args.precision, device):  # the model's forwards in the user's precision
        if setup.texts:  # --text: one map per image, text and method
            for item in explain_files_with_texts(setup.model, inputs, setup.methods, setup.texts, **common):
                stem = stems[item.name]
                for slug, text, maps, title in text_outputs(setup, item):
                    if write(stem.with_name(f"{stem.name}.{slug}"), item.name, item.shown, maps, title):
                        written = True
                        if args.html:
                            pages.append(explorer_item(setup, f"{item.name}: {text}", item.shown, maps, title))
        else:
            for item in explain_files(setup.model, inputs, setup.methods, target=args.target, classes=setup.classes,
                                      **common):
                title = explained_title(setup.class_names, item.target, item.predicted, item.probabilities)
                if write(stems[item.name], item.name, item.shown, item.maps, title):
                    written = True
                    if args.html:
                        pages.append(explorer_item(setup, item.name, item.shown, item.maps,
                                                   setup.class_names[item.target],
                                                   top_classes(setup.class_names, item.probabilities)))
    bar.close()
    if pages:
        from ..explorer import write_explorer

        print(f"wrote {write_explorer(setup.out / 'explorer.html', pages, title=f'vitexplain: {args.model}')}")
    if written:
        from ..output_folders import mark_folder

        mark_folder(setup.out, "vitexplain explain")   # a folder dataset skips it; its explorer.html is ours
        print(f"wrote {setup.out}/")
    if errors:
        print(f"{len(errors)} error(s); see above", file=sys.stderr)
    return 1 if errors else 0
