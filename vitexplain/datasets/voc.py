"""PASCAL VOC 2012 segmentation: images with per-pixel class masks."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..image_files import load_image
from .base import DatasetFormatError, DatasetNotFoundError, DictDataset, register_dataset, require
from .preprocess import Preprocess, resolve_preprocess

VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")
VOID = 255
LAYOUT = """\
  root/VOCdevkit/VOC2012/   (root may also be VOCdevkit/ or VOC2012/ itself)
    ImageSets/Segmentation/<split>.txt   one image id per line, e.g. 2007_000033
    JPEGImages/<id>.jpg
    SegmentationClass/<id>.png           palette PNG: 0 background, 1-20 classes, 255 void"""


def _voc_dir(root: Path) -> Path:
    for candidate in (root / "VOCdevkit" / "VOC2012", root / "VOC2012", root):
        if (candidate / "ImageSets" / "Segmentation").is_dir():
            return candidate
    raise DatasetNotFoundError(root / "VOCdevkit/VOC2012/ImageSets/Segmentation", LAYOUT, "PASCAL VOC 2012 split lists")


@register_dataset("voc")
class VOCSegmentation(DictDataset):
    """PASCAL VOC 2012 segmentation ``val`` (1,449 images), GradToken's multi-class segmentation test (Table 1).

    Samples: ``image``; ``class_mask`` uint8 [H, W] (0 background, 1-20 classes, 255 void, resized
    with the image by nearest neighbour); ``mask`` bool foreground (classes 1-20); ``ignore`` bool (the
    void pixels, which no protocol counts);
    ``classes`` LongTensor of the VOC classes present after preprocessing (0-based: 0 = aeroplane,
    see ``VOC_CLASSES``); ``label`` the present class covering most pixels (-1 if none), which is in
    VOC's 20-class space, not ImageNet's; ``id``. Default preprocessing as for ImageNet-Segmentation
    (squash to 224, no crop), so no object is cropped away.

    Args:
        root: see ``LAYOUT``.
        split: ``"val"`` (default), ``"train"`` or ``"trainval"``.
        preprocess: a :class:`Preprocess` or timm data config.
        n, seed, indices: serve a subset (see :func:`vitexplain.datasets.base.choose_indices`).
    """

    splits = ("val", "train", "trainval")
    provides = ("masks", "ignore", "class_mask", "classes")

    def __init__(self, root: str | Path, split: str = "val", *, preprocess: Preprocess | dict | None = None,
                 n: int | None = None, seed: int = 0, indices: Sequence[int] | str | Path | None = None):
        self.check_split(split)
        self.root = _voc_dir(Path(root))
        listing = require(self.root / "ImageSets" / "Segmentation" / f"{split}.txt", LAYOUT, f"VOC {split} list")
        self.ids = listing.read_text().split()
        for folder in ("JPEGImages", "SegmentationClass"):
            require(self.root / folder, LAYOUT, f"VOC {folder} directory", directory=True)
        self.preprocess = resolve_preprocess(preprocess, Preprocess(crop_mode="squash", crop_pct=1.0))
        super().__init__(len(self.ids), n, seed, indices)

    def _class_mask(self, name: str) -> np.ndarray:
        path = require(self.root / "SegmentationClass" / f"{name}.png", LAYOUT, "VOC class mask")
        try:
            with Image.open(path) as png:
                mode, values = png.mode, np.array(png)
        except (UnidentifiedImageError, OSError) as error:
            raise DatasetFormatError(path, f"is not a readable PNG ({error})", LAYOUT) from None
        if mode not in ("P", "L"):
            raise DatasetFormatError(path, f"is a {mode} image, expected a palette (P) PNG of class indices", LAYOUT)
        bad = np.setdiff1d(np.unique(values), [*range(len(VOC_CLASSES) + 1), VOID])
        if bad.size:
            raise DatasetFormatError(path, f"holds class index {bad[0]}, expected 0-20 or 255", LAYOUT)
        return values

    def load(self, item: int) -> dict[str, Any]:
        name = self.ids[item]
        image = load_image(require(self.root / "JPEGImages" / f"{name}.jpg", LAYOUT, "VOC image"))
        tensor, class_mask, _ = self.preprocess(image, mask=self._class_mask(name))
        foreground = (class_mask > 0) & (class_mask != VOID)
        counts = torch.bincount(class_mask[foreground].long(), minlength=len(VOC_CLASSES) + 1)[1:]
        classes = counts.nonzero().flatten()
        label = int(counts.argmax()) if classes.numel() else -1
        return {"image": tensor, "label": label, "id": name, "mask": foreground, "class_mask": class_mask,
                "ignore": class_mask == VOID, "classes": classes}
