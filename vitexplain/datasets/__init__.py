"""Dataset loaders over local files, and the generated ``digits`` benchmark, registered by name.

``get_dataset(name, root, split=..., **options)`` builds one; every loader is a map-style torch
Dataset of dict samples (see :mod:`vitexplain.datasets.base`), batched by :func:`collate`.
Nothing is ever downloaded: a missing file raises :class:`DatasetNotFoundError` naming it and
showing the expected layout; a malformed one raises :class:`DatasetFormatError`.
"""
from .base import (
    DatasetFormatError,
    DatasetNotFoundError,
    DictDataset,
    available_datasets,
    choose_indices,
    collate,
    get_dataset,
    register_dataset,
)
from .cifar import CIFAR10, CIFAR100
from .digits import Digits
from .eraser import MovieReviews
from .imagenet import ImageNetVal, imagenet_class_index
from .imagenet_seg import ImageNetSegmentation
from .preprocess import Preprocess
from .voc import VOC_CLASSES, VOCSegmentation

__all__ = [
    "CIFAR10", "CIFAR100", "DatasetFormatError", "DatasetNotFoundError", "DictDataset", "Digits",
    "ImageNetSegmentation", "ImageNetVal", "MovieReviews", "Preprocess", "VOCSegmentation", "VOC_CLASSES",
    "available_datasets", "choose_indices", "collate", "get_dataset", "imagenet_class_index", "register_dataset",
]
