"""One bench at a time in an output folder: a lock file that says who holds it.

Two benches writing one folder would overwrite each other's reports: the one that ends last wins,
whatever it ran. So a run holds ``OUTPUT/bench.lock`` while it works: an exclusive ``flock`` on the
file, which the kernel drops when the process ends however it ends, so the lock of a killed run is
simply taken over; the file says the holder's pid, host and config hash. A run of the same config
waits for the holder (then finds the holder's work in the cache); a run of another config is refused
with one line. The holder removes the file when it is done, and the folders it created for the lock
when nothing else was written in them (a run refused by a late check leaves no empty folder).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from .store import options_key

LOCK_NAME = "bench.lock"
#: the config keys that change neither results nor reports (so two runs differing only there are one config)
NOT_IN_KEY = ("batch_size", "device", "num_workers", "progress", "plugins", "force")


class FolderInUse(ValueError):
    """Another bench, of another config, is writing into the output folder."""


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: dataclasses by their fields, paths as text, any other object
    (a model, a Dataset) by its class name."""
    if is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return str(value) if isinstance(value, Path) else type(value).__name__


def config_key(config) -> str:
    """A short hash of what a :class:`~vitexplain.bench.BenchConfig` runs and reports."""
    described = {f.name: getattr(config, f.name) for f in fields(config) if f.name not in NOT_IN_KEY}
    return options_key(json.loads(json.dumps(described, default=_plain)))


def _holder(path: Path) -> dict[str, Any]:
    """What the lock file says about its holder ({} while it is being written, or when it is unreadable)."""
    for _ in range(40):                                   # a new holder writes right after taking the lock
        try:
            found = json.loads(path.read_text() or "null")
        except (OSError, ValueError):
            found = None
        if isinstance(found, dict):
            return found
        time.sleep(0.05)
    return {}


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


@contextlib.contextmanager
def folder_lock(folder: Path, key: str) -> Iterator[None]:
    """Hold ``folder``'s lock for a run of the config ``key`` (see the module docstring); raises
    :class:`FolderInUse` when a run of another config holds it."""
    folder = Path(folder)
    path = folder / LOCK_NAME
    created: list[Path] = []
    handle = None
    try:
        while handle is None:
            created += _missing_folders(folder)          # again after a wait: the holder may have removed it
            folder.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(path)
                if holder.get("config") != key:
                    os.close(descriptor)
                    raise FolderInUse(
                        f"{folder} is in use by another bench (pid {holder.get('pid', '?')} on "
                        f"{holder.get('host', '?')}, config {holder.get('config', '?')}, this one {key}); wait for it "
                        "to end or write elsewhere (-o)"
                    ) from None
                print(f"waiting for the bench of the same config in {folder} (pid {holder.get('pid', '?')}) to end",
                      file=sys.stderr, flush=True)
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            if not path.exists() or os.stat(path).st_ino != os.fstat(descriptor).st_ino:
                os.close(descriptor)                     # the holder removed the file we waited on: take the new one
                continue
            handle = descriptor
        if os.fstat(handle).st_size:                     # a holder that ended without removing it: killed
            warnings.warn(f"{path} was left by a bench that no longer runs (pid {_holder(path).get('pid', '?')}); "
                          "taken over", stacklevel=3)
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "config": key}).encode(), 0)
        yield
    finally:
        if handle is not None:
            path.unlink(missing_ok=True)
            os.close(handle)
        for empty in created:
            with contextlib.suppress(OSError):
                empty.rmdir()
