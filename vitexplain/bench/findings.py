"""What one process of a benchmark found: per-image values, errors and seconds (and, on rank 0, galleries,
sanity and the timeline)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .result import Gallery, Share

#: model -> method label -> phase ("maps", a metric label, "sanity") -> seconds
Seconds = dict[str, dict[str, dict[str, float]]]
#: model -> method label -> path ("kept" / "recomputed") -> batches and the last decision (:attr:`BenchResult.memory`)
Memory = dict[str, dict[str, dict[str, dict[str, Any]]]]


def error_entry(model: str, method: str, metric: str | None, ids: list[str],
                error: BaseException | str) -> dict[str, Any]:
    """One failed item as :attr:`vitexplain.bench.BenchResult.errors` lists it."""
    message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"model": model, "method": method, "metric": metric, "images": list(ids), "error": message}


def add_memory(into: Memory, model: str, method: str, paths: dict[str, dict[str, Any]]) -> None:
    for path, seen in paths.items():
        found = into.setdefault(model, {}).setdefault(method, {}).setdefault(path, {"batches": 0, "last": ""})
        found["batches"] += seen["batches"]
        found["last"] = seen["last"]


def record_decisions(into: dict[str, dict[str, Any]], decisions: list[Any]) -> None:
    """Count each :class:`~vitexplain.instrumentation.lrp.memory.Decision` by the path it took, keeping the last."""
    for decision in decisions:
        found = into.setdefault("recomputed" if decision.recompute else "kept", {"batches": 0, "last": ""})
        found["batches"] += 1
        found["last"] = decision.describe()


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
    memory: Memory = field(default_factory=dict)
    galleries: list[Gallery] = field(default_factory=list)
    #: model -> ``{"levels": names}`` of the models the sanity check runs on (rank 0; :func:`.result.build_result`)
    sanity: dict[str, Any] = field(default_factory=dict)
    #: lines the run adds to the config's notes (a model's pixel options scaled to its input size)
    notes: list[str] = field(default_factory=list)
    #: perf_counter at the run's start; None on the ranks that keep no timeline (all but 0)
    origin: float | None = None
    #: the timed phases, in the order they ended (:attr:`BenchResult.timeline`)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    def mark(self, model: str, method: str, phase: str, started: float, ended: float) -> None:
        """Add one phase, timed by perf_counter, to the timeline (nothing without an origin)."""
        if self.origin is not None:
            self.timeline.append({"model": model, "method": method, "phase": phase,
                                  "start": started - self.origin, "end": ended - self.origin})

    @contextlib.contextmanager
    def timed(self, model: str, method: str, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.mark(model, method, phase, started, time.perf_counter())
