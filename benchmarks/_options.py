"""Method options on a benchmark's command line: ``--option METHOD.KEY=VALUE``, repeatable."""
from __future__ import annotations

import argparse
import ast


def add_option_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="method option, e.g. tis.n_masks=256 (value parsed as Python literal)")


def method_options(items: list[str]) -> dict[str, dict]:
    """{method: {option: value}} from the ``--option`` items."""
    options: dict[str, dict] = {}
    for item in items:
        key, value = item.split("=", 1)
        method, name = key.split(".", 1)
        options.setdefault(method, {})[name] = ast.literal_eval(value)
    return options
