"""CIFAR-10 and CIFAR-100 from their python pickles (TokenTM's perturbation tests, Tables 2-3)."""
from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .base import DatasetFormatError, DictDataset, register_dataset, require
from .preprocess import Preprocess, resolve_preprocess

#: What the pickles may build: numpy arrays, their dtypes and bytes (protocol-2 pickles written by
#: Python 3 store bytes through ``_codecs.encode``), nothing else (no arbitrary code).
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


class _CIFAR(DictDataset):
    """Shared reader: ``folder`` with ``files[split]`` pickles, labels under ``label_key``, names in ``meta``."""

    splits = ("test", "train")
    folder: str
    files: dict[str, tuple[str, ...]]
    label_key: str
    meta: tuple[str, str]

    def __init__(self, root: str | Path, split: str = "test", *, preprocess: Preprocess | dict | None = None,
                 n: int | None = None, seed: int = 0, indices: Sequence[int] | str | Path | None = None):
        self.check_split(split)
        folder = Path(root) / self.folder
        parts = [self._unpickle(folder / name) for name in self.files[split]]
        try:
            self.images = np.concatenate([np.asarray(part["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
                                          for part in parts])
            self.labels = np.concatenate([np.asarray(part[self.label_key], dtype=np.int64) for part in parts])
        except (KeyError, ValueError) as error:
            raise DatasetFormatError(folder, f"a {split} pickle lacks 'data' uint8 [N, 3072] or {self.label_key!r} "
                                     f"({error})", self.layout()) from None
        if len(self.images) != len(self.labels):
            raise DatasetFormatError(folder, f"{len(self.images)} images but {len(self.labels)} labels", self.layout())
        meta = self._unpickle(folder / self.meta[0])
        if self.meta[1] not in meta:
            raise DatasetFormatError(folder / self.meta[0], f"lacks {self.meta[1]!r}", self.layout())
        self.class_names = list(meta[self.meta[1]])
        if self.labels.size and not 0 <= self.labels.min() <= self.labels.max() < len(self.class_names):
            raise DatasetFormatError(folder, f"labels must lie in [0, {len(self.class_names)})", self.layout())
        self.split = split
        self.preprocess = resolve_preprocess(preprocess, Preprocess(crop_mode="squash", crop_pct=1.0))
        super().__init__(len(self.labels), n, seed, indices)

    @classmethod
    def layout(cls) -> str:
        files = ", ".join(sorted({name for names in cls.files.values() for name in names}))
        return (f"  root/{cls.folder}/ with the python pickles {files} (dicts with 'data': uint8 [N, 3072], "
                f"channel planes R, G, B of 32 x 32 rows, and {cls.label_key!r}: list of ints) and "
                f"{cls.meta[0]} (dict with {cls.meta[1]!r})")

    def _unpickle(self, path: Path) -> dict[str, Any]:
        require(path, self.layout(), f"{type(self).__name__} pickle")
        try:
            with open(path, "rb") as handle:
                content = _ArrayUnpickler(handle, encoding="latin1").load()
        except Exception as error:  # noqa: BLE001 - any unpickling failure means a malformed file
            raise DatasetFormatError(path, f"not a CIFAR python pickle ({type(error).__name__}: {error})",
                                     self.layout()) from None
        if not isinstance(content, dict):
            raise DatasetFormatError(path, f"holds a {type(content).__name__}, expected a dict", self.layout())
        return content

    def load(self, item: int) -> dict[str, Any]:
        image = Image.fromarray(self.images[item].transpose(1, 2, 0))
        tensor, _, _ = self.preprocess(image)
        return {"image": tensor, "label": int(self.labels[item]), "id": f"{self.split}_{item:05d}"}


@register_dataset("cifar10")
class CIFAR10(_CIFAR):
    """CIFAR-10 (10,000 test images), ``cifar-10-batches-py``; default preprocessing: 32 -> 224, no crop.

    Samples: ``image``, ``label``, ``id``. Args: ``root`` (the directory holding
    ``cifar-10-batches-py``), ``split`` (``"test"`` or ``"train"``), ``preprocess``, ``n``, ``seed``,
    ``indices`` (see :func:`vitexplain.datasets.base.choose_indices`).
    """

    folder = "cifar-10-batches-py"
    files = {"test": ("test_batch",), "train": tuple(f"data_batch_{i}" for i in range(1, 6))}
    label_key = "labels"
    meta = ("batches.meta", "label_names")


@register_dataset("cifar100")
class CIFAR100(_CIFAR):
    """CIFAR-100 (10,000 test images, the 100 fine labels), ``cifar-100-python``; preprocessing as CIFAR-10."""

    folder = "cifar-100-python"
    files = {"test": ("test",), "train": ("train",)}
    label_key = "fine_labels"
    meta = ("meta", "fine_label_names")
