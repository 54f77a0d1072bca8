"""A setting's images: the protocols' preprocessing, VOC's per-class items, and the check before a run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from ..bench import DatasetSpec
from ..datasets import DatasetFormatError, DatasetNotFoundError, Preprocess, get_dataset
from ..datasets.preprocess import IMAGENET_MEAN, IMAGENET_STD
from .recipe import DataSpec

PROTOCOLS = ("chefer", "tis", "tokenizer")


def preprocess_for(protocol: str, data_config: dict[str, Any], source: str) -> Preprocess | str:
    """The preprocessing of a protocol for a model with timm data config ``data_config``, loaded from ``source``.

    ``"chefer"``: ``Resize((size, size))`` without crop, bilinear (torchvision's default), the model's
    mean/std, as Chefer et al.'s evaluation code. ``"tis"``: the TIS authors' albumentations transform
    (``ilsvrc2012_albumentations.yaml``): ImageNet mean/std whatever the model, then ``Resize(256, 256)``
    of the normalised float image with OpenCV's ``INTER_LINEAR`` (albumentations' default; bilinear
    without antialiasing), then ``CenterCrop(224)``, scaled with the model's input size. ``"tokenizer"``:
    the model directory, whose tokenizer the text loader reads.
    """
    if protocol == "chefer":
        return Preprocess.from_data_config(data_config, crop_mode="squash", crop_pct=1.0, interpolation="bilinear")
    if protocol == "tis":
        return Preprocess.from_data_config(data_config, crop_mode="squash", crop_pct=224 / 256,
                                           interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                           antialias=False)
    if protocol == "tokenizer":
        return source
    raise ValueError(f"unknown preprocessing protocol {protocol!r}; choose one of {PROTOCOLS}")


class PerClassItems(Dataset):
    """One item per (image, class present) of a dataset whose samples have ``classes`` and ``class_mask`` (VOC).

    Item: the image, ``label`` = the class (0-based), ``mask`` = that class's pixels (``class_mask ==
    class + 1``), ``id`` = ``<image id>#<class>``. The classes of every image are read once, here.
    """

    provides = ("masks", "ignore")

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.items = [(index, int(cls)) for index in range(len(dataset)) for cls in dataset[index]["classes"].tolist()]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, position: int) -> dict[str, Any]:
        index, cls = self.items[position]
        sample = self.dataset[index]
        return {"image": sample["image"], "label": cls, "id": f"{sample['id']}#{cls}",
                "mask": sample["class_mask"] == cls + 1, "ignore": sample["ignore"]}


def _options(spec: DataSpec, indices: str | Path | None) -> dict[str, Any]:
    return {**spec.options, **({"indices": str(indices)} if indices is not None else {})}


def check_dataset(spec: DataSpec, root: str | Path, indices: str | Path | None = None,
                  preprocess: Any = None) -> str | None:
    """None when the dataset can be read from ``root``, else the loader's error (naming the file and layout)."""
    options = _options(spec, indices)
    if preprocess is not None:
        options["preprocess"] = preprocess
    try:
        get_dataset(spec.dataset, root, **options)
    except (DatasetNotFoundError, DatasetFormatError, ImportError, OSError, ValueError, IndexError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def bench_dataset(spec: DataSpec, root: str | Path, indices: str | Path | None, data_config: dict[str, Any],
                  source: str) -> DatasetSpec | Dataset:
    """What the bench is given: a :class:`DatasetSpec` (cached under a key of its root and options), or
    the per-class items of a segmentation dataset."""
    options = {**_options(spec, indices), "preprocess": preprocess_for(spec.preprocess, data_config, source)}
    if spec.per_class:
        return PerClassItems(get_dataset(spec.dataset, root, **options))
    return DatasetSpec(spec.dataset, str(root), options)
