"""The bench's tables as data, and as text for a terminal and Markdown for results.md.

:class:`Table` (one model's scores) and the :class:`Lead` rows of its summary (who leads each
reported number, per kind of protocol) are built by :class:`vitexplain.bench.result.BenchResult`;
this module only lays them out, every number as :func:`format_estimate` writes it, one format per
column (:func:`column_decimals`). Terminal tables fit
a width (100 columns by default): each protocol's numbers sit under the protocol's name, protocols
are packed side by side while they fit, and long headers break after an underscore.
"""
from __future__ import annotations

import math
import re
import statistics
import textwrap
from dataclasses import dataclass, field

from ..metrics.base import GROUPS
from ..uncertainty import MIN_IMAGES, TOO_FEW, has_interval

#: headers up to this many characters are never broken over lines
HEADER_WIDTH = 12


@dataclass(frozen=True)
class Estimate:
    """A reported number, the bounds of its 95 % bootstrap interval and how many images it comes from."""

    value: float
    low: float
    high: float
    images: int


#: the most decimals a number is shown with
MAX_DECIMALS = 6


def column_decimals(estimates: list[Estimate | None]) -> int:
    """One format for a column: the decimals that give its median interval width two significant digits
    (a control whose interval is almost 0 does not give the whole column eight decimals), or, where no
    interval has a width, the largest value three significant digits; from 0 to :data:`MAX_DECIMALS`."""
    found = [e for e in estimates if e is not None]
    widths = [e.high - e.low for e in found if math.isfinite(e.high - e.low) and e.high > e.low]
    if widths:
        decimals = 1 - math.floor(math.log10(statistics.median(widths)))
    else:
        largest = max((abs(e.value) for e in found if math.isfinite(e.value) and e.value), default=0.0)
        decimals = 2 - math.floor(math.log10(largest)) if largest else 2
    return min(max(decimals, 0), MAX_DECIMALS)


def fixed(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals; a value that rounds to 0 shows no sign (``0.000``, never
    ``-0.000`` or ``1.984e-17``)."""
    if not math.isfinite(value):
        return "–" if math.isnan(value) else f"{value}"
    text = f"{value:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def format_estimate(estimate: Estimate, decimals: int | None = None) -> str:
    """``value [low, high] (n)``, all three with ``decimals`` decimals (by default as
    :func:`column_decimals` gives a column of this number alone); ``value [too few images for an interval] (n)``
    when it has no interval because n is below :data:`~vitexplain.uncertainty.MIN_IMAGES`."""
    decimals = column_decimals([estimate]) if decimals is None else decimals
    value, low, high = (fixed(v, decimals) for v in (estimate.value, estimate.low, estimate.high))
    if not has_interval(estimate.images) and math.isnan(estimate.low) and math.isnan(estimate.high):
        return f"{value} [{TOO_FEW}] ({estimate.images})"
    return f"{value} [{low}, {high}] ({estimate.images})"


#: how a table marks a value: better than every other method at 95 % (``best``), or not told apart from the best
#: (``tied``)
TEXT_MARKS = {"best": "*", "tied": "≈", "": ""}


@dataclass
class Table:
    """One model's table: methods as rows, reported numbers as columns.

    ``metrics[j]`` is the metric label of column j, ``numbers[j]`` the number it shows, ``headers[j]``
    its name in a table without protocol headers (the number, or ``metric/number`` when two metrics
    report a number of that name), ``better[j]`` whether higher is better (None: no direction);
    ``marks[i][j]`` is ``"best"``, ``"tied"`` or ``""`` (see :data:`TEXT_MARKS`; controls are never marked);
    ``counts`` gives, per metric label, how many images its numbers come from ("20", or "18/20" when
    methods differ).
    """

    model: str
    metrics: list[str]
    headers: list[str]
    better: list[bool | None]
    methods: list[str]
    values: list[list[Estimate | None]]
    marks: list[list[str]]
    controls: set[str]
    numbers: list[str] = field(default_factory=list)
    counts: dict[str, str] = field(default_factory=dict)

    def header(self, column: int) -> str:
        return self.headers[column] + arrow(self.better[column])

    def cells(self, column: int) -> list[str]:
        """The column's numbers, one format for all (:func:`column_decimals`), ``–`` where a method has none."""
        decimals = column_decimals([row[column] for row in self.values])
        return ["–" if row[column] is None else format_estimate(row[column], decimals) for row in self.values]


#: what the summary says of a number that cannot tell the random control from the methods
UNTRUSTED = "cannot tell the random control from the methods on this model: not counted"
#: what the summary says of a number on too few images for an interval (no best, no tied, no trust record)
TOO_FEW_TO_COMPARE = f"too few images to compare the methods (an interval needs {MIN_IMAGES})"


@dataclass
class Lead:
    """Who leads one reported number: ``methods`` (one: better than every other method at 95 %; more:
    tied, in order of value) and the ``controls`` no leader is better than; ``images`` as Table.counts;
    ``trust`` how far the number can be trusted on this model (``BenchResult.trust``; None: not computed)."""

    group: str
    metric: str
    number: str
    better: bool
    images: str
    methods: list[str]
    controls: list[str]
    trust: dict | None = None

    @property
    def counted(self) -> bool:
        """False when the number cannot tell the random control from the best method at 95 %: its leaders are
        not counted (shown as :data:`UNTRUSTED`)."""
        random = (self.trust or {}).get("random")
        return random is None or bool(random["separates"])

    def leaders(self) -> str:
        if not self.methods:
            return TOO_FEW_TO_COMPARE if not has_interval(_image_count(self.images)) else "–"
        if not self.counted:
            return UNTRUSTED
        return ("best: " if len(self.methods) == 1 else f"tied ({len(self.methods)}): ") + ", ".join(self.methods)

    def trust_text(self) -> str:
        """One short line: ``separates random: yes; beats its degraded copies: 3/3; ranking rho 0.91 [0.72, 0.99]``,
        with ``unchanged under minor weight noise: 9/10, ranking kept rho 0.98`` when the run has a noisy copy of
        the model (``–`` where nothing was computed)."""
        return trust_text(self.trust)


def trust_text(trust: dict | None) -> str:
    """The short line of :meth:`Lead.trust_text` for one number's ``BenchResult.trust`` entry."""
    if not trust:
        return "–"
    random = trust.get("random")
    parts = ["separates random: " + ("– (no random control)" if random is None
                                     else "yes" if random["separates"] else "no")]
    copies = trust.get("degraded") or []
    if copies:
        parts.append(f"beats its degraded copies: {sum(c['beats'] for c in copies)}/{len(copies)}")
    stability = trust.get("rank_stability")
    if stability is not None:
        parts.append(f"ranking ρ {fixed(stability[0], 2)} [{fixed(stability[1], 2)}, {fixed(stability[2], 2)}]")
    noise = trust.get("noise_resilience")
    if noise:
        kept = "" if noise["ranking"] is None else f", ranking kept ρ {fixed(noise['ranking'], 2)}"
        parts.append(f"unchanged under minor weight noise: {noise['unchanged']}/{noise['of']}{kept}")
    return "; ".join(parts)


def advantage_text(advantage: list[float], images: int | str, verdict: bool) -> str:
    """``value [low, high] (n)`` of an advantage, then ``yes`` / ``no`` (its interval above 0 or not)."""
    return f"{format_estimate(Estimate(*advantage, _image_count(images)))} {'yes' if verdict else 'no'}"


def _image_count(images: int | str) -> int:
    """The image count of a :attr:`Lead.images` ("20", or "18/20" when methods differ: the first)."""
    first = str(images).split("/")[0]
    return int(first) if first.isdigit() else 0


def trust_rows(leads: list[Lead]) -> list[list[str]]:
    """Per number with a trust entry: protocol, number, best method, its advantage over the random control,
    each method's advantage over each of its degraded copies, the ranking's stability over resamples."""
    rows = []
    for lead in leads:
        trust = lead.trust
        if not trust:
            continue
        random = trust.get("random")
        versus = ("–" if random is None else f"{trust['best']} − {random['control']}: "
                  + advantage_text(random["advantage"], lead.images, random["separates"]))
        copies = "; ".join(f"{c['method']} − {c['copy']}: {advantage_text(c['advantage'], lead.images, c['beats'])}"
                           for c in trust.get("degraded") or []) or "–"
        stability = trust.get("rank_stability")
        rho = "–" if stability is None else " ".join([fixed(stability[0], 2),
                                                       f"[{fixed(stability[1], 2)}, {fixed(stability[2], 2)}]"])
        rows.append([lead.metric, lead.number + arrow(lead.better), versus, copies, rho])
    if any((lead.trust or {}).get("noise_resilience") for lead in leads):   # a column only for a run with a copy
        noisy = [noise_cell((lead.trust or {}).get("noise_resilience"), lead.images) for lead in leads if lead.trust]
        rows = [row + [cell] for row, cell in zip(rows, noisy)]
    return rows


def noise_cell(noise: dict | None, images: int | str) -> str:
    """Each method's change under the model's minor weight noise: ``gae: 0.001 [-0.002, 0.004] (20) unchanged; …;
    ranking ρ 1.00 (methods' spread 0.4)``."""
    if not noise:
        return "–"
    count = _image_count(images)
    found = [f"{row['method']}: {format_estimate(Estimate(*row['difference'], count))} "
             f"{'unchanged' if row['resilient'] else 'changed'}" for row in noise["methods"]]
    rho = "–" if noise["ranking"] is None else fixed(noise["ranking"], 2)
    spread = fixed(noise["spread"], column_decimals([Estimate(noise["spread"], 0.0, 0.0, count)]))
    return "; ".join(found) + f"; ranking ρ {rho} (methods' spread {spread})"


def trust_header(rows: list[list[str]]) -> list[str]:
    """The header of :func:`trust_rows`' rows: :data:`TRUST_HEADER`, and the noise column when they have it."""
    return TRUST_HEADER + ([NOISE_HEADER] if rows and len(rows[0]) > len(TRUST_HEADER) else [])


def trust_note(rows: list[list[str]]) -> str:
    """How the trust table is read: :data:`TRUST_NOTE`, and :data:`NOISE_NOTE` when it has the noise column."""
    return TRUST_NOTE + (" " + NOISE_NOTE if rows and len(rows[0]) > len(TRUST_HEADER) else "")


#: the header of :func:`trust_rows`
TRUST_HEADER = ["protocol", "number", "best − random control (advantage, 95 %)",
                "method − its degraded copy (advantage, 95 %)", "ranking ρ over resamples"]

#: how the trust columns are read, under every trust table
TRUST_NOTE = ("Advantage: how much better the first is than the second, in the number's units (positive = better in "
              "its direction), with the paired 95 % bootstrap interval over the same images; yes = the interval "
              "lies above 0. Ranking ρ: Spearman correlation of the methods' values (controls left out) on each "
              "resample of the images with their values on all of them, median and central 95 % of the "
              "resamples (docs/decisions/metric-trust.md).")
#: the header of the noise column of :func:`trust_rows` (a run with a noisy copy of the model)
NOISE_HEADER = "copy − original under minor weight noise (95 %)"
#: how the noise column is read
NOISE_NOTE = ("Minor weight noise: each method's value on the model's noisy copy less its value on the model, paired "
              "over the same images; unchanged = the interval holds 0; ranking ρ: Spearman correlation of the methods' "
              "values (controls left out) on the model and on its copy; spread: the largest less the smallest method "
              "value on the model, to weigh a change against (MetaQuantus's noise resilience).")


@dataclass
class TextColumn:
    """A column of a terminal table: its header, its cells, and the group title shown above it."""

    header: str
    cells: list[str]
    group: str = ""


def arrow(better: bool | None) -> str:
    return {True: " ↑", False: " ↓", None: ""}[better]


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
    """The model's scores, one group of columns per protocol; best values end in ``*``, tied ones in ``≈``."""
    columns = []
    for j, metric in enumerate(table.metrics):
        cells = [cell + (TEXT_MARKS[marks[j]] or " ") for cell, marks in zip(table.cells(j), table.marks)]
        count = table.counts.get(metric)
        columns.append(TextColumn(table.numbers[j] + arrow(table.better[j]), cells,
                                  metric + (f" (n={count})" if count else "")))
    return text_table([method_name(m, table.controls) for m in table.methods], columns, width)


def groups_of(leads: list[Lead]) -> dict[str, list[Lead]]:
    """The leads by kind of protocol, kinds in the order of :data:`~vitexplain.metrics.base.GROUPS`."""
    grouped: dict[str, list[Lead]] = {}
    for group in sorted({lead.group for lead in leads},
                        key=lambda g: list(GROUPS).index(g) if g in GROUPS else len(GROUPS)):
        grouped[group] = [lead for lead in leads if lead.group == group]
    return grouped


def summary_text(leads: list[Lead], width: int = 100) -> list[str]:
    """Per kind of protocol: what it rewards, then who leads each of its numbers and how far it can be trusted."""
    lines = []
    for group, members in groups_of(leads).items():
        lines += textwrap.wrap(f"{group}: rewards {GROUPS.get(group, 'what its protocols measure')}", width,
                               subsequent_indent="    ")
        for lead in members:
            text = f"{lead.metric} {lead.number}{arrow(lead.better)} (n={lead.images}): {lead.leaders()}"
            if lead.controls and lead.counted:
                text += f"; as good: {', '.join(lead.controls)} (control)"
            lines += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)
            if lead.trust:
                lines += textwrap.wrap(f"trust: {lead.trust_text()}", width, initial_indent="      ",
                                       subsequent_indent="        ", break_on_hyphens=False)
    return lines + [""]


def trust_text_lines(leads: list[Lead], width: int = 100) -> list[str]:
    """The trust detail of every number (:func:`trust_rows`), one wrapped paragraph each."""
    lines = []
    for metric, number, versus, copies, rho, *noise in trust_rows(leads):
        text = f"{metric} {number}: random: {versus}; degraded: {copies}; ranking ρ {rho}"
        if noise:
            text += f"; minor weight noise, copy − original: {noise[0]}"
        lines += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ", break_on_hyphens=False)
    return lines + ([""] if lines else [])


def sanity_cells(check: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The randomisation table's header and each method's cells: the mean correlation per level, the
    noise floor and its kind (seed or image), the last level's correlation less the floor with its
    interval, and the verdict."""
    header = [*check["levels"], "floor", "last - floor", "verdict"]
    excess = {method: Estimate(*found["excess"], check["images"]) for method, found in check["methods"].items()}
    decimals = column_decimals(list(excess.values()))
    rows = {method: [*(fixed(v, 2) for v in found["correlation"]),
                     f"{fixed(found['floor'], 2)} ({found['floor_kind']})",
                     format_estimate(excess[method], decimals), "flagged" if found["flagged"] else "passes"]
            for method, found in check["methods"].items()}
    return header, rows


def cells_text(header: list[str], rows: dict[str, list[str]], width: int = 100) -> list[str]:
    """A text table of ready-made cells: one column per header, one row per method."""
    columns = [TextColumn(title, [cells[k] for cells in rows.values()]) for k, title in enumerate(header)]
    return text_table(list(rows), columns, width)


def ranks_cells(ranks: dict[str, dict]) -> tuple[list[str], dict[str, list[str]]]:
    """LATEC's mean ranks (:func:`vitexplain.bench.ranks.mean_ranks`, per kind of protocol) as a header and a row of
    cells per method: ``mean [low, high]``, or the mean alone where the kind has no interval."""
    header = [f"{group} ({len(found['numbers'])})" for group, found in ranks.items()]
    rows: dict[str, list[str]] = {}
    for k, found in enumerate(ranks.values()):
        for method, (mean, low, high) in found["methods"].items():
            cell = f"{mean:.1f} [{low:.1f}, {high:.1f}]" if found["interval"] is True else f"{mean:.1f}"
            rows.setdefault(method, ["–"] * len(ranks))[k] = cell
    return header, rows


def cells_markdown(header: list[str], rows: dict[str, list[str]]) -> list[str]:
    return _markdown_rows(["method", *header], [[method, *cells] for method, cells in rows.items()])


def _markdown_rows(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
            + ["| " + " | ".join(row) + " |" for row in rows] + [""])


def score_markdown(table: Table) -> list[str]:
    rows = []
    columns = [table.cells(j) for j in range(len(table.headers))]
    for i, (method, marks) in enumerate(zip(table.methods, table.marks)):
        cells = [f"**{column[i]}**" if mark == "best" else column[i] + (" ≈" if mark == "tied" else "")
                 for column, mark in zip(columns, marks)]
        rows.append([f"*{method} (control)*" if method in table.controls else method, *cells])
    return _markdown_rows(["method", *map(table.header, range(len(table.headers)))], rows)


def summary_markdown(leads: list[Lead]) -> list[str]:
    lines = []
    for group, members in groups_of(leads).items():
        lines += [f"**{group}**: rewards {GROUPS.get(group, 'what its protocols measure')}.", ""]
        rows = [[lead.metric, lead.number + arrow(lead.better), lead.images,
                 lead.leaders() if lead.counted else f"*{lead.leaders()}*",
                 (", ".join(lead.controls) or "–") if lead.counted else "–", lead.trust_text()] for lead in members]
        lines += _markdown_rows(["protocol", "number", "n", "leads", "controls as good", "trust"], rows)
    return lines


def trust_markdown(leads: list[Lead]) -> list[str]:
    """The trust detail of every number (:func:`trust_rows`) as a Markdown table, with how to read it."""
    rows = trust_rows(leads)
    return (_markdown_rows(trust_header(rows), rows) + [trust_note(rows), ""]) if rows else []
