"""Every method option the decision notes name exists on the method they name it for.

A note names an option as `` `name=value` `` or `` `name` ``; a name is checked when it is an option of some
registered method or metric (ordinary code words pass). A passage (a bullet with its indented continuation
lines, or a paragraph) in a method's section (a heading naming the method, or a file
``docs/decisions/<method>.md``) may name options of that method and of the methods the passage itself
mentions; a passage elsewhere, options of any method. Metrics' options are known everywhere (metrics and
methods are discussed side by side). Names of the authors' code are written after "their", "the code's",
"authors'" or another possessive, and are not ours to check.
"""
from __future__ import annotations

import re
from pathlib import Path

from vitexplain.metrics.base import METRICS
from vitexplain.registry import METHODS

NOTES = sorted((Path(__file__).resolve().parents[1] / "docs" / "decisions").glob("*.md"))
THEIRS = re.compile(r"(their|code's|authors'|\w's)\s*$")


def passages(text: str, default: str | None) -> list[tuple[str | None, str]]:
    """(the section's method, the passage's text) for each bullet or paragraph of ``text``."""
    names = set(METHODS.names())
    section, found, lines = default, [], []

    def close():
        if lines:
            found.append((section, " ".join(lines)))
            lines.clear()

    for line in text.splitlines():
        heading = re.match(r"#+\s+([^(]*)", line)
        if heading:
            close()
            words = heading.group(1).split()
            named = re.sub(r"[^\w]", "", words[0]).lower() if words else ""
            section = named if named in names else default
        elif not line.strip() or re.match(r"\s{0,1}[-*] |\d+\. ", line):
            close()
            if line.strip():
                lines.append(line)
        else:
            lines.append(line)
    close()
    return found


def named_options(passage: str) -> list[str]:
    """The registered option names ``passage`` writes as `name=...` or `name`, leaving out the authors' code's."""
    every_option = {option for name in METHODS.names() for option in METHODS.get(name).options}
    named = []
    for match in re.finditer(r"`(\w+)(?:=[^`]*)?`", passage):
        option = match.group(1)
        if THEIRS.search(passage[max(0, match.start() - 30):match.start()]):
            continue
        if option in every_option:
            named.append(option)
    return named


def misnamed(text: str, stem: str) -> list[str]:
    """The options ``text`` (a note called ``stem``) names where they are not options."""
    names = set(METHODS.names())
    metric_options = {option for name in METRICS.names() for option in METRICS.get(name).options}
    found = []
    for section, passage in passages(text, stem if stem in names else None):
        if section is None:
            methods = sorted(names)
        else:
            methods = [section] + sorted(name for name in names
                                         if re.search(rf"(?<![\w.]){name}(?!\w)", passage, re.IGNORECASE))
        known = {option for name in methods for option in METHODS.get(name).options} | metric_options
        found += [f"{stem}.md: {option!r} is not an option of {' / '.join(dict.fromkeys(methods))}"
                  for option in named_options(passage) if option not in known]
    return found


def test_every_option_a_decision_note_names_exists():
    missing = [line for note in NOTES for line in misnamed(note.read_text(), note.stem)]
    assert not missing, "\n".join(missing)


def test_the_check_catches_an_option_named_for_the_wrong_method():
    stale = ("# Decisions\n\n## Grad-CAM (Selvaraju et al.)\n- Target layer `blocks[-1].norm1`; `layer=0` selects\n"
             "  another block, `heads` fuses heads, their `heads=2` is the authors' code.\n")
    assert misnamed(stale, "baselines") == ["baselines.md: 'heads' is not an option of gradcam"]
    assert misnamed(stale.replace("## Grad-CAM", "## Overview"), "baselines") == []  # some method has `heads`
