"""Which device a command or the API runs on: the one place a device the user names is resolved and checked.

Every entry point (``load_model``, ``vitexplain explain / bench / reproduce / train``, the bench's processes under
``torchrun``) resolves its device here, before any model or data is read, so a device this machine lacks is one
line naming it, and two processes of one launch never share a GPU.
"""
from __future__ import annotations

import os

import torch


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a :class:`torch.device` this machine has; the one place every command and the API check a device.

    None means CUDA when available, else the CPU. A CUDA device always comes back with its index:
    ``torch.cuda.set_device`` refuses a plain ``cuda``, and two processes of one ``torchrun`` must
    not share a GPU. So a plain ``cuda`` becomes ``cuda:LOCAL_RANK`` when the launcher sets
    ``LOCAL_RANK`` (torchrun does), else the current CUDA device; an explicit index is kept.
    No CUDA, an index the machine lacks or an unknown name raises a one-line ValueError naming it.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {str(device)!r}: expected cpu, cuda, cuda:N, mps ...") from None
    if resolved.type == "cuda":
        resolved = _indexed_cuda(resolved, str(device))
    try:
        torch.empty(0, device=resolved)
    except Exception as error:  # noqa: BLE001 - each backend fails in its own way (RuntimeError, AssertionError ...)
        raise ValueError(f"device {str(device)!r} is not available here ({str(error).splitlines()[0]})") from None
    return resolved


def _indexed_cuda(device: torch.device, given: str) -> torch.device:
    """``device`` (a CUDA one) with its index: the given one, else ``LOCAL_RANK``'s, else the current device's."""
    if not torch.cuda.is_available():
        raise ValueError(f"device {given!r}: no CUDA GPU is available on this machine")
    rank_note = ""
    index = device.index
    if index is None and "LOCAL_RANK" in os.environ:
        rank_note = f" (cuda:{os.environ['LOCAL_RANK']} from LOCAL_RANK)"
        try:
            index = int(os.environ["LOCAL_RANK"])
        except ValueError:
            raise ValueError(f"device {given!r}: LOCAL_RANK must be a GPU index, "
                             f"got {os.environ['LOCAL_RANK']!r}") from None
    if index is None:
        index = torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device {given!r}{rank_note}: this machine has {count} CUDA GPU(s), "
                         f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)
