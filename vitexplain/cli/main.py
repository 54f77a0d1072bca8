"""``vitexplain`` entry point: one subcommand per module of this package.

Only the module of the command being run is imported (the others are listed by name and summary),
so ``vitexplain --help`` and ``--version`` answer without loading torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable

#: command -> one-line summary; the command's parser is ``vitexplain.cli.<command, - as _>.add_parser``
COMMANDS = {
    "bench": "benchmark explanation methods with evaluation metrics (resumable, torchrun-aware)",
    "explain": "explain image files: overlay PNG + raw map .npy per image",
    "explain-text": "explain a text classifier's prediction: tokens coloured by relevance + an HTML snippet",
    "methods": "list explanation methods and their options",
    "reproduce": "reproduce a table of the TokenTM, GradToken or TIS paper beside the published numbers",
    "train": "train a ViT (or a DeiT with a teacher) on the digits benchmark, from scratch or from --init",
}


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``vitexplain`` parser with the full arguments of ``commands`` (default: every command);
    the other commands are listed by name and summary only."""
    full = set(COMMANDS if commands is None else commands)
    parser = argparse.ArgumentParser(prog="vitexplain",
                                     description="Explain Vision Transformer predictions and benchmark explanations.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if name in full:
            importlib.import_module(f"{__package__}.{name.replace('-', '_')}").add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[:1])
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
