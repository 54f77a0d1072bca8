"""Feeding images to the bench: which images, loading that survives bad files, batches on the device."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..datasets.base import identity_of, knows_identities, move, take
from .config import DatasetSpec


def build_dataset(spec: DatasetSpec | Dataset, data_config: dict[str, Any]) -> tuple[Dataset, str]:
    """The dataset a model is benchmarked on, and a key naming it in the cache.

    A :class:`DatasetSpec` is built with the model's preprocessing (``data_config`` of
    :func:`vitexplain.models.load_model`) unless its options give a ``preprocess``; a Dataset
    object is used as it is.
    """
    if isinstance(spec, Dataset):
        return spec, f"{type(spec).__name__}-{len(spec)}"
    from ..datasets import get_dataset

    dataset = get_dataset(spec.name, spec.root, **{"preprocess": data_config, **spec.options})
    described = json.dumps({"root": spec.root, "options": spec.options, "data_config": data_config}, sort_keys=True,
                           default=repr)
    return dataset, f"{spec.name}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"


def dataset_normalisation(dataset: Dataset,
                          data_config: dict[str, Any]) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(mean, std) per channel the dataset's images are normalised with: its ``preprocess``'s, else the
    model's data config's (what images preprocessed for the model use), else None."""
    preprocess = getattr(dataset, "preprocess", None)
    given = (getattr(preprocess, "mean", None), getattr(preprocess, "std", None))
    for mean, std in (given, (data_config.get("mean"), data_config.get("std"))):
        if mean is not None and std is not None:
            return tuple(float(v) for v in mean), tuple(float(v) for v in std)
    return None


def select_indices(size: int, limit: int | None, seed: int) -> list[int]:
    """All dataset indices, or a random subset of ``limit`` of them drawn with ``seed`` (sorted)."""
    from ..datasets.base import choose_indices

    return choose_indices(size, None if limit is None or limit >= size else limit, seed).tolist()


class _Guarded(Dataset):
    """Items of ``dataset`` at ``indices`` with their identities; an item that cannot be read becomes its error
    message."""

    def __init__(self, dataset: Dataset, indices: list[int]):
        self.dataset = dataset
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, Any, str | None]:
        index = self.indices[position]
        try:
            sample = self.dataset[index]
            return index, sample, identity_of(self.dataset, index, sample)
        except Exception as error:  # noqa: BLE001 - one unreadable image must not stop the run
            return index, f"{type(error).__name__}: {error}", None


@dataclass
class Batch:
    """A batch collated by :func:`vitexplain.datasets.base.collate` (``images``, ``labels``, ``ids``,
    optional ``masks``, ``boxes``, ``second`` ...), its dataset indices, the identities of its images (what
    the cache is keyed by: :func:`vitexplain.datasets.base.identity_of`), and the items that failed to load."""

    indices: list[int]
    data: dict[str, Any]
    failed: list[tuple[int, str]]
    keys: list[str] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [str(image_id) for image_id in self.data.get("ids", [])]

    def to(self, device: torch.device) -> Batch:
        return Batch(self.indices, move(self.data, device), self.failed, self.keys)

    def take(self, rows: list[int]) -> Batch:
        """The images at ``rows``."""
        return Batch([self.indices[r] for r in rows], take(self.data, rows), [], [self.keys[r] for r in rows])


def collate_loaded(items: list[tuple[int, Any, str | None]]) -> Batch:
    """Collate the samples that loaded; failed items (and samples that cannot be batched together) go to ``failed``."""
    from ..datasets.base import collate

    good = [(index, sample, key) for index, sample, key in items if isinstance(sample, dict)]
    failed = [(index, sample) for index, sample, _ in items if not isinstance(sample, dict)]
    if not good:
        return Batch([], {}, failed)
    indices = [index for index, _, _ in good]
    try:
        return Batch(indices, collate([sample for _, sample, _ in good]), failed, [key for _, _, key in good])
    except Exception as error:  # noqa: BLE001 - samples that cannot be batched are reported, not fatal
        message = f"cannot batch these samples: {type(error).__name__}: {error}"
        return Batch([], {}, failed + [(index, message) for index in indices])


def identities(dataset: Dataset, indices: list[int], batch_size: int, num_workers: int) -> dict[int, str]:
    """The identity of each image at ``indices`` that can be read (an unreadable one is left out): asked of the
    dataset when it tells them without loading, else from the loaded samples' content (one pass over them)."""
    found: dict[int, str] = {}
    if knows_identities(dataset):
        for index in indices:
            try:
                found[index] = identity_of(dataset, index)
            except Exception:  # noqa: BLE001 - an unreadable image is reported when the run loads it
                continue
        return found
    for batch in loader(dataset, indices, batch_size, num_workers):
        found.update(zip(batch.indices, batch.keys))
    return found


def loader(dataset: Dataset, indices: list[int], batch_size: int, num_workers: int) -> DataLoader:
    """Batches of the images at ``indices`` in order; loading errors arrive in :attr:`Batch.failed`."""
    return DataLoader(_Guarded(dataset, indices), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=collate_loaded, pin_memory=False)


def one_batch(dataset: Dataset, indices: list[int], device: torch.device) -> Batch | None:
    """The images at ``indices`` that load, as one batch on ``device`` (None when none is asked or loads)."""
    if not indices:
        return None
    batch = next(iter(loader(dataset, list(indices), len(indices), 0)))
    return batch.to(device) if batch.indices else None
