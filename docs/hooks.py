"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

* Tables the code generates are written into the pages at build time, never copied by hand: a line
  ``<!-- vitexplain: NAME -->`` in a page becomes

  - ``methods``: the method table (``vitexplain.readme_tables.method_table``, as in README.md),
  - ``support``: the support matrix (``vitexplain.readme_tables.support_table``, as in README.md),
  - ``protocols`` / ``protocol-kinds``: every registered evaluation protocol and the kinds of protocol,
    from the metric registry (``vitexplain.metrics.base``);
  - ``recipes``: every ``vitexplain reproduce`` recipe, its table, data and models (``vitexplain.reproduce``);

  and ``<!-- vitexplain: include FILE -->`` the text of a file at the repository's root (CHANGELOG.md,
  LICENSE), so the site shows the one copy (its links into ``docs/`` made relative to the page).
* The API reference renders docstrings written with Sphinx roles (``:func:`name```): the roles are dropped,
  leaving the name as code.
* A design note that mkdocs.yml's nav does not list yet (a new ``docs/decisions/*.md``) joins the "Design notes"
  section, titled by its first heading, so every note is reachable from the navigation.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- vitexplain: (?P<what>[\w-]+)(?: (?P<arg>\S+))? -->$", re.MULTILINE)
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|ref):(<code>)~?\.?")


#: what a protocol's ``requires`` names that is not ground truth (metrics.base.Metric.requires)
NEEDS = {"labels": "ground-truth classes", "explain": "the method (runs it again)",
         "model": "the model (changes its weights, then restores them)"}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def protocol_table() -> str:
    """Every registered evaluation protocol: its paper, kind, what it needs and what it reports."""
    from vitexplain.metrics.base import GROUPS, METRICS, alternatives

    lines = ["| protocol | what it is (paper) | kind | needs, beyond the model, images and maps "
             "| reports (↑ higher is better, ↓ lower) |", "| --- | --- | --- | --- | --- |"]
    for name in METRICS.names():
        metric = METRICS.get(name)
        module = sys.modules[metric.compute.__module__]
        paper = (module.__doc__ or "").strip().split("\n\n")[0].rstrip(".")
        needs = ", ".join(" or ".join(NEEDS.get(name, f"`{name}`") for name in alternatives(need))
                          for need in metric.requires) or "nothing more"
        reports = ", ".join(f"`{key}` {'↑' if up else '↓'}" for key, up in metric.higher_is_better.items())
        group = metric.group if metric.group in GROUPS else "other"
        lines.append(f"| `{name}` | {_cell(paper)} | {group} | {needs} | {reports} |")
    return "\n".join(lines) + "\n"


def protocol_kinds() -> str:
    """The kinds of protocol and what each rewards (the reports compare methods within a kind only)."""
    from vitexplain.metrics.base import GROUPS, METRICS

    lines = ["| kind | rewards | protocols |", "| --- | --- | --- |"]
    for group, rewards in GROUPS.items():
        members = [name for name in METRICS.names() if METRICS.get(name).group == group]
        if members:
            lines.append(f"| {group} | {_cell(rewards)} | {', '.join(f'`{name}`' for name in members)} |")
    return "\n".join(lines) + "\n"


def recipe_table() -> str:
    """Every reproduce recipe: the table it reproduces, the data it reads, the models it runs, its estimated cost."""
    from vitexplain.reproduce import DATA_INPUTS, MODELS, RECIPES, estimate_gpu_hours

    lines = ["| recipe | table | data | models | GPU hours (estimate) |", "| --- | --- | --- | --- | ---: |"]
    for name in RECIPES:
        recipe = RECIPES.get(name)
        data = ", ".join(f"`{DATA_INPUTS[key].flag}`" + (" (optional)" if DATA_INPUTS[key].optional else "")
                         for key in recipe.inputs())
        models = ", ".join(f"`{MODELS[key].source}`" if MODELS[key].source else f"yours: `--model {key}=PATH`"
                           for key in recipe.models())
        hours = estimate_gpu_hours(recipe)
        shown = "< 0.1" if hours < 0.1 else f"{hours:.1f}" if hours < 10 else f"{hours:.0f}"
        lines.append(f"| `{name}` | {_cell(recipe.paper + ', ' + recipe.title)} | {data} | {models} | {shown} |")
    return "\n".join(lines) + "\n"


def _generated(what: str, arg: str | None) -> str:
    if what == "include":  # a root file's links into docs/ are read from the page, which lies in docs/
        return (ROOT / arg).read_text().replace("](docs/", "](")
    from vitexplain.readme_tables import method_table, support_table

    tables = {"methods": method_table, "support": support_table, "protocols": protocol_table,
              "protocol-kinds": protocol_kinds, "recipes": recipe_table}
    if what not in tables:
        raise ValueError(f"unknown generated section {what!r}; known: include FILE, {', '.join(tables)}")
    return tables[what]()


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda match: _generated(match["what"], match["arg"]).rstrip("\n"), markdown)


def on_page_content(html: str, page, config, files) -> str:
    return ROLE.sub(r"\1", html)


def on_nav(nav, config, files):
    section = next((item for item in nav.items if getattr(item, "title", None) == "Design notes"), None)
    if section is None:
        return nav
    listed = {page.file.src_uri for page in nav.pages}
    for file in sorted(files.documentation_pages(), key=lambda file: file.src_uri):
        if file.src_uri.startswith("decisions/") and file.src_uri not in listed and file.page is not None:
            file.page.parent = section
            section.children.append(file.page)
            nav.pages.append(file.page)
    return nav
