"""Whether an LRP method keeps its rules' graphs or computes each block again: ``recompute="auto"``.

Every method with a ``recompute`` option (transformer attribution, absLRP, LRP, conservative LRP, AttnLRP,
CP-LRP) asks :func:`choose_recompute` before its forward. ``True`` / ``False`` are taken as given; ``"auto"``
(the default) keeps every block's graph from the forward (one forward of the blocks fewer, the faster path)
when its estimated peak memory fits the budget, and computes each block again in the backward otherwise (memory
that does not grow with blocks × tokens²). The two paths run the same operations: the maps are bitwise equal.

The estimate (bytes; docs/decisions/performance.md, "recompute='auto'"): for L blocks propagated through, batch B,
N tokens (patches + prefix tokens), width C = H · D, H heads and s bytes per element (the rules compute in float32
at least),

    kept peak ≈ L · B · s · (a · N · C + b · H · N · T)

with T = N (T = the window's tokens for windowed attention): the tensors the rules' graph keeps per block,
about a of token width and b of attention size, measured per method on the CPU (peak resident memory without
recomputation of ViT-Ti at 196 and 784 tokens, fitted; :data:`KEPT_PER_BLOCK`). A hierarchical model's later
stages are counted at the first stage's tokens and width (an overestimate).

The budget: ``VITEXPLAIN_MEMORY_BUDGET`` (bytes, or with a suffix K, M, G, T: ``512M``, ``2G``) when set; else
on CUDA :data:`MARGIN` of the free memory (``torch.cuda.mem_get_info`` plus what PyTorch's allocator holds
unused), on the CPU :data:`MARGIN` of the available memory (``MemAvailable`` of ``/proc/meminfo``, else
psutil's where installed). Where neither can be read the blocks are computed again.

The choice is logged (logger ``"vitexplain"``, debug level: the method, the estimate, the budget and the path)
and kept: :func:`last_decision`, and every decision made within :func:`collecting`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..adapter import ModelAdapter

#: the type of the methods' ``recompute`` option
Recompute = bool | Literal["auto"]
#: environment variable that sets the memory budget in bytes (suffixes K, M, G, T: powers of 1024)
BUDGET_VARIABLE = "VITEXPLAIN_MEMORY_BUDGET"
#: share of the free (CUDA) or available (CPU) memory the kept graphs may take
MARGIN = 0.8
#: per method, (a, b): bytes the kept rules' graph holds per block, per element of B·N·C and of B·H·N·T
#: respectively, in units of the element size: the CPU fit (docs/decisions/performance.md) rounded up by 15 %
KEPT_PER_BLOCK: dict[str, tuple[float, float]] = {
    "transformer_attribution": (72.0, 4.7),
    "abs_lrp": (66.0, 4.1),
    "lrp": (70.0, 2.1),
    "conservative_lrp": (29.0, 0.5),
    "attnlrp": (65.0, 0.6),
    "cp_lrp": (63.0, 0.35),
}
#: for a caller not in :data:`KEPT_PER_BLOCK`: the largest of them
DEFAULT_PER_BLOCK = tuple(max(values) for values in zip(*KEPT_PER_BLOCK.values()))

LOGGER = logging.getLogger("vitexplain")
_SUFFIXES = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}
_BYTES = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Decision:
    """One choice between keeping the rules' graphs and computing each block again.

    Attributes:
        method: the method (or caller) that asked.
        asked: the option as given: True, False or ``"auto"``.
        recompute: the path taken (True: each block computed again in the backward).
        estimate: the estimated peak bytes of keeping every block's graph (None when not estimated: ``asked`` was
            True or False).
        budget: the bytes that estimate was held against (None when not estimated, or not known).
        source: where the budget came from: ``VITEXPLAIN_MEMORY_BUDGET``, ``cuda free memory``, ``available RAM``,
            or ``unknown`` (the blocks are then computed again).
    """

    method: str
    asked: bool | str
    recompute: bool
    estimate: int | None = None
    budget: int | None = None
    source: str | None = None

    def describe(self) -> str:
        """One line, as logged."""
        path = "computes each block again" if self.recompute else "keeps the rules' graphs"
        if self.estimate is None:
            return f"{self.method}: recompute={self.asked} {path}"
        budget = "unknown" if self.budget is None else _mib(self.budget)
        return (f"{self.method}: recompute='auto' estimates {_mib(self.estimate)} for the kept graphs against a "
                f"budget of {budget} ({self.source}): {path}")


_LAST: Decision | None = None
_COLLECTORS: list[list[Decision]] = []
_LOCK = threading.Lock()


def last_decision() -> Decision | None:
    """The latest :class:`Decision` made in this process (None before any)."""
    return _LAST


@contextlib.contextmanager
def collecting() -> Iterator[list[Decision]]:
    """Within the block, every :class:`Decision` made is appended to the list yielded (e.g. for a run's metadata)."""
    found: list[Decision] = []
    with _LOCK:
        _COLLECTORS.append(found)
    try:
        yield found
    finally:
        with _LOCK:
            _COLLECTORS.remove(found)


def parse_bytes(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5g"``, ``"1048576"`` as bytes (suffixes K, M, G, T are powers of 1024; a trailing
    ``B`` or ``iB`` is allowed). Raises a one-line ValueError naming :data:`BUDGET_VARIABLE` otherwise."""
    match = _BYTES.fullmatch(text)
    if match is None:
        raise ValueError(f"{BUDGET_VARIABLE} must be a number of bytes, optionally with a suffix K, M, G or T "
                         f"(e.g. 512M, 2G), got {text!r}")
    return int(float(match.group(1)) * _SUFFIXES[match.group(2).lower()])


def memory_budget(device: torch.device | str) -> tuple[int | None, str]:
    """(bytes the kept graphs may take, where that came from): :data:`BUDGET_VARIABLE` when set; else on CUDA
    :data:`MARGIN` of the free memory and of what PyTorch's allocator holds unused, elsewhere :data:`MARGIN` of
    the available RAM; (None, ``"unknown"``) where it cannot be read."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    if text:
        return parse_bytes(text), BUDGET_VARIABLE
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(MARGIN * (free + unused)), "cuda free memory"
    available = _available_ram()
    return (None, "unknown") if available is None else (int(MARGIN * available), "available RAM")


def _available_ram() -> int | None:
    """MemAvailable of /proc/meminfo, else psutil's available memory where psutil is installed, else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def kept_graph_bytes(adapter: ModelAdapter, images: Tensor, method: str, blocks: int | None = None) -> int:
    """Estimated peak bytes of a relevance pass that keeps the rules' graph of ``blocks`` blocks (default: all),
    from the model and the batch (module docstring)."""
    first = adapter.blocks[0]
    heads, width = first.attention.num_heads, first.attention.num_heads * first.attention.head_dim
    tokens = 1
    for size in adapter.grid_size(images):
        tokens *= int(size)
    tokens += adapter.num_prefix_tokens
    windows = getattr(first, "windows", None)
    attended = tokens
    if windows is not None:
        attended = 1
        for size in windows.window:
            attended *= int(size)
    element = torch.promote_types(adapter.dtype, torch.float32).itemsize
    per_token, per_score = KEPT_PER_BLOCK.get(method, DEFAULT_PER_BLOCK)
    count = adapter.num_blocks if blocks is None else blocks
    per_block = per_token * tokens * width + per_score * heads * tokens * min(attended, tokens)
    return int(count * images.shape[0] * element * per_block)


def choose_recompute(method: str, recompute: Recompute, adapter: ModelAdapter, images: Tensor, *,
                     blocks: int | None = None) -> bool:
    """Whether ``method`` computes each block again in the backward: ``recompute`` itself when True or False;
    for ``"auto"``, True unless the estimated peak of keeping the rules' graphs of ``blocks`` blocks (default: all)
    fits the memory budget (module docstring). The decision is logged at debug level and kept
    (:func:`last_decision`, :func:`collecting`)."""
    if recompute == "auto" and not isinstance(recompute, bool):
        estimate = kept_graph_bytes(adapter, images, method, blocks)
        budget, source = memory_budget(images.device)
        decision = Decision(method, "auto", budget is None or estimate > budget, estimate, budget, source)
    elif isinstance(recompute, bool):
        decision = Decision(method, recompute, recompute)
    else:
        raise ValueError(f"recompute takes True, False or 'auto', got {recompute!r}")
    _record(decision)
    return decision.recompute


def _record(decision: Decision) -> None:
    global _LAST
    with _LOCK:
        _LAST = decision
        for found in _COLLECTORS:
            found.append(decision)
    LOGGER.debug("%s", decision.describe())


def _mib(count: int) -> str:
    return f"{count / 2 ** 20:,.0f} MiB"
