"""Running the same bench command under ``torchrun``: one process per device, images sharded r::world."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..devices import resolve_device


@dataclass(frozen=True)
class Place:
    """Where this process runs: its rank among ``world`` processes and its device."""

    rank: int
    world: int
    device: torch.device

    def gather(self, value: Any) -> list[Any] | None:
        """Every process's ``value`` in rank order on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [value]
        gathered = [None] * self.world if self.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every process."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


@contextlib.contextmanager
def place(requested_device: str | None) -> Iterator[Place]:
    """This process's place; joins the process group ``torchrun`` describes (gloo on CPU, nccl on GPU).

    The device is :func:`vitexplain.models.resolve_device`'s (under torchrun a plain ``cuda`` is the
    local rank's GPU), checked before anything else is done. A process group that already exists is
    used as it is and left open.
    """
    device = resolve_device(requested_device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    created = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        created = True
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        if dist.is_initialized():
            yield Place(dist.get_rank(), dist.get_world_size(), device)
        else:
            yield Place(0, 1, device)
    finally:
        if created:
            dist.destroy_process_group()
