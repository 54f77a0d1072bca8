"""report.html: the whole benchmark on one self-contained page (every image inlined, no script, no external asset).

Sections: notes and run summary; who leads, per model and kind of protocol (faithfulness,
localisation ...: what each rewards, then per reported number the best method or the methods tied
with it and the images behind it; kinds are never mixed into one rank); then per model the table
(papers' layout: methods as rows, one column per reported number grouped by protocol, each number
with its 95 % bootstrap interval and image count, an arrow for the better direction, the best value
in bold and values tied with it underlined, control rows greyed, the method column kept in view
while the table scrolls sideways), the curves (inline SVG; a legend entry per method shows and hides its line in
every plot of the model, by CSS alone), and a gallery (the same images with every method's overlay
side by side, the model's prediction above each row); then the model-randomisation check (plot and
table, flagged methods marked, the verdict's rule), errors, time and the settings.
"""
from __future__ import annotations

import base64
import html
import itertools
import re
from datetime import datetime, timezone

from .. import viz
from ..html_page import html_page
from ..metrics.base import GROUPS
from ..uncertainty import MIN_IMAGES, TOO_FEW
from .plots import CurvePlot, cascade_plot, model_styles, png_of
from .randomisation import VERDICT_RULE
from .result import NO_SCORES, BenchResult, Gallery
from .tables import (
    UNTRUSTED,
    Lead,
    Table,
    arrow,
    groups_of,
    sanity_cells,
    trust_header,
    trust_note,
    trust_rows,
)

#: the report's own rules, over the shared style of :mod:`vitexplain.html_page`
STYLE = """
nav a { margin-right: 1em; }
.notes { background: var(--shade); border-left: 4px solid var(--accent); padding: 0.6em 1em; margin: 1em 0; }
.notes li { margin: 0.2em 0; }
.scroll { overflow-x: auto; max-width: 100%; }
table.scores { font-size: 13px; }
table.scores td { text-align: right; background: var(--panel); } \
table.scores td.method, table.scores th.method { text-align: left; }
table.scores thead tr.metric th { white-space: nowrap; } table.scores th.number { max-width: 7.5em; }
table.scores td.method { white-space: nowrap; }
table.scores .method { position: sticky; left: 0; z-index: 1; border-right: 1px solid var(--line); }
table.scores thead .method { z-index: 2; }
table.scores thead tr.metric th { border-bottom: 1px solid #afb8c1; }
table.scores tbody tr:nth-child(even) td { background: #fafbfc; }
table.scores th.group-start, table.scores td.group-start { border-left: 1px solid var(--line); }
tr.control td { color: #6e7781; font-style: italic; } tr.control td.method::after { content: " (control)"; }
tr.flagged:not(.control) td.method, span.flagged { color: var(--alert); font-weight: 600; }
td.best { font-weight: 700; } td.tied { text-decoration: underline dotted #1a7f37; text-underline-offset: 3px; }
table.scores td { white-space: nowrap; }
table.summary td.leads, table.summary td.controls { text-align: left; white-space: normal; min-width: 16em; }
table.summary td.trust, table.trust td { text-align: left; white-space: normal; min-width: 14em; }
table.trust { font-size: 13px; } table.trust thead th { text-align: left; }
span.untrusted { color: #9a6700; font-style: italic; } .verdict { color: #9a6700; }
table.summary tr.group th { text-align: left; font-weight: 400; background: var(--shade); }
table.summary tr.group th b { margin-right: 0.5em; } span.control { color: #6e7781; font-style: italic; }
.figures { display: flex; flex-wrap: wrap; gap: 0.6em; }
.figures figure { margin: 0; width: calc(50% - 0.6em); min-width: 520px; max-width: 100%;
                  border: 1px solid var(--rule); }
.figures figure.wide { width: 1000px; }
.figures svg { display: block; width: 100%; height: auto; }
.legend { display: flex; flex-wrap: wrap; gap: 0.15em 1em; font-size: 12.5px; margin: 0.5em 0; }
.legend label { cursor: pointer; user-select: none; white-space: nowrap; }
.legend label.group { font-style: italic; }
.legend svg { vertical-align: middle; margin-right: 0.3em; }
table.gallery { border-collapse: separate; border-spacing: 3px; }
table.gallery th { font-size: 11px; font-weight: 600; position: sticky; top: 0; background: var(--panel);
                   padding: 0.3em 0; }
table.gallery th div { width: 112px; overflow-wrap: normal; }
table.gallery td { padding: 0; border: none; } table.gallery th.control { color: #6e7781; font-style: italic; }
table.gallery td.caption { font-size: 12.5px; padding: 0.8em 0 0.1em; text-align: left; }
table.gallery img { display: block; width: 112px; height: 112px; }
table.gallery td.input { position: sticky; left: 0; background: var(--panel); }
span.missing { display: block; width: 112px; line-height: 112px; text-align: center; background: #eee; color: #888; }
.scale img { vertical-align: middle; height: 12px; width: 200px; border: 1px solid #ccc; margin: 0 0.4em; }
"""
#: matplotlib's own ids in an SVG (figure_1, line2d_3 ...): dropped, as every plot repeats them
_PLOT_IDS = re.compile(r'\s+id="(?:figure|axes|patch|line2d|text|xtick|ytick|matplotlib\.axis|legend|PathCollection)'
                       r'_\d+"')
_DASHES = {"-": "", "--": "5 3", ":": "1.5 2.5", "-.": "6 2.5 1.5 2.5"}
_MARK_TITLES = {"best": ' title="best: better than every other method at 95 %"',
                "tied": ' title="tied: cannot be told apart from the best at 95 %"'}


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _e(text: object) -> str:
    return html.escape(str(text))


def _anchor(*parts: str) -> str:
    return "-".join("".join(c if c.isalnum() else "_" for c in part) for part in parts)


def _breakable(name: str) -> str:
    """``name`` escaped, with line-break opportunities after its ``_ ( = ,`` (so a label wraps whole, never
    mid-word, as the explorer's do)."""
    return re.sub(r"([_(=,])", r"\1<wbr>", _e(name))


def _direction(better: bool | None) -> str:
    return {True: "higher is better", False: "lower is better", None: "no direction"}[better]


def _row_class(method: str, controls: set[str], flagged: set[str]) -> str:
    return " ".join(name for name, on in (("control", method in controls), ("flagged", method in flagged)) if on)


def inline_svg(svg: bytes) -> str:
    """An SVG file as an element to place in the page: no XML prolog, no namespace URLs, no matplotlib ids."""
    text = svg.decode("utf-8")
    text = text[text.index("<svg"):]
    text = re.sub(r'\s+xmlns(?::xlink)?="[^"]*"', "", text)
    return _PLOT_IDS.sub("", text)


def _scrolled_table(kind: str, header: str, rows: list[str]) -> str:
    """A table of the ``kind`` class in a horizontally scrolling box."""
    return (f'<div class="scroll"><table class="{kind}"><thead>{header}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _names(methods: list[str], flagged: set[str], kind: str = "") -> str:
    return ", ".join(f'<span class="{"flagged" if m in flagged else kind}">{_e(m)}</span>' for m in methods)


def summary_table(leads: list[Lead], flagged: set[str]) -> str:
    """Per kind of protocol, a header row with what it rewards, then per reported number who leads it."""
    rows = []
    for group, members in groups_of(leads).items():
        rows.append(f'<tr class="group"><th colspan="6"><b>{_e(group)}</b>rewards '
                    f'{_e(GROUPS.get(group, "what its protocols measure"))}</th></tr>')
        for lead in members:
            if not lead.methods:
                shown = "–"
            elif len(lead.methods) == 1:
                shown = f"<b>best</b>: {_names(lead.methods, flagged)}"
            else:
                shown = f"tied ({len(lead.methods)}): {_names(lead.methods, flagged)}"
            controls = _names(lead.controls, set(), "control") or "–"
            if lead.methods and not lead.counted:
                shown, controls = f'<span class="untrusted">{_e(UNTRUSTED)}</span>', "–"
            rows.append(f'<tr class="{"" if lead.counted else "untrusted"}"><td class="method">{_e(lead.metric)}</td>'
                        f'<td>{_breakable(lead.number)}{arrow(lead.better)}</td><td>{_e(lead.images)}</td>'
                        f'<td class="leads">{shown}</td>'
                        f'<td class="controls">{controls}</td><td class="trust">{_e(lead.trust_text())}</td></tr>')
    header = ("<tr><th class='method'>protocol</th><th>number</th><th title='images'>n</th><th>leads</th>"
              "<th title='controls that no leader is better than'>controls as good</th>"
              "<th title='how far this number can be trusted on this model (docs/decisions/metric-trust.md)'>trust"
              "</th></tr>")
    return (f'<div class="scroll"><table class="scores summary"><thead>{header}</thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def trust_table(leads: list[Lead]) -> str:
    """Per number: the best method against the random control, each method against its degraded copies, and the
    stability of the methods' order over resamples (:func:`vitexplain.bench.tables.trust_rows`); empty when
    nothing was computed."""
    rows = trust_rows(leads)
    if not rows:
        return ""
    header = "<tr>" + "".join(f"<th{' class=method' if k == 0 else ''}>{_e(title)}</th>"
                              for k, title in enumerate(trust_header(rows))) + "</tr>"
    body = ["<tr>" + "".join(f'<td{" class=method" if k == 0 else ""}>{_e(cell)}</td>' for k, cell in enumerate(row))
            + "</tr>" for row in rows]
    return (f"<h3>How far each number can be trusted</h3><p class='muted'>{_e(trust_note(rows))}</p>"
            + _scrolled_table("trust", header, body))


def score_table(table: Table, flagged: set[str]) -> str:
    """The table with a two-row header: protocol (and its image count), then its numbers with arrows."""
    groups = [(metric, len(list(members))) for metric, members in itertools.groupby(table.metrics)]
    starts = {sum(n for _, n in groups[:k]) for k in range(len(groups))}
    top = "".join(f'<th colspan="{n}" class="group-start">{_e(metric)} '
                  f'<span class="muted">(n={table.counts.get(metric) or 0})</span></th>' for metric, n in groups)
    names = "".join(f'<th class="number{" group-start" if j in starts else ""}" title="{_direction(table.better[j])}">'
                    f'{_breakable(table.numbers[j])}{arrow(table.better[j])}</th>' for j in range(len(table.headers)))
    rows = []
    columns = [table.cells(j) for j in range(len(table.headers))]
    for i, (method, marks) in enumerate(zip(table.methods, table.marks)):
        cells = "".join(f'<td class="{mark} {"group-start" if j in starts else ""}"'
                        f'{_MARK_TITLES.get(mark, "")}>{_e(columns[j][i])}</td>' for j, mark in enumerate(marks))
        rows.append(f'<tr class="{_row_class(method, table.controls, flagged)}">'
                    f'<td class="method">{_e(method)}</td>{cells}</tr>')
    return ('<div class="scroll"><table class="scores"><thead><tr class="metric">'
            f'<th class="method" rowspan="2">method</th>{top}</tr><tr>{names}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _swatch(style: dict) -> str:
    dash = _DASHES.get(style.get("linestyle", "-"), "")
    return ('<svg width="26" height="10" aria-hidden="true">'
            f'<line x1="1" y1="5" x2="25" y2="5" stroke="{style["color"]}" '
            f'stroke-width="{style.get("linewidth", 1.4) + 0.4:g}" stroke-dasharray="{dash}"/></svg>')


def toggled_figures(key: str, plots: list[CurvePlot], styles: dict[str, dict], others: list[str],
                    wide: bool = False) -> str:
    """Plots of one model as inline SVG under one legend: each entry shows / hides its method's line in
    every plot, one more entry the ``others`` (the methods not highlighted) at once; below it, one
    choice per method draws that method's line wide over the others, faded (radio buttons and CSS, no
    script). ``key`` prefixes every id, unique in the page."""
    methods = list(dict.fromkeys(method for plot in plots for method in plot.curves))
    others = [method for method in others if method in methods]
    toggles = {method: f"{key}-m{k}" for k, method in enumerate(methods)}
    chosen = {method: f"{key}-h{k}" for k, method in enumerate(methods)}
    lines = {method: f"{key}-l{k}-" for k, method in enumerate(methods)}
    boxes = [(toggles[m], [m]) for m in methods] + ([(f"{key}-others", others)] if others else [])
    rules = []
    for box, members in boxes:
        hidden = ", ".join(f"#{box}:not(:checked) ~ .figures [id^='{lines[m]}']" for m in members)
        rules.append(hidden + " { display: none; }")
        rules.append(f"#{box}:not(:checked) ~ .legend label[for='{box}'] "
                     "{ opacity: 0.4; text-decoration: line-through; }")
    for method in methods:
        rules.append(f"#{chosen[method]}:checked ~ .figures [id^='{key}-l'] {{ opacity: 0.25; }}")
        rules.append(f"#{chosen[method]}:checked ~ .figures [id^='{lines[method]}'] {{ opacity: 1; }}")
        rules.append(f"#{chosen[method]}:checked ~ .figures [id^='{lines[method]}'] path "
                     "{ stroke-width: 3.5px !important; }")
        rules.append(f"#{chosen[method]}:checked ~ .highlight label[for='{chosen[method]}'] {{ font-weight: 700; }}")
    rules.append(f"#{key}-h:checked ~ .highlight label[for='{key}-h'] {{ font-weight: 700; }}")
    labels = [f'<label for="{toggles[m]}" title="show / hide">{_swatch(styles[m])}{_e(m)}</label>' for m in methods]
    if others:
        labels.append(f'<label for="{key}-others" class="group" title="show / hide every method not highlighted">'
                      f'{_swatch(styles[others[0]])}all not highlighted</label>')
    picks = [f'<label for="{key}-h">none</label>'] + [f'<label for="{chosen[m]}">{_e(m)}</label>' for m in methods]
    figures = []
    for number, plot in enumerate(plots):
        ids = {m: f"{lines[m]}{number}" for m in plot.curves if m in lines}
        svg = inline_svg(plot.render(styles, "svg", legend=False, ids=ids))
        figures.append(f'<figure class="{"wide" if wide else ""}" aria-label="{_e(plot.title)}">{svg}</figure>')
    inputs = "".join(f'<input type="checkbox" id="{box}" checked hidden>' for box, _ in boxes)
    inputs += f'<input type="radio" name="{key}-h" id="{key}-h" checked hidden>' + "".join(
        f'<input type="radio" name="{key}-h" id="{chosen[m]}" hidden>' for m in methods)
    return (f'<div class="toggled"><style>{" ".join(rules)}</style>{inputs}'
            f'<div class="legend">{"".join(labels)}</div>'
            f'<div class="legend highlight"><span class="muted">highlight:</span>{"".join(picks)}</div>'
            f'<div class="figures">{"".join(figures)}</div></div>')


def _not_highlighted(result: BenchResult, model: str) -> list[str]:
    """The methods drawn thin and pale (neither highlighted nor controls), when some are highlighted."""
    controls = result.controls(model)
    return [m for m in result.scores.get(model, {})
            if result.highlight and m not in result.highlight and m not in controls]


def gallery_table(gallery: Gallery, controls: set[str]) -> str:
    """Rows of images: a caption (label, prediction, probability) above the input and every overlay."""
    methods = list(gallery.maps)
    signed = {m: gallery.maps[m] is not None and viz.is_signed(gallery.maps[m]) for m in methods}
    header = "<tr><th><div>input</div></th>" + "".join(
        f'<th title="{_e(m)}{" (signed: diverging scale)" if signed[m] else ""}" '
        f'class="{"control" if m in controls else ""}">'
        f'<div>{_breakable(m)}{" ±" if signed[m] else ""}</div></th>' for m in methods) + "</tr>"
    rows = []
    for i, image_id in enumerate(gallery.ids):
        predicted, label = gallery.predicted[i], gallery.labels[i]
        name = gallery.class_names[predicted] if predicted < len(gallery.class_names) else predicted
        label_name = gallery.class_names[label] if 0 <= label < len(gallery.class_names) else label
        truth = f"label {_e(label_name)} · " if label >= 0 else ""
        caption = (f"<b>{_e(image_id)}</b> — {truth}predicted <b>{_e(name)}</b> "
                   f"(p = {gallery.probability[i]:.3f})")
        rows.append(f'<tr><td class="caption" colspan="{len(methods) + 1}">{caption}</td></tr>')
        image = data_uri(png_of(gallery.images[i].numpy()))
        cells = [f'<td class="input"><img alt="input {_e(image_id)}" src="{image}"></td>']
        for method in methods:
            maps = gallery.maps[method]
            if maps is None:
                cells.append('<td><span class="missing">no map</span></td>')
            else:
                uri = data_uri(png_of(viz.overlay(gallery.images[i], maps[i], signed=signed[method])))
                cells.append(f'<td><img alt="{_e(method)} on {_e(image_id)}" title="{_e(method)}" src="{uri}"></td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return _scrolled_table("gallery", header, rows)


def gallery_section(gallery: Gallery, controls: set[str]) -> str:
    def strip(name: str) -> str:
        return f'<img alt="colour scale {name}" src="{data_uri(png_of(viz.palette_strip(name)))}">'

    scales = (f'<p class="scale muted">Maps without negative values: {viz.SEQUENTIAL}, {_e(viz.scale_rule(False))}, '
              f'low{strip(viz.SEQUENTIAL)}high. Maps with negative values (marked ±): {viz.DIVERGING}, '
              f'{_e(viz.scale_rule(True))}, negative{strip(viz.DIVERGING)}positive. Values beyond the ends saturate; '
              f'each map has its own scale, blended at {viz.OVERLAY_ALPHA:.0%} over the image (as in explorer.html '
              'and the PNG overlays).</p>')
    link = ('<p class="muted">Every map of these images, token by token and side by side, in the interactive '
            'explorer: <code>explorer.html</code> beside this report.</p>')
    return "<h3>Gallery</h3>" + scales + link + gallery_table(gallery, controls)


def sanity_section(result: BenchResult, model: str, check: dict, key: str) -> str:
    controls = result.controls(model)
    titles, cells = sanity_cells(check)
    header = "<tr><th class='method'>method</th>" + "".join(f"<th>{_e(title)}</th>" for title in titles) + "</tr>"
    rows = []
    for method, found in check["methods"].items():
        classes = _row_class(method, controls, {method} if found["flagged"] else set())
        rows.append(f'<tr class="{classes}"><td class="method">{_e(method)}</td>'
                    + "".join(f"<td>{_e(cell)}</td>" for cell in cells[method]) + "</tr>")
    flagged = [m for m, found in check["methods"].items() if found["flagged"] and m not in controls]
    caught = [m for m, found in check["methods"].items() if found["flagged"] and m in controls]
    summary = (f"Flagged: <b>{_e(', '.join(flagged)) or 'none'}</b>" + (f"; controls, flagged as they should be: "
               f"{_e(', '.join(caught))}" if caught else "") + f". {_e(VERDICT_RULE.format(images=check['images']))}")
    return (f'<h3 id="{_anchor(model, "sanity")}">{_e(model)}</h3><p>{summary}</p>'
            + toggled_figures(key, [cascade_plot(model, check)], model_styles(result, model),
                              _not_highlighted(result, model), wide=True)
            + _scrolled_table("scores", header, rows))


def timing_table(per_method: dict[str, dict[str, float]]) -> str:
    """Seconds per method (rows) and phase (columns: maps, each metric, sanity), with totals."""
    phases = list(dict.fromkeys(phase for spent in per_method.values() for phase in spent))
    header = ("<tr><th class='method'>method</th>" + "".join(f"<th class='number'>{_breakable(p)}</th>" for p in phases)
              + "<th>total</th></tr>")
    rows = []
    for method, spent in per_method.items():
        cells = "".join(f"<td>{spent.get(phase, 0):.1f}</td>" for phase in phases)
        rows.append(f"<tr><td class='method'>{_e(method)}</td>{cells}<td><b>{sum(spent.values()):.1f}</b></td></tr>")
    totals = [sum(spent.get(phase, 0) for spent in per_method.values()) for phase in phases]
    rows.append("<tr><td class='method'><b>total</b></td>" + "".join(f"<td><b>{t:.1f}</b></td>" for t in totals)
                + f"<td><b>{sum(totals):.1f}</b></td></tr>")
    return _scrolled_table("scores", header, rows)


def _settings(result: BenchResult) -> str:
    settings = result.settings
    rows = [f"<tr><td class='method'>{_e(label)}</td><td><code>{_e(entry['name'])}</code></td>"
            f"<td>{_e(entry['options'] or '')}</td></tr>" for label, entry in settings.get("methods", {}).items()]
    methods = ("<table class='scores'><thead><tr><th class='method'>row</th><th>method</th><th>options</th></tr>"
               f"</thead><tbody>{''.join(rows)}</tbody></table>")
    rows = [f"<tr><td class='method'>{_e(label)}</td><td><code>{_e(entry['name'])}</code></td>"
            f"<td>{_e(entry['options'])}</td><td>{_e(entry.get('limit') or 'all')}</td>"
            f"<td>{_e(_dataset_text(entry.get('dataset')))}</td></tr>"
            for label, entry in settings.get("metrics", {}).items()]
    metrics = ("<table class='scores'><thead><tr><th class='method'>columns</th><th>metric</th><th>options</th>"
               f"<th>images</th><th>dataset</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    run = {key: settings.get(key) for key in ("precision", "target", "seed", "limit", "sanity", "highlight")}
    return (f"<p>Run: <code>{_e(run)}</code></p><h3>Methods</h3><div class='scroll'>{methods}</div>"
            f"<h3>Metrics</h3><div class='scroll'>{metrics}</div>")


def _dataset_text(dataset: object) -> str:
    if isinstance(dataset, dict):
        options = ", ".join(f"{k}={v}" for k, v in dataset.get("options", {}).items())
        return f"{dataset.get('name')}({options})"
    return str(dataset)


def _flagged(result: BenchResult, model: str) -> set[str]:
    return set(result.flagged(model))


def render_html(result: BenchResult, plots: list[CurvePlot]) -> str:
    """The page; ``plots`` are the curves of :func:`vitexplain.bench.plots.curve_plots`."""
    galleries = {gallery.model: gallery for gallery in result.galleries}
    models = list(result.scores)
    nav = '<a href="#summary">summary</a> ' + " ".join(f'<a href="#{_anchor(m)}">{_e(m)}</a>' for m in models)
    if result.sanity:
        nav += ' <a href="#sanity">model randomisation</a>'
    if result.errors:
        nav += ' <a href="#errors">errors</a>'
    if result.timings:
        nav += ' <a href="#time">time</a>'
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<h1>Benchmark on {_e(result.dataset)}, {_e(result.precision)}</h1>",
             f'<p class="muted">{len(models)} model(s), {len(result.settings.get("methods", {}))} method(s), '
             f'{len(result.settings.get("metrics", {}))} protocol(s); written {when}'
             + (f"; this run took {result.seconds:.0f} s" if result.seconds else "") + "</p>",
             f"<nav>{nav}</nav>"]
    if result.notes:
        notes = "".join(f"<li>{_e(note)}</li>" for note in result.notes)
        parts.append(f'<div class="notes"><ul>{notes}</ul></div>')
    parts.append('<h2 id="summary">Summary: who leads, per kind of protocol</h2><p class="muted">'
                 f'{_e(result.uncertainty_note())} Each kind of protocol rewards something else, so kinds are never '
                 'mixed into one rank; n = images behind the numbers. Red: flagged by the model-randomisation check. '
                 'Controls as good: a control no leader is better than (the number cannot tell the leaders from a '
                 'map that explains nothing).</p>')
    scored = result.scored()
    for model in models:
        if model not in scored:
            parts += [f"<h3>{_e(model)}</h3>", f'<p class="verdict">{_e(NO_SCORES)}</p>']
            continue
        parts += [f"<h3>{_e(model)}</h3>", summary_table(result.summary(model), _flagged(result, model))]
        parts += [f'<p class="verdict">{_e(line)}</p>' for line in result.verdict_lines(model)]
    parts.append('<p class="muted">Tables: methods as rows; every number: value [95 % interval] (images), '
                 f'“{TOO_FEW}” in place of the interval on fewer than {MIN_IMAGES} images (and no best or tied); '
                 '↑ / ↓ = higher / lower is better; <b>bold</b> = best, better than every other method at 95 %; '
                 '<span style="text-decoration: underline dotted #1a7f37">underlined</span> = tied with the best; '
                 'control rows, in grey, are references and never lead. Red method names were flagged by the '
                 'model-randomisation check. Curves: each point at the share of pixels the step really removed, '
                 'inserted or grouped; click a legend entry to hide or show its line, a name after “highlight” to '
                 'draw it over the others.</p>')
    figure = itertools.count()
    for model in models:
        table = result.table(model)
        if model not in scored:
            parts += [f'<h2 id="{_anchor(model)}">{_e(model)}</h2>', f'<p class="verdict">{_e(NO_SCORES)}</p>']
        else:
            parts += [f'<h2 id="{_anchor(model)}">{_e(model)}</h2>', score_table(table, _flagged(result, model)),
                      trust_table(result.summary(model))]
        mine = [plot for plot in plots if plot.model == model]
        if mine:
            parts += ["<h3>Curves</h3>", toggled_figures(f"figures{next(figure)}", mine, model_styles(result, model),
                                                         _not_highlighted(result, model))]
        if model in galleries:
            parts.append(gallery_section(galleries[model], table.controls))
    if result.sanity:
        parts.append('<h2 id="sanity">Model randomisation (Adebayo et al., NeurIPS 2018)</h2>'
                     '<p>Cascading randomisation: the weights are re-initialised from the top down (head, then the '
                     'last block, ..., then the embedding), and every method explains the same images, for the same '
                     'classes, with the partly random model. Numbers: Spearman rank correlation with the maps of the '
                     'trained model, averaged over the images; the floor is what the correlation is without the '
                     'model (below), and the plot shows each correlation less its floor. A method whose maps stay '
                     'above their floor once nothing learned is left does not depend on what the model learned. '
                     'The random and constant controls (grey) must be flagged; a degraded copy of a real '
                     'method\'s maps (also grey) depends on the model as its method does.</p>')
        for model, check in result.sanity.items():
            parts.append(sanity_section(result, model, check, f"figures{next(figure)}"))
    if result.errors:
        rows = "".join(f"<tr><td class='method'>{_e(model)}</td><td>{_e(method)}</td><td>{_e(metric)}</td>"
                       f"<td>{count}</td><td style='text-align:left'>{_e(message)}</td></tr>"
                       for (model, method, metric, message), count in result.grouped_errors().items())
        parts.append('<h2 id="errors">Errors</h2><div class="scroll"><table class="scores"><thead><tr>'
                     '<th class="method">model</th><th>method</th><th>metric</th><th>images</th><th>error</th>'
                     f'</tr></thead><tbody>{rows}</tbody></table></div>')
    if result.timings:
        parts.append('<h2 id="time">Time</h2><p class="muted">Seconds this run spent per method: explaining (maps), '
                     'each protocol, and the model-randomisation check (a resumed run counts only what it '
                     'computed).</p>')
        for model, per_method in result.timings.items():
            parts += [f"<h3>{_e(model)}</h3>", timing_table(per_method)]
    parts += ["<h2>Settings</h2>", _settings(result)]
    return html_page(f"vitexplain bench: {result.dataset}", "\n".join(parts), style=STYLE)
