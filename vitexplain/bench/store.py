"""On-disk results of the bench: per-batch files keyed by image, checksummed, written so a kill never corrupts them.

A :class:`ShardStore` is a folder of safetensors files, one per processed batch. Each file holds
per-image tensors (explanation maps, targets, metric values) plus, in its header, the identity of every
row (the image's id and a digest of its content: :func:`vitexplain.datasets.base.identity_of`) and a
SHA-256 of all of it. Rows are found by identity, never by position in the dataset, so a stored value
answers only for the image it was computed on: a changed, added, removed or renamed image is computed
alone and everything unchanged is reused. A file appears only complete (written to a temporary name,
flushed, then renamed over with :func:`os.replace`), so after a ``kill -9`` a folder holds exactly the
batches that finished, and a rerun skips the images found there. Files written before rows carried
identities are ignored (their images are computed again).

A file that cannot be read, or whose content no longer matches its checksum (a truncated copy, a
flipped bit on disk), is named in a :class:`CacheWarning` and removed when the folder is scanned, so
its images are computed again and nothing else is lost. Small JSON records (the sanity check's) get
the same treatment through :func:`write_record` / :func:`read_record`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save
from torch import Tensor

SUFFIX = ".safetensors"
CHECKSUM = "sha256"


class CacheWarning(UserWarning):
    """A cache file was unreadable or corrupt; it was removed and its content is recomputed."""


class CorruptFile(ValueError):
    """A cache file whose content does not check out."""


def options_key(options: dict[str, Any]) -> str:
    """Short stable hash of a dict of options (a method's or a metric's effective options)."""
    text = json.dumps(options, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def safe_name(name: str) -> str:
    """``name`` usable as one folder name."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("._") or "_"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` is either absent/old or complete, never partial."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def discard(path: Path, reason: str) -> None:
    """Warn that the cache file ``path`` is unusable (``reason``) and remove it, so its content is recomputed."""
    warnings.warn(f"cache file {path} is {reason}; removed, its results are computed again", CacheWarning, stacklevel=2)
    Path(path).unlink(missing_ok=True)


def shard_checksum(keys: list[str], tensors: dict[str, Tensor]) -> str:
    """SHA-256 of a shard's rows (their identities) and tensors (name, dtype, shape and bytes of each)."""
    digest = hashlib.sha256(json.dumps(keys).encode())
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _read_shard(path: Path) -> list[str] | None:
    """The rows (identities) of a shard after checking it whole; None for a file written before rows carried
    identities; raises :class:`CorruptFile` (or the reader's error)."""
    with safe_open(str(path), "pt") as handle:
        header = handle.metadata() or {}
    if "keys" not in header:
        return None
    keys = json.loads(header["keys"])
    if not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)):
        raise CorruptFile("its header lists no valid rows")
    tensors = load_file(str(path))
    if any(tensor.shape[0] != len(keys) for tensor in tensors.values()):
        raise CorruptFile("its tensors do not have one row per image")
    if shard_checksum(keys, tensors) != header.get(CHECKSUM):
        raise CorruptFile("its content does not match its checksum")
    return keys


class ShardStore:
    """Per-image tensors of one (model, method[, metric]) stored as one file per batch, found by image identity."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._where: dict[str, tuple[Path, int]] = {}

    def scan(self) -> set[str]:
        """Find every stored image (also those other processes wrote); returns their identities.

        Every file is read whole and checked against its checksum; one that fails is discarded (see
        the module docstring).
        """
        self._where = {}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            try:
                keys = _read_shard(path)
            except (SafetensorError, OSError, ValueError, KeyError, TypeError) as error:
                discard(path, f"unreadable ({type(error).__name__}: {error})")
                continue
            for row, key in enumerate(keys or ()):
                self._where.setdefault(key, (path, row))
        return set(self._where)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def write(self, keys: list[str], tensors: dict[str, Tensor]) -> None:
        """Store one batch: the images ``keys`` (their identities); every tensor has one row per image."""
        for name, tensor in tensors.items():
            if tensor.shape[0] != len(keys):
                raise ValueError(f"{name!r} has {tensor.shape[0]} rows for {len(keys)} images")
        digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]
        path = self.directory / f"{digest}{SUFFIX}"
        cpu = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
        metadata = {"keys": json.dumps(keys), CHECKSUM: shard_checksum(keys, cpu)}
        atomic_write(path, save(cpu, metadata=metadata))
        for row, key in enumerate(keys):
            self._where[key] = (path, row)

    def read(self, keys: list[str], device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Stored tensors of the images ``keys`` (all found by :meth:`scan` or written), rows in that order."""
        rows_of: dict[Path, list[tuple[int, int]]] = {}
        for position, key in enumerate(keys):
            path, row = self._where[key]
            rows_of.setdefault(path, []).append((position, row))
        parts: dict[str, list[Tensor]] = {}
        order: list[int] = []
        for path, pairs in rows_of.items():
            stored = load_file(str(path))
            rows = torch.tensor([row for _, row in pairs])
            for name, tensor in stored.items():
                parts.setdefault(name, []).append(tensor[rows])
            order.extend(position for position, _ in pairs)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        return {name: torch.cat(chunks)[inverse].to(device) for name, chunks in parts.items()}


def _record_checksum(content: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def write_record(path: Path, content: dict[str, Any]) -> None:
    """Store a JSON object with its checksum (under the key ``sha256``), atomically."""
    atomic_write(path, json.dumps({**content, CHECKSUM: _record_checksum(content)}).encode())


def read_record(path: Path) -> dict[str, Any] | None:
    """The object stored by :func:`write_record`; None when there is none, or when it is unreadable or
    does not match its checksum (then it is discarded with a :class:`CacheWarning`). Records written
    before checksums existed are returned unchecked."""
    if not path.exists():
        return None
    try:
        content = json.loads(path.read_bytes())
        if not isinstance(content, dict):
            raise CorruptFile("it does not hold a JSON object")
        checksum = content.pop(CHECKSUM, None)
        if checksum is not None and _record_checksum(content) != checksum:
            raise CorruptFile("its content does not match its checksum")
    except (OSError, ValueError) as error:
        discard(path, f"unreadable ({type(error).__name__}: {error})")
        return None
    return content
