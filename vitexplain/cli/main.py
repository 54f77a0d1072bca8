"""``vitexplain`` entry point: one subcommand per module of this package.

Only the module of the command being run is imported (the others are listed by name and summary),
so ``vitexplain --help`` and ``--version`` answer without loading torch. Every subcommand takes
``--plugin FILE|MODULE`` (repeatable): the plug-ins are imported before the command's arguments are
read, so what they register is there for it (:mod:`vitexplain.plugins`); and ``--no-plugins`` (also
before the subcommand): ``VITEXPLAIN_PLUGINS=0`` for the command, set before any plug-in or registry is
loaded, so no installed plug-in (entry point) is.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable
from contextlib import nullcontext

#: command -> one-line summary; the command's parser is ``vitexplain.cli.<command, - as _>.add_parser``
COMMANDS = {
    "bench": "benchmark explanation methods with evaluation metrics (resumable, torchrun-aware)",
    "explain": "explain image files: overlay PNG + raw map .npy per image",
    "explain-text": "explain a text classifier's prediction: tokens coloured by relevance + an HTML snippet",
    "methods": "list explanation methods and their options",
    "reproduce": "reproduce a table of the TokenTM, GradToken or TIS paper beside the published numbers",
    "train": "train a ViT (or a DeiT with a teacher) on the digits benchmark, from scratch or from --init",
}

EPILOG = ("Installed plug-ins (packages declaring the vitexplain.plugins entry point) load by themselves; "
          "VITEXPLAIN_PLUGINS=0 in the environment, or --no-plugins on any command, starts without them "
          "(--plugin FILE|MODULE still loads).")


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``vitexplain`` parser with the full arguments of ``commands`` (default: every command);
    the other commands are listed by name and summary only."""
    full = set(COMMANDS if commands is None else commands)
    parser = argparse.ArgumentParser(prog="vitexplain",
                                     description="Explain Vision Transformer predictions and benchmark explanations.",
                                     epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--no-plugins", action="store_true",
                        help="start without installed plug-ins (entry points), as VITEXPLAIN_PLUGINS=0 does "
                             "(before or after COMMAND)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if name in full:
            importlib.import_module(f"{__package__}.{name.replace('-', '_')}").add_parser(subparsers)
            _add_plugin_option(subparsers.choices[name])
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def _add_plugin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="FILE|MODULE",
                        help="import a plug-in first: a .py file or a module that registers methods, metrics, "
                             "datasets or model families (repeatable; installed plug-ins load by themselves)")
    parser.add_argument("--no-plugins", action="store_true",
                        help="start without installed plug-ins (the vitexplain.plugins entry points of installed "
                             "packages), as VITEXPLAIN_PLUGINS=0 does; --plugin still loads")


def _early_options(argv: list[str]) -> argparse.Namespace:
    """``--plugin`` and ``--no-plugins`` of ``argv``, read before the full parser reads them."""
    early = argparse.ArgumentParser(add_help=False)
    _add_plugin_option(early)
    return early.parse_known_args(argv[1:])[0]


def _load_plugins(named: list[str]) -> str | None:
    """Import the ``--plugin`` arguments (before the full parser reads them); the error, if any."""
    if not named:
        return None
    from ..plugins import PluginError, load_plugins

    try:
        load_plugins(named)
    except PluginError as error:
        return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--no-plugins"] and argv[1:2] and argv[1] in COMMANDS:
        argv = [argv[1], "--no-plugins", *argv[2:]]         # the global flag, read as the command's own
    early = _early_options(argv) if argv[:1] and argv[0] in COMMANDS else None
    if early is not None and early.no_plugins:
        from ..plugins import without_entry_points

        switch = without_entry_points()
    else:
        switch = nullcontext()
    with switch:                       # before any plug-in or registry is loaded, undone when the command ends
        return _run(argv, early)


def _run(argv: list[str], early: argparse.Namespace | None) -> int:
    problem = _load_plugins(early.plugins) if early is not None else None
    if problem:
        print(f"vitexplain: error: {problem}", file=sys.stderr)
        return 2
    parser = build_parser(argv[:1])
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    from ..plugins import PluginError

    try:
        return int(args.func(args) or 0)
    except PluginError as error:       # a plug-in named in a config, or an installed one, that cannot be loaded
        print(f"vitexplain: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
