"""The support matrix stored with the package (and shown in the README) is what the code does now."""
from __future__ import annotations

import re
from pathlib import Path

from vitexplain.support import TABLE, builtin_methods, support_markdown, support_matrix


def test_the_stored_support_matrix_is_regenerated_exactly():
    """Every built-in method runs on every family's example, or is refused with the reason the table gives
    (methods other tests register are not part of the stored table)."""
    assert support_markdown(support_matrix(builtin_methods())) == TABLE.read_text(), \
        "the support matrix changed: run `python -m vitexplain.support` and copy it into the README"


def test_the_readme_shows_the_stored_matrix():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = TABLE.read_text()
    first, last = table.splitlines()[0], table.strip().splitlines()[-1]
    section = readme[readme.index(first):]
    assert section.startswith(table.strip()[:len(section)]) and last in section, \
        "README.md's support matrix differs from vitexplain/assets/support.md"
    assert re.search(r"vitexplain methods --models", readme)
