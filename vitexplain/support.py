"""Which method explains which model family: found by running every method on every family's examples.

Each family description lists tiny randomly initialised example models
(:meth:`~vitexplain.instrumentation.families.base.Family.examples`); :func:`support_matrix` runs every
registered method on each (with its sample counts at their minimum) and records whether it works or
why it is refused; a model without a classifier (a two-tower model's image tower) explains a fixed
embedding direction. ``vitexplain methods --models`` prints the matrix stored with the package
(``assets/support.md``, written by :func:`write_support_table` when ``python -m vitexplain.readme_tables``
runs); a test regenerates it and compares,
so the stored table cannot drift from the code.
"""
from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .options import Range

TABLE = Path(__file__).parent / "assets" / "support.md"
#: option names that count samples or steps: the matrix runs them at their minimum, to be quick
SAMPLE_COUNTS = ("n_masks", "n_samples", "n_steps")


def quick_options(method: str) -> dict[str, Any]:
    """The method's sample counts at the smallest value their annotation allows."""
    from .registry import get_method

    found = {}
    for name, annotation in get_method(method).option_types.items():
        if name in SAMPLE_COUNTS:
            bounds = [extra for extra in typing.get_args(annotation)[1:] if isinstance(extra, Range)]
            found[name] = int(bounds[0].low) if bounds and bounds[0].low is not None else 1
    return found


def examples() -> dict[str, Callable[[], tuple[Any, Any]]]:
    """Every family's example builders, by label, in the order families are tried, then a model known by its
    outputs only."""
    from .instrumentation import ForwardOnly, served_families

    return {label: build for family in (*served_families(), ForwardOnly) for label, build in family.examples().items()}


def builtin_methods() -> list[str]:
    """The explanation methods vitexplain ships (controls left out), not those registered by plug-ins."""
    from .registry import METHODS, available_methods

    return [name for name in available_methods(controls=False)
            if METHODS.get(name).fn.__module__.startswith("vitexplain.methods.")]


def support_matrix(methods: list[str] | None = None, progress: bool = False) -> dict[str, dict[str, str | None]]:
    """example label -> method -> None when it works, else why it is refused ("" when it does not apply).

    ``methods`` defaults to every registered method but the controls (plug-ins included).

    A method that raises anything but :class:`~vitexplain.instrumentation.UnsupportedModelError` (or
    the refusal of an input kind it does not explain) is a bug: the error propagates.
    """
    from tqdm.auto import tqdm

    from .api import explain
    from .instrumentation import UnsupportedModelError, adapter_for
    from .registry import available_methods, get_method

    methods = available_methods(controls=False) if methods is None else methods
    matrix: dict[str, dict[str, str | None]] = {}
    for label, build in tqdm(examples().items(), desc="support matrix", disable=not progress):
        model, inputs = build()
        adapter = adapter_for(model)
        target = None if adapter.head_reason is None else embedding_direction(adapter, inputs)
        row: dict[str, str | None] = {}
        for method in methods:
            if adapter.modality not in get_method(method).modalities:
                row[method] = ""
                continue
            if target is not None and not get_method(method).score_targets:
                row[method] = "explains classes only, and this model has no classifier (its output is an embedding)"
                continue
            try:
                explain(model, inputs, method, target=target, **quick_options(method))
                row[method] = None
            except UnsupportedModelError as error:  # the row names the method: one reason for all it applies to
                row[method] = str(error).removeprefix(f"method {method!r} ")
        matrix[label] = row
    return matrix


def embedding_direction(adapter, inputs):
    """A fixed direction [D] in the output space of a model without a classifier (its target in the matrix)."""
    import torch

    width = adapter.logits(inputs).shape[-1]
    return torch.randn(width, generator=torch.Generator().manual_seed(0))


def support_markdown(matrix: dict[str, dict[str, str | None]]) -> str:
    """The matrix as Markdown: methods as rows, example models as columns, refusals numbered below."""
    labels = list(matrix)
    methods = list(next(iter(matrix.values())))
    reasons: list[str] = []
    lines = ["| method | " + " | ".join(labels) + " |", "| --- |" + " :---: |" * len(labels)]
    for method in methods:
        cells = []
        for label in labels:
            found = matrix[label][method]
            if found is None:
                cells.append("✓")
            elif found == "":
                cells.append("–")
            else:
                if found not in reasons:
                    reasons.append(found)
                cells.append(f"✗ {reasons.index(found) + 1}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "✓ works · – does not apply (the method explains images only, or text only)"
                  + (" · ✗ refused:" if reasons else ""), ""]
    lines += [f"{number}. {reason}" for number, reason in enumerate(reasons, 1)]
    return "\n".join(lines) + "\n"


def write_support_table(path: Path = TABLE) -> str:
    """Run the matrix of the built-in methods and store its Markdown with the package; returns the Markdown."""
    table = support_markdown(support_matrix(builtin_methods(), progress=True))
    path.write_text(table)
    return table
