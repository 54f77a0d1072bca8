"""docs/architecture.md cannot drift from the code: its module tree is built from the modules' own docstrings when
the site is built (docs/hooks.py), and its list of context variables names every one the package has."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vitexplain"
PAGE = ROOT / "docs" / "architecture.md"
#: the folders one module per registered entry: methods, metrics, datasets, model families, reproduce recipes
REGISTRY_FOLDERS = {"methods", "metrics", "datasets", "instrumentation/families", "reproduce/tables"}


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


def tree_paths(tree: str) -> dict[str, str]:
    """Each line of the tree as (path relative to the package's parent, with "/" for folders) -> its text."""
    lines = tree.strip().splitlines()
    assert lines[0] == "```" and lines[-1] == "```"
    found, folders, column, path = {}, [], None, ""
    for line in lines[1:-1]:
        if column is not None and line[:column].isspace():
            found[path] += " " + line.strip()   # a wrapped description
            continue
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2
        column = line.index(line.split()[1], len(name) + 2 * depth) if len(line.split()) > 1 else None
        folders[depth:] = []
        path = "/".join([*folders, name.rstrip("/")]) + ("/" if name.endswith("/") else "")
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        found[path] = line[column:].strip() if column else ""
    return found


def modules(package: Path) -> list[Path]:
    return sorted(path for path in package.rglob("*.py") if "__pycache__" not in path.parts)


def first_sentence_start(path: Path) -> str:
    """The first few plain words of the module's docstring, as the tree shows them."""
    words = re.sub(r":\w+:`~?\.*([^`]+)`", r"\1", ast.get_docstring(ast.parse(path.read_text()))).replace("``", "")
    return " ".join(words.split()[:3])


def test_every_module_has_an_opening_docstring():
    missing = [str(path.relative_to(ROOT)) for path in modules(PACKAGE)
               if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()]
    assert not missing, f"modules without an opening docstring (one line: why the module exists): {missing}"


def test_every_module_appears_in_the_tree_with_its_own_docstring():
    assert {path.relative_to(PACKAGE).as_posix() for path in hooks.registry_packages(PACKAGE)} == REGISTRY_FOLDERS
    tree = tree_paths(hooks.module_tree())
    for path in modules(PACKAGE):
        relative = path.relative_to(PACKAGE)
        folder = "" if relative.parent == Path(".") else relative.parent.as_posix() + "/"
        collapsed = [name for name in REGISTRY_FOLDERS if folder.startswith(name + "/")]
        if collapsed:   # inside a registry's folder: that folder's line stands for it
            assert f"vitexplain/{collapsed[0]}/" in tree
            continue
        key = "vitexplain/" + (folder if path.name == "__init__.py" else folder + path.name)
        assert key in tree, f"{relative} is missing from the architecture page's module tree"
        assert tree[key].startswith(first_sentence_start(path)), (key, tree[key])
    for collapsed in REGISTRY_FOLDERS:   # one line each, with its count, and none of its members
        members = [path for path in (PACKAGE / collapsed).glob("*.py") if path.name != "__init__.py"]
        assert f"[{sum(not p.name.startswith('_') for p in members)} modules" in tree[f"vitexplain/{collapsed}/"]
        assert not [key for key in tree if key.startswith(f"vitexplain/{collapsed}/") and key.count("/") > 1
                    and key != f"vitexplain/{collapsed}/"]


def test_a_new_module_gets_its_line_and_one_without_a_docstring_fails_the_build(tmp_path):
    package = tmp_path / "toy"
    (package / "sub").mkdir(parents=True)
    (package / "data").mkdir()   # a folder without __init__.py holds no modules
    (package / "__init__.py").write_text('"""A toy package. Its second sentence is not shown."""\n')
    (package / "sub" / "__init__.py").write_text('"""The subpackage (see :func:`~.deep.name`), et al. (2024)."""\n')
    (package / "sub" / "new_module.py").write_text('"""Why the new module exists: it\n\nmakes a point."""\nx = 1\n')
    (package / "_helper.py").write_text('"""Shared by the others."""\n')
    tree = tree_paths(hooks.module_tree(package))
    assert tree == {"toy/": "A toy package", "toy/_helper.py": "Shared by the others",
                    "toy/sub/": "The subpackage (see name), et al. (2024)",
                    "toy/sub/new_module.py": "Why the new module exists: it"}
    (package / "sub" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="bare.py has no opening docstring"):
        hooks.module_tree(package)


def test_the_page_gets_the_tree_at_build_time():
    markdown = PAGE.read_text()
    assert markdown.count("<!-- vitexplain: modules -->") == 1
    built = hooks.on_page_markdown(markdown, page=None, config=None, files=None)
    assert "<!-- vitexplain: modules -->" not in built
    assert hooks.module_tree().strip() in built
    assert "  output_folders.py" in built and "    token_subsets.py" in built


def context_variables() -> set[tuple[str, str]]:
    """(module, name) of every ``ContextVar(...)`` assigned in the package."""
    found = set()
    for path in modules(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                function = node.value.func
                if getattr(function, "attr", getattr(function, "id", None)) == "ContextVar":
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    found |= {(path.relative_to(PACKAGE).as_posix(), target.id) for target in targets}
    return found


def test_the_page_lists_every_context_variable():
    section = PAGE.read_text().split("## State in context variables", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\* `([\w/]+\.py)`, `(\w+)`:", section, flags=re.MULTILINE))
    assert len(context_variables()) >= 3
    assert listed == context_variables()
