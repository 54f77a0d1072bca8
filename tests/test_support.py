"""The support matrix stored with the package (and shown in the README) is what the code does now."""
from __future__ import annotations

import re
import sys
import types

from vitexplain.readme_tables import README, method_table, section, with_tables
from vitexplain.support import TABLE, builtin_methods, support_markdown, support_matrix


def test_the_stored_support_matrix_is_regenerated_exactly():
    """Every built-in method runs on every family's example, or is refused with the reason the table gives
    (methods other tests register are not part of the stored table)."""
    assert support_markdown(support_matrix(builtin_methods())) == TABLE.read_text(), \
        "the support matrix changed: run `python -m vitexplain.readme_tables`"


def test_the_readme_holds_what_the_command_writes():
    """The method table and the stored support matrix, each between its markers (vitexplain.readme_tables)."""
    readme = README.read_text()
    stale = "README.md's generated tables are stale: run `python -m vitexplain.readme_tables`"
    assert with_tables(readme) == readme, stale
    start, end = section(readme, "support")
    assert readme[start:end] == TABLE.read_text()
    from vitexplain.registry import METHODS

    start, end = section(readme, "methods")
    rows = [line for line in readme[start:end].splitlines() if line.startswith("| `")]
    controls = [name for name in METHODS.names()      # the built-in controls (random, constant, degraded ...), last
                if METHODS.get(name).control and METHODS.get(name).fn.__module__.startswith("vitexplain.methods.")]
    assert {"constant_baseline", "random_baseline"} <= set(controls)
    assert [row.split("`")[1] for row in rows] == sorted(builtin_methods()) + sorted(controls)
    assert re.search(r"vitexplain methods --models", readme)


def test_a_new_method_reaches_the_readme_table_through_the_command(monkeypatch):
    """A method module's first docstring line is its row's description (nothing to edit by hand)."""
    from vitexplain.registry import METHODS, register_method

    module = types.ModuleType("vitexplain.methods.throwaway_for_readme")
    module.__doc__ = "Throwaway: a test's method (Nobody et al., 2026)."
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def throwaway(adapter, images, target=None):
        """A throwaway method."""

    throwaway.__module__ = module.__name__
    register_method("throwaway_for_readme", cost=1)(throwaway)
    try:
        assert "| `throwaway_for_readme` | Throwaway: a test's method (Nobody et al., 2026) | token |" in method_table()
    finally:
        METHODS.remove("throwaway_for_readme")
