"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

* Tables the code generates are written into the pages at build time, never copied by hand: a line
  ``<!-- vitexplain: NAME -->`` in a page becomes

  - ``methods``: the method table (``vitexplain.readme_tables.method_table``, as in README.md),
  - ``support``: the support matrix (``vitexplain.readme_tables.support_table``, as in README.md),
  - ``protocols`` / ``protocol-kinds``: every registered evaluation protocol and the kinds of protocol,
    from the metric registry (``vitexplain.metrics.base``);
  - ``method-departures`` / ``protocol-departures``: for every method / protocol that LATEC or Quantus also
    implements (its ``reference``), where vitexplain departs from them (its ``departures``), and the names of
    those neither has (:func:`departures_table`);
  - ``recipes``: every ``vitexplain reproduce`` recipe, its table, data and models (``vitexplain.reproduce``);
  - ``modules``: the tree of the package's modules, each with the first sentence of its own docstring
    (:func:`module_tree`; a module without one fails the build);

  and ``<!-- vitexplain: include FILE -->`` the text of a file at the repository's root (CHANGELOG.md,
  LICENSE), so the site shows the one copy (its links into ``docs/`` made relative to the page).
* The API reference renders docstrings written with Sphinx roles (``:func:`name```): the roles are dropped,
  leaving the name as code.
* A design note that mkdocs.yml's nav does not list yet (a new ``docs/decisions/*.md``) joins the "Design notes"
  section, titled by its first heading, so every note is reachable from the navigation.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- vitexplain: (?P<what>[\w-]+)(?: (?P<arg>\S+))? -->$", re.MULTILINE)
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|ref):(<code>)~?\.?")


#: what a protocol's ``requires`` names that is not ground truth (metrics.base.Metric.requires)
NEEDS = {"labels": "ground-truth classes", "explain": "the method (runs it again)",
         "model": "the model (changes its weights, then restores them)"}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def protocol_cost(metric) -> str:
    """A protocol's model passes per image at its default options as ``a + b·m``, m the method's own passes (what it
    costs to explain one image; a backward counts 2): ``b`` is how many times it runs the method again."""
    passes = [metric.passes({}, float(m)) for m in (0, 1, 2)]
    fixed, per_method = passes[0], passes[1] - passes[0]
    if abs(passes[2] - fixed - 2 * per_method) > 1e-9 * max(1.0, abs(passes[2])):
        return f"{passes[0]:g} at m = 0, {passes[1]:g} at m = 1"     # not linear in m: say what it is at both
    terms = ([f"{fixed:g}"] if fixed else []) + ([("" if per_method == 1 else f"{per_method:g}·") + "m"]
                                                  if per_method else [])
    return " + ".join(terms) or "0"


def protocol_table() -> str:
    """Every registered evaluation protocol: its paper, kind, what it needs, what it reports and what it costs."""
    from vitexplain.metrics.base import GROUPS, METRICS, alternatives

    lines = ["| protocol | what it is (paper) | kind | needs, beyond the model, images and maps "
             "| reports (↑ higher is better, ↓ lower) | model passes per image (m: the method's) |",
             "| --- | --- | --- | --- | --- | ---: |"]
    for name in METRICS.names():
        metric = METRICS.get(name)
        module = sys.modules[metric.compute.__module__]
        paper = (module.__doc__ or "").strip().split("\n\n")[0].rstrip(".")
        needs = ", ".join(" or ".join(NEEDS.get(name, f"`{name}`") for name in alternatives(need))
                          for need in metric.requires) or "nothing more"
        reports = ", ".join(f"`{key}` {'↑' if up else '↓'}" for key, up in metric.higher_is_better.items())
        group = metric.group if metric.group in GROUPS else "other"
        lines.append(f"| `{name}` | {_cell(paper)} | {group} | {needs} | {reports} | {protocol_cost(metric)} |")
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


def departures_table(kind: str) -> str:
    """For every built-in ``"method"`` or every registered ``"protocol"`` that LATEC or Quantus also implements (the
    entry's ``reference``), where vitexplain's departs from theirs (its ``departures``, from the entry's own module);
    then, in one line, the entries neither implements (an empty ``reference``)."""
    from vitexplain.metrics.base import METRICS
    from vitexplain.registry import METHODS, REFERENCES

    if kind == "method":
        names = [name for name in METHODS.names() if METHODS.get(name).fn.__module__.startswith("vitexplain.methods.")
                 and not METHODS.get(name).control]
        entries = {name: METHODS.get(name) for name in names}
    else:
        entries = {name: METRICS.get(name) for name in METRICS.names()}
    lines = [f"| {kind} | also in | where vitexplain departs from it |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {', '.join(REFERENCES[ref] for ref in entry.reference)} | {_cell(entry.departures)} |"
              for name, entry in entries.items() if entry.reference]
    neither = [f"`{name}`" for name, entry in entries.items() if not entry.reference]
    if neither:
        lines += ["", f"In neither LATEC nor Quantus: {', '.join(neither)}."]
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


#: a docstring's first sentence ends at a full stop followed by a capital (not "et al. (CVPR", "Sec. 4")
SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z])")
#: Sphinx roles and double back-quotes of a docstring, shown as plain names in the tree
DOC_ROLE = re.compile(r":\w+:`(?P<tilde>~?)\.*(?P<name>[^`]+)`")
TREE_WIDTH = 118


def _docstring(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    if not docstring or not docstring.strip():
        raise ValueError(f"{path} has no opening docstring: say in one line why the module exists")
    return docstring


def summary(path: Path) -> str:
    """The first sentence of the module's (or, for a package folder, its ``__init__``'s) docstring, as plain text."""
    path = path / "__init__.py" if path.is_dir() else path
    paragraph = " ".join(_docstring(path).strip().split("\n\n")[0].split())
    sentence = SENTENCE_END.split(paragraph, maxsplit=1)[0].rstrip(".")
    sentence = DOC_ROLE.sub(lambda m: m["name"].rsplit(".", 1)[-1] if m["tilde"] else m["name"], sentence)
    return sentence.replace("``", "")


def registry_packages(package: Path) -> set[Path]:
    """The folders whose every module a registry imports (``Registry(kind, "dotted.package")``, read from the
    source): one module per entry, so the tree shows each as one line."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Registry" and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                dotted = node.args[1].value.split(".")
                if dotted[0] == package.name:
                    found.add(package.joinpath(*dotted[1:]))
    return found


def module_tree(package: Path = ROOT / "vitexplain") -> str:
    """The package's modules as a tree (a fenced block), each line the first sentence of the module's docstring.

    Every module and subpackage has its line, ``_`` helpers too, except inside a folder a registry imports
    wholesale (methods, metrics, datasets, model families, reproduce tables): that folder is one line, its
    ``__init__``'s sentence and a count of its modules. Folders without an ``__init__.py`` hold no modules.
    """
    collapsed = registry_packages(package)
    rows: list[tuple[str, str]] = []

    def walk(folder: Path, depth: int) -> None:
        entries = sorted((path for path in folder.iterdir()
                          if (path.suffix == ".py" and path.name != "__init__.py")
                          or (path.is_dir() and (path / "__init__.py").is_file())),
                         key=lambda path: path.stem)
        for path in entries:
            name = "  " * depth + path.name + ("/" if path.is_dir() else "")
            if path.is_dir() and path in collapsed:
                modules = sorted(member.stem for member in path.glob("*.py") if member.name != "__init__.py")
                helpers = sum(module.startswith("_") for module in modules)
                count = f"{len(modules) - helpers} modules" + (f", {helpers} _ helper" if helpers else "")
                count += "s" if helpers > 1 else ""
                rows.append((name, f"{summary(path)} [{count}]"))
            else:
                rows.append((name, summary(path)))
                if path.is_dir():
                    walk(path, depth + 1)

    rows.append((package.name + "/", summary(package)))
    walk(package, 1)
    column = max(len(name) for name, _ in rows) + 2
    lines = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, TREE_WIDTH - column, break_long_words=False, break_on_hyphens=False) or [""]
        lines.append(name.ljust(column) + wrapped[0])
        lines.extend(" " * column + rest for rest in wrapped[1:])
    return "```\n" + "\n".join(lines) + "\n```\n"


def _generated(what: str, arg: str | None) -> str:
    if what == "include":  # a root file's links into docs/ are read from the page, which lies in docs/
        return (ROOT / arg).read_text().replace("](docs/", "](")
    from vitexplain.readme_tables import method_table, support_table

    tables = {"methods": method_table, "support": support_table, "protocols": protocol_table,
              "protocol-kinds": protocol_kinds, "recipes": recipe_table, "modules": module_tree,
              "method-departures": lambda: departures_table("method"),
              "protocol-departures": lambda: departures_table("protocol")}
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
