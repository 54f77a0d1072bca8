"""The quickstart notebook runs, and what it shows is what the library computes now.

``docs/notebooks/quickstart.ipynb`` is stored executed: the site renders its stored outputs (mkdocs-jupyter, never
executing it), so a notebook whose outputs were written by an older library, or never produced, would show readers
numbers and heatmaps the package no longer gives. Here it runs again in a fresh kernel, as a reader's Jupyter would,
and

* no cell raises;
* every code cell of the stored copy was executed, in order, with outputs: no cell left unrun or hand-edited;
* every text it stores (the scores table included) is the freshly executed one, character for character, and the
  table's numbers and intervals are those the notebook's ``vitexplain.evaluate`` calls returned, read from the
  kernel after the last cell (the table's code cannot mislabel a method, a number or an interval);
* the figure it stores is the freshly drawn one (pixel for pixel, within anti-aliasing), so a change of a method's
  maps or of ``vitexplain.plot`` shows.

After changing the notebook or what it shows, execute and store it again with ``python tests/test_notebook.py``
(the same kernel settings as here).
"""
from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient
from PIL import Image

from cli import python_env

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "notebooks" / "quickstart.ipynb"
#: seconds one cell may take (the whole notebook: under 20 s on one core of the 2-core machine, kernel start included)
CELL_TIMEOUT = 180
#: the kernel's environment beyond this checkout first on its path, the same here and when the notebook is stored:
#: one thread, so a sum's order (and with it the last bits of every number) is the same on any machine and two test
#: workers do not oversubscribe two cores; and tqdm.auto's warning that ipywidgets is absent (not a dependency; a
#: Jupyter that has it prints nothing) kept out of the stored outputs
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore:IProgress not found"}
#: a line of the cell that shows the scores table
TABLE_CELL = 'Markdown("\\n".join(rows))'
#: run after the notebook's cells in the fresh kernel (not stored): prints, as JSON, every number and interval the
#: notebook's ``evaluate`` calls returned, which its table must show
PROBE = ("import json\n"
         "print(json.dumps({name: {metric: [result.numbers, result.intervals] for metric, result in found.items()}\n"
         "                  for name, found in scores.items()}))")
#: the table's columns, in order: (protocol, number)
COLUMNS = [("segmentation", "miou"), ("insertion_deletion", "insertion_minus_deletion")]
#: a cell of the table: "value [low, high]"
CELL = re.compile(r"(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")


def execute(path: Path = NOTEBOOK, *extra: str) -> nbformat.NotebookNode:
    """The notebook at ``path``, with code cells ``extra`` added at its end, executed in a fresh ``python3`` kernel of
    this environment, in the notebook's folder, with this checkout first on the kernel's path; a cell that raises
    raises ``nbclient``'s ``CellExecutionError``."""
    notebook = nbformat.read(path, as_version=4)
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in extra]
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env={**python_env(), **KERNEL_ENV})
    return notebook


def code_cells(notebook: nbformat.NotebookNode) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def output_text(output) -> str:
    """What an output shows as text: a stream's text, or a result's markdown or plain text."""
    if output.output_type == "stream":
        return output.text
    data = output.get("data", {})
    return data.get("text/markdown", data.get("text/plain", ""))


def cell_showing(notebook: nbformat.NotebookNode, marker: str):
    """The one code cell whose source contains ``marker``."""
    found = [cell for cell in code_cells(notebook) if marker in cell.source]
    assert len(found) == 1, f"{len(found)} code cells contain {marker!r}"
    return found[0]


def table(cell) -> dict[str, list[tuple[str, str, str]]]:
    """The scores table of ``cell``'s markdown output: per method, its cells as (value, low, high) strings."""
    text = "".join(output_text(output) for output in cell.outputs)
    rows = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.strip().strip("|").split("|")]
        numbers = [CELL.fullmatch(part) for part in parts[1:]]
        if len(parts) > 1 and numbers and all(numbers):
            rows[parts[0]] = [match.groups() for match in numbers]
    return rows


def png(cell) -> np.ndarray:
    images = [output.data["image/png"] for output in cell.outputs if "image/png" in output.get("data", {})]
    assert len(images) == 1, f"the plot cell shows {len(images)} PNG images, not one"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(images[0]))).convert("RGB"), dtype=np.int16)


@pytest.fixture(scope="module")
def stored() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def fresh() -> nbformat.NotebookNode:
    return execute(NOTEBOOK, PROBE)


def test_the_stored_notebook_is_valid_and_was_executed_in_order(stored):
    nbformat.validate(stored)
    cells = code_cells(stored)
    assert cells, "the notebook has no code cell"
    counts = [cell.execution_count for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"stored execution counts {counts}: execute and store it with `python tests/test_notebook.py`")
    for cell in cells:
        assert cell.outputs, f"cell {cell.execution_count} has no output: every cell shows what it did"
        assert not [output for output in cell.outputs if output.output_type == "error"]
        assert not [output for output in cell.outputs if output.get("name") == "stderr"], (
            f"cell {cell.execution_count} wrote to stderr (a warning the reader would see)")


def test_it_runs_in_a_fresh_kernel_and_shows_what_is_stored(stored, fresh):
    assert [cell.source for cell in code_cells(fresh)] == [cell.source for cell in code_cells(stored)] + [PROBE]
    for before, after in zip(code_cells(stored), code_cells(fresh)):
        assert [output.output_type for output in after.outputs] == [o.output_type for o in before.outputs]
        if "vitexplain.plot(" not in after.source:   # the figure's PNG is compared below, within anti-aliasing
            shown = [output_text(output) for output in after.outputs]
            assert shown == [output_text(output) for output in before.outputs], (
                f"cell {after.execution_count} now shows {shown}: the stored notebook is stale; execute and store "
                "it with `python tests/test_notebook.py`")


def test_the_scores_table_shows_the_scores_evaluate_returned(fresh):
    shown = table(cell_showing(fresh, TABLE_CELL))
    assert list(shown) == ["tokentm", "rollout", "random_baseline"], f"the table's rows: {list(shown)}"
    returned = json.loads(output_text(code_cells(fresh)[-1].outputs[0]))   # PROBE's print
    for method, cells in shown.items():
        for (metric, key), cell in zip(COLUMNS, cells, strict=True):
            numbers, intervals = returned[method][metric]
            for text, value in zip(cell, (numbers[key], *intervals[key]), strict=True):
                digits = len(text.split(".")[1])
                assert text == f"{value:.{digits}f}", (
                    f"{method} {metric} {key}: the table shows {text}, evaluate returned {value} ({cell})")
    # what the notebook tells the reader: the control scores below both methods on both numbers
    for column in range(len(COLUMNS)):
        control = float(shown["random_baseline"][column][0])
        assert all(float(shown[method][column][0]) > control for method in ("tokentm", "rollout"))


def test_the_stored_figure_is_the_one_plot_draws_now(stored, fresh):
    before, after = png(cell_showing(stored, "vitexplain.plot(")), png(cell_showing(fresh, "vitexplain.plot("))
    assert before.shape == after.shape, f"figure of {before.shape} stored, {after.shape} drawn now"
    # anti-aliasing may differ by a level or two between matplotlib builds; a changed map changes whole patches
    changed = (np.abs(before - after).max(-1) > 24).mean()
    assert changed < 0.002, (f"{changed:.1%} of the figure's pixels changed: the stored notebook is stale; execute "
                             "and store it with `python tests/test_notebook.py`")


if __name__ == "__main__":   # execute the notebook and store it, outputs included
    nbformat.write(execute(NOTEBOOK), NOTEBOOK)
    print(f"executed and stored {NOTEBOOK.relative_to(REPO)}")
