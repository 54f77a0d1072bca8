"""Where a benchmark keeps its work: one folder per (model weights, dataset, target mode, method and options).

Layout (docs/decisions/bench.md): ``OUTPUT/cache/<model>-<weights hash>/<dataset key>/target-<mode>/
<method>-<options hash>/`` holds ``maps/`` and ``metrics/<metric>-<options hash>/`` (the sanity check's among
them: its protocol ``model_randomisation``); a ``spec.json`` beside each store says what it holds. The options
hashes cover the effective options (defaults filled in), so ``{}`` and the explicit defaults share a folder.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..metrics.base import BoundMetric
from ..registry import BoundMethod
from .data import Batch
from .store import ShardStore, atomic_write, options_key, safe_name


def fingerprint(model: nn.Module) -> str:
    """Hash of the model's weights: a model changed under the same name gets a fresh cache."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


#: the folder of an output folder that holds the cache
CACHE_FOLDER = "cache"


def model_folder(output_dir: Path, name: str, model: nn.Module) -> Path:
    return Path(output_dir) / CACHE_FOLDER / f"{safe_name(name)}-{fingerprint(model)}"


def _describe(directory: Path, description: dict[str, Any]) -> None:
    """A readable note of what a cache folder holds."""
    path = directory / "spec.json"
    if not path.exists():
        atomic_write(path, json.dumps(description, indent=2, sort_keys=True, default=repr).encode())


class MethodCache:
    """The cache of one method with its options on one (model, dataset, target mode).

    Attributes:
        method: the method and the options it is called with.
        directory: its folder.
        maps: the maps and explained classes of every image done.
        values: metric label -> the per-image values of that metric (with its options).
    """

    def __init__(self, base: Path, method: BoundMethod, metrics: list[BoundMetric]):
        self.method = method
        effective = method.effective
        self.directory = base / f"{safe_name(method.name)}-{options_key(effective)}"
        self.maps = ShardStore(self.directory / "maps")
        _describe(self.directory, {"method": method.name, "options": effective})
        self.values: dict[str, ShardStore] = {}
        for metric in metrics:
            folder = self.directory / "metrics" / f"{safe_name(metric.name)}-{options_key(metric.options)}"
            self.values[metric.label] = ShardStore(folder)
            _describe(folder, {"metric": metric.name, "options": metric.options})

    def scan(self) -> None:
        """Find what is stored (checking every file; see :meth:`ShardStore.scan`)."""
        self.maps.scan()
        for store in self.values.values():
            store.scan()

    def cached_maps(self, batch: Batch) -> dict[str, Tensor] | None:
        """The stored maps and targets of the batch's images, on its device; None unless all have them."""
        if not all(key in self.maps for key in batch.keys):
            return None
        return self.maps.read(batch.keys, batch.data["images"].device)
