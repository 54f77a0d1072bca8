"""The site's navigation shows each design note by its title (mkdocs.yml, or the note's first heading): a title names
what the note decides, never the internal issue it came from, which a reader of the site cannot look up."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def test_no_design_note_title_names_an_issue():
    titled = {}
    for note in sorted((ROOT / "docs" / "decisions").glob("*.md")):
        first = note.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# "), f"{note.name}: the first line is its title, '# ...'"
        titled[note.name] = first
    assert not {name: title for name, title in titled.items() if ISSUE.search(title)}


def test_no_navigation_title_names_an_issue():
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)   # mkdocs.yml's !!python/name tags
    titles = []

    def walk(items):
        for item in items:
            if isinstance(item, dict):
                for title, value in item.items():
                    titles.append(title)
                    if isinstance(value, list):
                        walk(value)

    walk(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"])
    assert titles and not [title for title in titles if ISSUE.search(title)]
