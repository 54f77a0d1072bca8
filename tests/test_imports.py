"""The package's import graph: no cycles, and nothing imports upward (cli at the top; instrumentation,
registry, options and plugins at the bottom).

The graph is read from the source (every ``import`` and ``from ... import``, also inside functions,
where cycles like to hide), so it needs no import to run. A ``from package import name`` points at
the submodule when ``name`` is one, else at the package.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "vitexplain"
BOTTOM = ("vitexplain.instrumentation", "vitexplain.registry", "vitexplain.options", "vitexplain.plugins",
          "vitexplain.seeding")
#: upward imports found when this test was written (importer, imported), for their owners to remove; the
#: test fails when one disappears (take it off the list) or a new one appears
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = {_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                if node.level:
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found |= {target for target in targets if target in modules and target != name}
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_sees_cycles_and_layers():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}
    real = import_graph()
    assert "vitexplain.bench.runner" in real["vitexplain.bench"]
    assert {"vitexplain.bench.config", "vitexplain.metrics"} <= real["vitexplain.bench.runner"]
    assert "vitexplain.models" in real["vitexplain.bench.runner"]                # imported inside a function only


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == set(), f"import cycles: {sorted(sorted(cycle) for cycle in found)}"


def test_nothing_imports_upward():
    upward = set()
    for importer, imported in import_graph().items():
        for target in imported:
            into_cli = target.startswith("vitexplain.cli") and not importer.startswith("vitexplain.cli")
            out_of_bottom = importer.startswith(BOTTOM) and not target.startswith(BOTTOM)
            if into_cli or out_of_bottom:
                upward.add((importer, target))
    assert upward == KNOWN_UPWARD, f"upward imports: {sorted(upward)}"
