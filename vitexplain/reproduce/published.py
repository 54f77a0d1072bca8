"""The published numbers, read from ``published/<paper>.yaml`` and checked against the recipe's layout."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .recipe import TableRecipe

PUBLISHED_DIR = Path(__file__).parent / "published"


@dataclass(frozen=True)
class PublishedTable:
    """One table as printed in its paper.

    Attributes:
        paper: the paper, as cited.
        source: the table's caption (where the numbers come from).
        decimals: decimals the paper prints.
        values: (row label, column key) -> number, None where the paper prints none.
        row_sources: row label -> where its numbers come from, when not from the table itself.
    """

    paper: str
    source: str
    decimals: int
    values: dict[tuple[str, str], float | None]
    row_sources: dict[str, str]

    def source_of(self, row: str) -> str:
        return self.row_sources.get(row, self.source)


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"published numbers file {path} is missing")
    return yaml.safe_load(path.read_text())


def published_file(recipe: TableRecipe) -> Path:
    """The YAML file of the recipe's paper: ``published/<tokentm|gradtoken|tis>.yaml``."""
    return PUBLISHED_DIR / f"{recipe.name.split('-')[0]}.yaml"


def load_published(recipe: TableRecipe) -> PublishedTable:
    """The published numbers of ``recipe``'s table; raises if their rows or columns differ from the recipe's."""
    path = published_file(recipe)
    content = _read(path)
    table = content["tables"].get(recipe.name)
    if table is None:
        raise ValueError(f"{path} has no table {recipe.name!r}")
    rows = table["rows"]
    expected_rows = [row.label for row in recipe.rows]
    if list(rows) != expected_rows:
        raise ValueError(f"{path}, {recipe.name}: rows {list(rows)} differ from the recipe's {expected_rows}")
    expected_columns = [column.key for column in recipe.columns]
    values = {}
    for label, cells in rows.items():
        if list(cells) != expected_columns:
            raise ValueError(f"{path}, {recipe.name}, row {label!r}: columns {list(cells)} differ from the "
                             f"recipe's {expected_columns}")
        for key, value in cells.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{path}, {recipe.name}, row {label!r}, column {key!r}: {value!r} is not a number")
            values[label, key] = None if value is None else float(value)
    unknown = sorted(set(table.get("sources", {})) - set(rows))
    if unknown:
        raise ValueError(f"{path}, {recipe.name}: sources given for unknown rows {unknown}")
    return PublishedTable(content["paper"], table["source"], int(table["decimals"]), values,
                          dict(table.get("sources", {})))
