"""The README's tables that come from the code, written by one command: ``python -m vitexplain.readme_tables``.

Each generated table sits in README.md between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``:

- ``methods``: every built-in method with what it is and its paper (its module's first docstring line),
  its resolution, what it explains and its model passes at the default options, read from the registry;
- ``support``: the support matrix (:mod:`vitexplain.support`), which the command also regenerates and
  stores with the package.

A test checks that the README holds what the command would write, so adding a method or a family
changes the README by running the command, never by hand.
"""
from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def method_table() -> str:
    """Markdown rows of every built-in method (controls last), from the registry and the modules' docstrings."""
    from .registry import METHODS

    builtin = [name for name in METHODS.names() if METHODS.get(name).fn.__module__.startswith("vitexplain.methods.")]
    ordered = sorted(builtin, key=lambda name: (METHODS.get(name).control, name))
    lines = ["| method | what it is (paper) | map | explains | model passes (a backward counts 2) |",
             "| --- | --- | --- | --- | ---: |"]
    for name in ordered:
        spec = METHODS.get(name)
        paper = (sys.modules[spec.fn.__module__].__doc__ or "").strip().splitlines()[0].rstrip(".")
        explains = ("control" if spec.control else "the same map for every class" if not spec.class_specific
                    else "a class or any score" if spec.score_targets else "a class")
        lines.append(f"| `{name}` | {paper} | {spec.resolution} | {explains} | {spec.passes():g} |")
    return "\n".join(lines) + "\n"


def support_table() -> str:
    from .support import TABLE
    return TABLE.read_text()


GENERATED = {"methods": method_table, "support": support_table}


def section(text: str, name: str) -> tuple[int, int]:
    """Where the generated ``name`` table's body lies in ``text`` (start, end offsets)."""
    begin, end = f"<!-- generated: {name} -->\n", f"<!-- end: {name} -->"
    if begin not in text or end not in text:
        raise ValueError(f"README.md has no generated section {name!r} ({begin.strip()} … {end})")
    start = text.index(begin) + len(begin)
    return start, text.index(end, start)


def with_tables(text: str) -> str:
    """``text`` (the README) with every generated section rewritten from the code."""
    for name, make in GENERATED.items():
        start, end = section(text, name)
        text = text[:start] + make() + text[end:]
    return text


def main() -> None:
    from .support import write_support_table

    write_support_table()
    README.write_text(with_tables(README.read_text()))
    print(f"wrote {README} ({', '.join(GENERATED)}) and the stored support matrix")


if __name__ == "__main__":
    main()
