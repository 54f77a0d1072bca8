"""One look for every HTML page vitexplain writes: the bench's report (:mod:`vitexplain.bench.html`), a reproduced
table (:mod:`vitexplain.reproduce.table`) and the explorer (:mod:`vitexplain.explorer`).

They share one palette (custom properties, which each page's own rules use), one font, and one way of drawing
headings, tables and code, so a reader moving from the report to its explorer or to a reproduced table reads one
design; each page adds only the rules of its own parts. A page is self-contained: system fonts, no URL, nothing
fetched.
"""
from __future__ import annotations

import html

#: the rules every page starts from
STYLE = """
:root { --ink: #1f2328; --muted: #656d76; --line: #d0d7de; --rule: #d8dee4; --shade: #f6f8fa; --panel: #ffffff;
        --accent: #0969da; --alert: #cf222e; --sans: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
        sans-serif; --mono: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
body { font: 14px/1.45 var(--sans); color: var(--ink); background: var(--panel); margin: 0 auto;
       padding: 1.5em 2em 4em; max-width: 1500px; }
h1 { font-size: 1.7em; margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid var(--line); padding-bottom: 0.25em; margin-top: 2em; }
h3 { margin-top: 1.6em; } .muted { color: var(--muted); }
table { border-collapse: separate; border-spacing: 0; margin: 0.6em 0; font-variant-numeric: tabular-nums; }
th, td { padding: 0.3em 0.6em; border-bottom: 1px solid var(--rule); }
thead th { background: var(--shade); font-weight: 600; }
code { background: var(--shade); padding: 0.1em 0.3em; border-radius: 4px; }
code, kbd { font-family: var(--mono); }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
"""


def html_page(title: str, body: str, *, style: str = "", head: str = "") -> str:
    """A whole page: ``title`` (escaped here), ``head``'s elements (meta tags), the shared :data:`STYLE` then the
    page's own ``style``, and ``body`` as given."""
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{head}'
            f"<title>{html.escape(title)}</title><style>{STYLE}{style}</style></head>"
            f"<body>\n{body}\n</body></html>\n")
