"""What every loader shares: errors, the name registry, seeded subsets, dict samples and their batching.

A sample is a dict: ``image`` float [3, H, W] (preprocessed), ``label`` int (-1 when unknown),
``id`` str, and the ground truth the dataset has, e.g. ``mask`` bool [H, W] (foreground, aligned
with the image), ``boxes`` float [k, 4] (x0, y0, x1, y1 in image pixels) and ``second`` (the second
object of a two-object image: ``{"label", "mask", "boxes"}``). :func:`collate` batches samples into
``images``, ``labels``, ``ids`` and the ground truth by the names of
:data:`vitexplain.metrics.base.TRUTH` (``mask`` becomes ``masks``; ``boxes`` stays a list, one
entry per image; ``second`` becomes ``{"targets", "masks", "boxes"}``); other keys keep their name.
A dataset declares the ground truth it serves, by those batch names, in ``provides``.

Every sample has an *identity* (:func:`identity_of`): its id and a digest of its content, what a cache of
results per image is keyed by, so that a stored result never answers for a changed, added or moved image.
A dataset that can tell it without reading the image (from its files' bytes) defines ``identity(index)``.
"""
from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..registry import Registry, registering


class DatasetNotFoundError(FileNotFoundError):
    """A file a dataset needs is absent; the message names it and shows the expected layout."""

    def __init__(self, path: str | Path, layout: str, what: str = ""):
        super().__init__(f"{what or 'dataset file'} not found: {path}\nexpected layout:\n{layout}")
        self.path = Path(path)


class DatasetFormatError(ValueError):
    """A dataset file exists but does not hold what the format says; the message names the file."""

    def __init__(self, path: str | Path, problem: str, layout: str = ""):
        detail = f"\nexpected layout:\n{layout}" if layout else ""
        super().__init__(f"{path}: {problem}{detail}")
        self.path = Path(path)


def require(path: Path, layout: str, what: str = "", directory: bool = False) -> Path:
    """``path`` when it exists (as a directory when ``directory``), else :class:`DatasetNotFoundError`."""
    if not (path.is_dir() if directory else path.is_file()):
        raise DatasetNotFoundError(path, layout, what)
    return path


def choose_indices(total: int, n: int | None = None, seed: int = 0,
                   indices: Sequence[int] | str | Path | None = None) -> Tensor:
    """Which of ``total`` samples a dataset serves, as a LongTensor.

    All of them by default; ``n`` draws a random subset of that many, the same for a given ``seed``
    (own ``torch.Generator``), returned in dataset order; ``indices`` picks given positions in the
    given order, as a sequence or a text file of one integer per line (a YAML list ``- 17`` too).
    """
    if n is not None and indices is not None:
        raise ValueError("give either n (a random subset) or indices, not both")
    if indices is not None:
        if isinstance(indices, (str, Path)):
            lines = Path(indices).read_text().split("\n")
            indices = [int(line.strip().removeprefix("-")) for line in lines if line.strip()]
        chosen = torch.as_tensor(list(indices), dtype=torch.long)
        if chosen.numel() and (chosen.min() < 0 or chosen.max() >= total):
            raise IndexError(f"indices must lie in [0, {total}), got values from {chosen.min()} to {chosen.max()}")
        return chosen
    if n is None:
        return torch.arange(total)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= total:
        raise ValueError(f"n must be an integer in [1, {total}] (the dataset's size), got {n!r}")
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(total, generator=generator)[:n].sort().values


class DictDataset(Dataset):
    """A map-style dataset of dict samples over a fixed list of ``total`` items, of which a subset is served.

    Subclasses set ``splits`` (the first is the default), ``provides`` (the ground truth their batches
    carry, by batch name: ``"masks"``, ``"boxes"`` ...; see :data:`vitexplain.metrics.base.TRUTH`) and
    implement :meth:`load`.
    """

    splits: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()

    def __init__(self, total: int, n: int | None = None, seed: int = 0,
                 indices: Sequence[int] | str | Path | None = None):
        self.indices = choose_indices(total, n, seed, indices)

    @classmethod
    def check_split(cls, split: str) -> str:
        if split not in cls.splits:
            raise ValueError(f"{cls.__name__} has no split {split!r}; its splits are: {', '.join(cls.splits)}")
        return split

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} samples")
        return self.load(int(self.indices[index]))

    def load(self, item: int) -> dict[str, Any]:
        """The sample of item ``item`` of the full list."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------- identity

def _digest_value(digest: Any, value: Any) -> None:
    """Feed ``value`` (a tensor, array, number, text, or a list / dict of them) to ``digest``, type and shape too."""
    if isinstance(value, Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
        _digest_value(digest, torch.as_tensor(value))
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key in sorted(value, key=str):
            digest.update(f"K{key}".encode())
            _digest_value(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{len(value)}".encode())
        for item in value:
            _digest_value(digest, item)
    else:
        digest.update(f"V{json.dumps(value, default=repr)}".encode())


def content_digest(*parts: Any) -> str:
    """A short SHA-256 of ``parts`` (samples, file bytes, labels ...): equal content, equal digest."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, bytes):
            digest.update(b"B" + part)
        else:
            _digest_value(digest, part)
    return digest.hexdigest()[:20]


def identity_of(dataset: Dataset, index: int, sample: dict[str, Any] | None = None) -> str | None:
    """The identity of the dataset's item ``index``: ``"<id>#<content digest>"``.

    The dataset's own ``identity(index)`` when it has one (it reads no image); else the digest of the loaded
    ``sample`` (every value of it: the preprocessed image and its ground truth), None when no sample is given.
    """
    own = getattr(dataset, "identity", None)
    if callable(own):
        return own(index)
    if sample is None:
        return None
    return f"{sample.get('id', index)}#{content_digest(sample)}"


def knows_identities(dataset: Dataset) -> bool:
    """Whether ``dataset`` tells an item's identity without loading it."""
    return callable(getattr(dataset, "identity", None))


# ---------------------------------------------------------------------------------------- batching

_BATCH_NAMES = {"image": "images", "label": "labels", "id": "ids", "mask": "masks"}
_SECOND_NAMES = {"label": "targets", "mask": "masks"}
#: batch names that are not ground truth
NOT_TRUTH = ("images", "labels", "ids")
#: ground truth with a varying number of entries per image: batched as a list, one entry per image
_PER_IMAGE_LISTS = ("boxes", "rationale_spans")


def _batch(key: str, values: list) -> Any:
    if key in _PER_IMAGE_LISTS or isinstance(values[0], str):
        return values
    if isinstance(values[0], (int, float, bool)):
        return torch.tensor(values)
    if isinstance(values[0], Tensor) and all(v.shape == values[0].shape for v in values):
        return torch.stack(values)
    return values


def _collate(samples: list[dict], names: dict[str, str]) -> dict[str, Any]:
    keys = list(samples[0])
    for sample in samples:
        if list(sample) != keys:
            raise ValueError(f"cannot batch samples with different keys: {sorted(keys)} and {sorted(sample)}")
    batch = {}
    for key in keys:
        values = [sample[key] for sample in samples]
        batch[names.get(key, key)] = _collate(values, _SECOND_NAMES) if key == "second" else _batch(key, values)
    return batch


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch dict samples (use as a DataLoader's ``collate_fn``).

    Returns ``images`` [B, 3, H, W], ``labels`` LongTensor [B], ``ids`` list, and when present
    ``masks`` [B, H, W], ``boxes`` (list of [k, 4]), ``second`` ``{"targets", "masks", "boxes"}``;
    other tensors of equal shape are stacked, anything else is listed.
    """
    if not samples:
        raise ValueError("cannot batch an empty list of samples")
    return _collate(list(samples), _BATCH_NAMES)


def move(value: Any, device: torch.device) -> Any:
    """A batch value (tensor, or list / dict of them) on ``device``."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [move(item, device) for item in value]
    if isinstance(value, dict):
        return {key: move(item, device) for key, item in value.items()}
    return value


def take(value: Any, rows: list[int]) -> Any:
    """Rows of a per-image tensor, list, or dict of them."""
    if isinstance(value, Tensor):
        return value[torch.tensor(rows, dtype=torch.long, device=value.device)]
    if isinstance(value, list):
        return [value[r] for r in rows]
    if isinstance(value, dict):
        return {key: take(item, rows) for key, item in value.items()}
    return value


# ---------------------------------------------------------------------------------------- registry

DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset", "vitexplain.datasets")


def register_dataset(name: str | type[Dataset] | None = None, /) -> Any:
    """Class decorator that registers a dataset loader, under ``name`` (``@register_dataset("digits")``), else under
    the class's name (``@register_dataset``)."""
    return registering(DATASETS.add, name)


def available_datasets() -> list[str]:
    """Names of every registered dataset, sorted."""
    return DATASETS.names()


def get_dataset(name: str, root: str | Path | None = None, split: str | None = None, **options) -> Dataset:
    """The dataset registered as ``name``, read from ``root`` (None for generated datasets).

    ``split`` defaults to the dataset's first split; ``options`` are the loader's keyword arguments
    (e.g. ``preprocess``, ``n``, ``seed``); unknown names get the list of valid ones.
    """
    cls = DATASETS.get(name)
    params = inspect.signature(cls).parameters
    valid = sorted(p for p in params if p not in ("root", "split"))
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(f"dataset {name!r} has no option {', '.join(map(repr, unknown))}; "
                        f"its options are: {', '.join(valid)}")
    if "root" in params:
        if root is None:
            raise ValueError(f"dataset {name!r} is read from files: give its root directory")
        options["root"] = root
    elif root is not None:
        raise ValueError(f"dataset {name!r} is generated and takes no root, got {root!r}")
    return cls(split=split or cls.splits[0], **options)
