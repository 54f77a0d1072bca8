"""What one process of a benchmark found: per-image values, errors and seconds (and, on rank 0, galleries and
sanity)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .result import Gallery, Share

#: model -> method label -> phase ("maps", a metric label, "sanity") -> seconds
Seconds = dict[str, dict[str, dict[str, float]]]


def error_entry(model: str, method: str, metric: str | None, ids: list[str],
                error: BaseException | str) -> dict[str, Any]:
    """One failed item as :attr:`vitexplain.bench.BenchResult.errors` lists it."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"model": model, "method": method, "metric": metric, "images": list(ids), "error": message}


def add_seconds(into: Seconds, model: str, method: str, spent: dict[str, float]) -> None:
    found = into.setdefault(model, {}).setdefault(method, {})
    for phase, value in spent.items():
        found[phase] = found.get(phase, 0.0) + value


@dataclass
class Findings:
    """One process's findings, gathered on rank 0 to build the result."""

    shares: list[Share] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    seconds: Seconds = field(default_factory=dict)
    galleries: list[Gallery] = field(default_factory=list)
    sanity: dict[str, Any] = field(default_factory=dict)
