"""A reproduced table: reproduced | published | difference per cell, as Markdown, CSV, HTML and JSON."""
from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..bench.store import atomic_write
from ..html_page import html_page

SUBCOLUMNS = ("reproduced", "published", "Δ")
#: the table page's own rules, over the shared style of :mod:`vitexplain.html_page`: every cell ruled, so the paper's
#: grouped headers read as groups
STYLE = """
table { border-collapse: collapse; } th, td { border: 1px solid var(--line); } td { text-align: right; }
th[scope="row"] { text-align: left; } th.sub { font-weight: 400; font-size: 0.85em; }
td.ours { font-weight: 700; } td.missing { color: var(--alert); } td.delta { color: var(--muted); }
"""


@dataclass
class Cell:
    """One number of the table.

    Attributes:
        reproduced: our number, None when it could not be computed (``reason`` says why).
        published: the paper's number, None where the paper prints none.
        images: images the reproduced number is reduced from.
        failed: images of this cell that failed (the number covers the others).
        reason: why ``reproduced`` is missing.
        source: where ``published`` comes from.
        note: how the reproduced number was taken where the protocol chooses (the segmentation threshold).
    """

    row: str
    column: str
    reproduced: float | None
    published: float | None
    source: str
    images: int = 0
    failed: int = 0
    reason: str | None = None
    note: str | None = None

    @property
    def difference(self) -> float | None:
        if self.reproduced is None or self.published is None:
            return None
        return self.reproduced - self.published


@dataclass
class ReproducedTable:
    """A table of a paper next to its reproduction.

    Attributes:
        recipe, paper, title: which table.
        decimals: decimals the paper prints (used for display; CSV and JSON keep full precision).
        rows: row labels in the paper's order.
        columns: (column key, header levels) in the paper's order.
        cells: (row label, column key) -> :class:`Cell`.
        setup: one line per run (model, data, images, target, metrics).
        notes: the recipe's decisions where the paper is silent.
        deviations: what this run changed from the recipe (then the numbers are not comparable).
        errors: errors the bench recorded (model, method, metric, images, error).
        files: the files written, by format.
    """

    recipe: str
    paper: str
    title: str
    decimals: int
    rows: list[str]
    columns: list[tuple[str, tuple[str, ...]]]
    cells: dict[tuple[str, str], Cell]
    setup: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deviations: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------------------- shared pieces

    def _number(self, value: float | None, signed: bool = False) -> str:
        if value is None:
            return ""
        return f"{value:+.{self.decimals}f}" if signed else f"{value:.{self.decimals}f}"

    def footnotes(self) -> list[str]:
        """Distinct remarks on cells (why a number is missing or partial, how it was taken), numbered from 1 in
        table order."""
        found: list[str] = []
        for row in self.rows:
            for key, _ in self.columns:
                remark = self._remark(self.cells[row, key])
                if remark and remark not in found:
                    found.append(remark)
        return found

    @staticmethod
    def _remark(cell: Cell) -> str | None:
        if cell.reason:
            return cell.reason
        remarks = [f"{cell.failed} image(s) failed; the number is over the other {cell.images}"] if cell.failed else []
        remarks += [cell.note] if cell.note else []
        return "; ".join(remarks) or None

    def _cell_texts(self, cell: Cell, notes: list[str]) -> tuple[str, str, str, int | None]:
        """(reproduced, published, difference, footnote number or None) of a cell."""
        remark = self._remark(cell)
        mark = notes.index(remark) + 1 if remark else None
        reproduced = "n/a" if cell.reproduced is None else self._number(cell.reproduced)
        published = "–" if cell.published is None else self._number(cell.published)
        return reproduced, published, self._number(cell.difference, signed=True), mark

    def _sections(self) -> list[tuple[str, list[str]]]:
        return [("Protocol changed: these numbers are not comparable with the paper's", self.deviations),
                ("Setup", self.setup), ("Notes (decisions where the paper is silent)", self.notes)]

    def heading(self) -> str:
        return f"{self.recipe}: {self.paper}, {self.title}"

    # ----------------------------------------------------------------------------------- formats

    def markdown(self) -> str:
        notes = self.footnotes()
        headers = ["Method"]
        for _, header in self.columns:
            name = " · ".join(header)
            headers += [f"{name} · reproduced", "published", "Δ"]
        lines = [f"# {self.heading()}", "",
                 "Each column of the paper is shown as reproduced | published | Δ = reproduced − published.", "",
                 "| " + " | ".join(headers) + " |", "| --- |" + " ---: |" * (len(headers) - 1)]
        for row in self.rows:
            texts = []
            for key, _ in self.columns:
                reproduced, published, difference, mark = self._cell_texts(self.cells[row, key], notes)
                texts += [reproduced + (f" [{mark}]" if mark else ""), published, difference]
            lines.append(f"| {row} | " + " | ".join(text.replace("|", "/") for text in texts) + " |")
        lines.append("")
        if notes:
            lines += [f"[{number}] {note}" for number, note in enumerate(notes, 1)] + [""]
        for title, items in self._sections():
            if items:
                lines += [f"## {title}", ""] + [f"- {item}" for item in items] + [""]
        return "\n".join(lines)

    def csv_text(self) -> str:
        """Long format: one line per cell, full precision."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["recipe", "row", "column", "header", "reproduced", "published", "difference", "images",
                         "failed_images", "reason", "source", "note"])
        for row in self.rows:
            for key, header in self.columns:
                cell = self.cells[row, key]
                writer.writerow([self.recipe, row, key, " · ".join(header),
                                 *("" if v is None else repr(v)
                                   for v in (cell.reproduced, cell.published, cell.difference)),
                                 cell.images, cell.failed, cell.reason or "", cell.source, cell.note or ""])
        return buffer.getvalue()

    def html(self) -> str:
        """A self-contained HTML page: the table with the paper's grouped headers, then the notes."""
        notes = self.footnotes()
        esc = html.escape
        levels = max(len(header) for _, header in self.columns)
        headers = [tuple(header) + ("",) * (levels - len(header)) for _, header in self.columns]
        head = [f'<tr><th rowspan="{levels + 1}">Method</th>']
        for level in range(levels):
            if level:
                head.append("<tr>")
            start = 0
            while start < len(headers):
                end = start
                while end + 1 < len(headers) and headers[end + 1][:level + 1] == headers[start][:level + 1]:
                    end += 1
                head.append(f'<th colspan="{3 * (end - start + 1)}">{esc(headers[start][level])}</th>')
                start = end + 1
            head.append("</tr>")
        head.append("<tr>" + "".join(f'<th class="sub">{name}</th>' for _ in headers for name in SUBCOLUMNS) + "</tr>")
        body = []
        for row in self.rows:
            cells = [f'<th scope="row">{esc(row)}</th>']
            for key, _ in self.columns:
                cell = self.cells[row, key]
                reproduced, published, difference, mark = self._cell_texts(cell, notes)
                title = f' title="{esc(notes[mark - 1])}"' if mark else ""
                sup = f"<sup>{mark}</sup>" if mark else ""
                kind = "missing" if cell.reproduced is None else "ours"
                cells.append(f'<td class="{kind}"{title}>{esc(reproduced)}{sup}</td><td>{esc(published)}</td>'
                             f'<td class="delta">{esc(difference)}</td>')
            body.append("<tr>" + "".join(cells) + "</tr>")
        parts = [
            f"<h1>{esc(self.heading())}</h1>",
            "<p>Each column of the paper is shown as reproduced | published | Δ = reproduced − published.</p>",
            "<table><thead>" + "".join(head) + "</thead><tbody>" + "".join(body) + "</tbody></table>",
        ]
        if notes:
            parts.append("<ol>" + "".join(f"<li>{esc(note)}</li>" for note in notes) + "</ol>")
        for title, items in self._sections():
            if items:
                listed = "".join(f"<li>{esc(item)}</li>" for item in items)
                parts.append(f"<h2>{esc(title)}</h2><ul>{listed}</ul>")
        return html_page(self.recipe, "\n".join(parts), style=STYLE)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cells"] = [{**asdict(cell), "difference": cell.difference} for cell in self.cells.values()]
        return data

    def write(self, directory: str | Path) -> dict[str, str]:
        """table.md, table.csv, table.html and table.json in ``directory``; returns their paths."""
        directory = Path(directory)
        paths = {kind: directory / f"table.{suffix}" for kind, suffix in
                 (("markdown", "md"), ("csv", "csv"), ("html", "html"), ("json", "json"))}
        self.files = {kind: str(path) for kind, path in paths.items()}
        atomic_write(paths["markdown"], self.markdown().encode())
        atomic_write(paths["csv"], self.csv_text().encode())
        atomic_write(paths["html"], self.html().encode())
        atomic_write(paths["json"], json.dumps(self.to_dict(), indent=2, ensure_ascii=False).encode())
        return self.files
