"""The bench's tables as data, and as text for a terminal and Markdown for results.md.

:class:`Table` (one model's scores) and :class:`Ranking` (one model's ranks per protocol) are built
by :class:`vitexplain.bench.result.BenchResult`; this module only lays them out. Terminal tables fit
a width (100 columns by default): each protocol's numbers sit under the protocol's name, protocols
are packed side by side while they fit, and long headers break after an underscore.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: headers up to this many characters are never broken over lines
HEADER_WIDTH = 12


@dataclass
class Table:
    """One model's table: methods as rows, reported numbers as columns.

    ``metrics[j]`` is the metric label of column j, ``numbers[j]`` the number it shows, ``headers[j]``
    its name in a table without protocol headers (the number, or ``metric/number`` when two metrics
    report a number of that name), ``better[j]`` whether higher is better (None: no direction);
    ``best[i][j]`` marks the best value of a column among the methods that are not controls (ties
    all marked); ``counts`` gives, per metric label, how many images its numbers come from ("20", or
    "18/20" when methods differ).
    """

    model: str
    metrics: list[str]
    headers: list[str]
    better: list[bool | None]
    methods: list[str]
    values: list[list[float | None]]
    best: list[list[bool]]
    controls: set[str]
    numbers: list[str] = field(default_factory=list)
    counts: dict[str, str] = field(default_factory=dict)

    def header(self, column: int) -> str:
        return self.headers[column] + arrow(self.better[column])


@dataclass
class Ranking:
    """One model's methods ranked per protocol (the definition: docs/decisions/bench.md).

    ``methods`` are sorted by ``mean`` rank (best first; methods without any rank last), ``ranks[i][k]``
    is method i's rank on ``protocols[k]`` (None when it has no number there); controls are ranked
    among the methods for reference, without moving anyone else's rank.
    """

    model: str
    protocols: list[str]
    methods: list[str]
    ranks: list[list[float | None]]
    mean: list[float | None]
    controls: set[str]


@dataclass
class TextColumn:
    """A column of a terminal table: its header, its cells, and the group title shown above it."""

    header: str
    cells: list[str]
    group: str = ""


def arrow(better: bool | None) -> str:
    return {True: " ↑", False: " ↓", None: ""}[better]


def format_value(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def format_rank(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def method_name(method: str, controls: set[str]) -> str:
    return method + (" (control)" if method in controls else "")


def _header_lines(header: str, width: int) -> list[str]:
    """``header`` broken after underscores into lines no wider than ``width`` (a longer piece stays whole)."""
    lines = [""]
    for piece in re.split(r"(?<=_)", header):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines


def _column_width(column: TextColumn) -> int:
    longest_piece = max(len(piece) for piece in re.split(r"(?<=_)", column.header))
    return max(min(len(column.header), HEADER_WIDTH), longest_piece, *(len(cell) for cell in column.cells))


def text_table(names: list[str], columns: list[TextColumn], width: int = 100, first: str = "method") -> list[str]:
    """Aligned lines of ``names`` and ``columns``, in blocks no wider than ``width`` (unless one column is).

    Columns of one group (consecutive equal ``group``) stay in one block when they fit in one, under
    their group's title; a group wider than a block is split over several, its title repeated.
    """
    name_width = max(len(name) for name in [first, *names])
    widths = [_column_width(column) for column in columns]
    groups: list[list[int]] = []
    for j, column in enumerate(columns):
        if groups and columns[groups[-1][0]].group == column.group:
            groups[-1].append(j)
        else:
            groups.append([j])
    for members in groups:
        title, span = columns[members[0]].group, sum(widths[j] for j in members) + 2 * (len(members) - 1)
        widths[members[-1]] += max(0, len(title) - span)
    blocks: list[list[int]] = [[]]
    used = name_width
    for members in groups:
        if blocks[-1] and used + sum(2 + widths[j] for j in members) > width:
            blocks.append([])
            used = name_width
        for j in members:
            if blocks[-1] and used + 2 + widths[j] > width:
                blocks.append([])
                used = name_width
            blocks[-1].append(j)
            used += 2 + widths[j]
    lines = []
    for block in blocks:
        lines += _block(names, columns, widths, block, name_width, first)
    return lines


def _block(names: list[str], columns: list[TextColumn], widths: list[int], block: list[int], name_width: int,
           first: str) -> list[str]:
    indent = " " * name_width
    lines = []
    if any(columns[j].group for j in block):
        parts: list[list] = []                      # [title, span] of each group in the block
        for previous, j in zip([None, *block], block):
            if previous is not None and columns[previous].group == columns[j].group:
                parts[-1][1] += 2 + widths[j]
            else:
                parts.append([columns[j].group, widths[j]])
        lines.append(indent + "".join("  " + title[:span].ljust(span) for title, span in parts).rstrip())
        lines.append(indent + "".join("  " + ("─" if title else " ") * span for title, span in parts).rstrip())
    headers = {j: _header_lines(columns[j].header, widths[j]) for j in block}
    height = max(len(found) for found in headers.values())
    for row in range(height):
        cells = "".join("  " + (headers[j][row - height + len(headers[j])] if row >= height - len(headers[j]) else "")
                        .rjust(widths[j]) for j in block)
        lines.append((first if row == height - 1 else "").ljust(name_width) + cells)
    rule = "-" * (name_width + sum(2 + widths[j] for j in block))
    lines.append(rule)
    for i, name in enumerate(names):
        lines.append(name.ljust(name_width) + "".join("  " + columns[j].cells[i].rjust(widths[j]) for j in block))
    return lines + [rule, ""]


def score_text(table: Table, width: int = 100) -> list[str]:
    """The model's scores, one group of columns per protocol; best values end in ``*``."""
    columns = []
    for j, metric in enumerate(table.metrics):
        cells = [format_value(values[j]) + ("*" if best[j] else " ") for values, best in zip(table.values, table.best)]
        count = table.counts.get(metric)
        columns.append(TextColumn(table.numbers[j] + arrow(table.better[j]), cells,
                                  metric + (f" (n={count})" if count else "")))
    return text_table([method_name(m, table.controls) for m in table.methods], columns, width)


def ranking_text(ranking: Ranking, width: int = 100) -> list[str]:
    columns = [TextColumn("mean rank", [format_rank(v) for v in ranking.mean])]
    columns += [TextColumn(protocol, [format_rank(row[k]) for row in ranking.ranks]) for k, protocol in enumerate(ranking.protocols)]
    return text_table([method_name(m, ranking.controls) for m in ranking.methods], columns, width)


def sanity_text(check: dict, width: int = 100) -> list[str]:
    names = list(check["methods"])
    columns = [TextColumn(level, [f"{check['methods'][m]['correlation'][k]:.2f}" for m in names])
               for k, level in enumerate(check["levels"])]
    columns.append(TextColumn("flagged", ["FLAGGED" if check["methods"][m]["flagged"] else "" for m in names]))
    return text_table(names, columns, width)


def _markdown_rows(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
            + ["| " + " | ".join(row) + " |" for row in rows] + [""])


def score_markdown(table: Table) -> list[str]:
    rows = []
    for method, values, best in zip(table.methods, table.values, table.best):
        cells = [f"**{format_value(v)}**" if b else format_value(v) for v, b in zip(values, best)]
        rows.append([f"*{method} (control)*" if method in table.controls else method, *cells])
    return _markdown_rows(["method", *map(table.header, range(len(table.headers)))], rows)


def ranking_markdown(ranking: Ranking) -> list[str]:
    best = min((v for m, v in zip(ranking.methods, ranking.mean) if v is not None and m not in ranking.controls),
               default=math.nan)
    rows = []
    for method, mean, ranks in zip(ranking.methods, ranking.mean, ranking.ranks):
        shown = format_rank(mean)
        rows.append([f"*{method} (control)*" if method in ranking.controls else method,
                     f"**{shown}**" if mean == best and method not in ranking.controls else shown, *map(format_rank, ranks)])
    return _markdown_rows(["method", "mean rank", *ranking.protocols], rows)


def sanity_markdown(check: dict) -> list[str]:
    rows = [[method, *(f"{v:.2f}" for v in found["correlation"]), "**yes**" if found["flagged"] else "no"]
            for method, found in check["methods"].items()]
    return _markdown_rows(["method", *check["levels"], "flagged"], rows)
