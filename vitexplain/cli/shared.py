"""What several subcommands share: argument types, output paths checked before any work, ``-O KEY=VALUE``
method options, number formatting."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def add_precision_option(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    from ..options import PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, default=default,
                        help="what the models run in: float32 (the papers'; default), tf32, or bfloat16 / float16 "
                             "autocast; explanations keep computing in float32, forwards that only score inputs "
                             "take it")


MODEL_FORMS = ("a shipped model (e.g. digits_vit), a timm name with an optional pretrained tag "
               "(vit_base_patch16_224.augreg_in21k), timm's hf-hub:ORG/NAME, the Hugging Face Hub id of a transformers "
               "ViT / DeiT / DINOv2 / CLIP / SigLIP model (google/vit-base-patch16-224, openai/clip-vit-base-patch32), "
               "a local folder of either (save_pretrained), or a checkpoint file with --arch; pretrained weights are "
               "downloaded into the Hugging Face cache (HF_HOME, HF_HUB_CACHE; from HF_ENDPOINT) unless --offline")


def add_model_arguments(parser: argparse.ArgumentParser, *, required: bool = False, repeatable: bool = False) -> None:
    """``--model``, ``--arch`` and ``--offline``, one help text for every command that loads models
    (:func:`vitexplain.models.load_model`)."""
    parser.add_argument("--model", required=required, action="append" if repeatable else "store",
                        help=MODEL_FORMS + (" (repeatable)" if repeatable else ""))
    parser.add_argument("--arch", help="timm architecture of a checkpoint file given as --model (default: the "
                                       "'arch' of the model card beside it)")
    parser.add_argument("--offline", action="store_true",
                        help="read pretrained weights from the local caches only, never the network (as "
                             "HF_HUB_OFFLINE=1 does); a model missing there is a one-line error saying how to fetch it")


def output_folder(path: str | Path) -> Path:
    """``path`` as the folder a command writes into, checked but not created (a command refused after this
    check leaves nothing behind): a file in the way, or a folder that cannot be created or written, is a
    one-line ValueError naming it."""
    folder = Path(path)
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing == folder and not folder.is_dir():
        raise ValueError(f"output {path} is a file, not a folder")
    if not existing.is_dir():
        raise ValueError(f"cannot create output folder {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"output folder {path} is not writable" if existing == folder
                         else f"cannot create output folder {path}: {existing} is not writable")
    return folder


def output_file(path: str | Path) -> Path:
    """``path`` as a file a command writes, checked as :func:`output_folder` checks its folder (not created);
    an existing folder at ``path`` is a ValueError too."""
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"output {path} is a folder, not a file")
    try:
        output_folder(file.parent)
    except ValueError as error:
        raise ValueError(f"cannot write {path}: {error}") from None
    return file


def add_method_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-O", "--option", dest="options", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the method(s), e.g. -O n_masks=256 -O seed=1 (repeatable; the value is "
                             "typed from the method's signature; an option applies to every selected method that "
                             "has it; `vitexplain methods` lists them)")


def method_options(methods: list[str], assignments: list[str]) -> dict[str, dict[str, Any]]:
    """Per method, the ``-O KEY=VALUE`` assignments it has an option for, each value typed by
    :func:`vitexplain.options.parse_option`. Every assignment that names an option none of ``methods``
    has, or gives a value outside its type, is reported in one ValueError."""
    from ..options import parse_option
    from ..registry import get_method

    chosen: dict[str, dict[str, Any]] = {name: {} for name in methods}
    problems = []
    for text in assignments:
        key = text.partition("=")[0].strip().replace("-", "_")
        owners = [name for name in methods if key in get_method(name).options]
        if "=" not in text or not key:
            problems.append(f"-O expects KEY=VALUE, got {text!r}")
        elif not owners:
            problems.append(f"-O {text}: {_no_such_option(methods, key)}")
        for name in owners if "=" in text else []:
            try:
                parsed, value = parse_option(f"method {name!r}", get_method(name).fn, text)
            except (ValueError, TypeError) as error:
                problems.append(f"-O {text}: {error}")
                continue
            chosen[name][parsed] = value
    if problems:
        raise ValueError("; ".join(problems))
    return chosen


def _no_such_option(methods: list[str], key: str) -> str:
    from ..registry import get_method

    offered = ", ".join(sorted({option for name in methods for option in get_method(name).options})) or "none"
    if len(methods) == 1:
        return f"method {methods[0]!r} has no option {key!r} (its options: {offered})"
    return f"none of the {len(methods)} selected methods has an option {key!r} (their options: {offered})"


def probability_text(p: float) -> str:
    """Three decimals, or two significant digits below 0.01 (so 0.002 does not print as 0.00)."""
    return f"{p:.3f}" if p >= 0.01 else f"{p:.2g}"
