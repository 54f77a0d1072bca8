"""ImageNet (ILSVRC2012) validation images with labels and, optionally, bounding boxes."""
from __future__ import annotations

import csv
import functools
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..image_files import load_image
from .base import DatasetFormatError, DatasetNotFoundError, DictDataset, register_dataset, require
from .preprocess import Preprocess, resolve_preprocess

LAYOUT = """\
  root/ in one of two layouts:
    class folders: root/[val/]<wnid>/<name>.JPEG          (ImageFolder / torchvision layout)
    flat:          <images>/ILSVRC2012_val_00000001.JPEG ... with <images> one of root/val,
                   root/ILSVRC/Data/CLS-LOC/val, root/ILSVRC2012_img_val or root itself,
                   and the labels in either
                     root/LOC_val_solution.csv        header "ImageId,PredictionString",
                         rows "ILSVRC2012_val_00000001,n01751748 111 108 441 431 [more boxes]"
                     root/[ILSVRC2012_devkit_t12/data/]ILSVRC2012_validation_ground_truth.txt
                         (line i: 1-based ILSVRC2012_ID of image i) with meta.mat beside it
                         (devkit struct array 'synsets': ILSVRC2012_ID, WNID, num_children)
  boxes (boxes=True): root/[ILSVRC/]Annotations/CLS-LOC/val/ILSVRC2012_val_00000001.xml
                   (PASCAL VOC style: size/width, size/height, object/name, object/bndbox/xmin ...),
                   or the boxes of root/LOC_val_solution.csv"""

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}
WNID = re.compile(r"n\d{8}")
FLAT_NAME = re.compile(r"ILSVRC2012_val_(\d{8})")
IMAGE_DIRS = ("val", "ILSVRC/Data/CLS-LOC/val", "ILSVRC2012_img_val", ".")
SOLUTION_CSV = "LOC_val_solution.csv"
DEVKIT_TXT = ("ILSVRC2012_validation_ground_truth.txt",
              "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt")
ANNOTATION_DIRS = ("Annotations/CLS-LOC/val", "ILSVRC/Annotations/CLS-LOC/val")


@functools.lru_cache(maxsize=1)
def imagenet_class_index() -> dict[str, int]:
    """wnid -> class index of timm / torchvision ImageNet-1k models (the sorted order of the 1000 wnids)."""
    from timm.data import ImageNetInfo

    return {wnid: index for index, wnid in enumerate(ImageNetInfo().label_names())}


def _class_of(wnid: str, source: Path) -> int:
    classes = imagenet_class_index()
    if wnid not in classes:
        raise DatasetFormatError(source, f"{wnid!r} is not one of the 1000 ImageNet-1k wnids", LAYOUT)
    return classes[wnid]


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES


def _find_image_dir(root: Path) -> tuple[Path, str]:
    """The directory that holds the images and its layout (``"folders"`` or ``"flat"``)."""
    for relative in IMAGE_DIRS:
        folder = root / relative
        if not folder.is_dir():
            continue
        entries = list(folder.iterdir())
        if any(entry.is_dir() and WNID.fullmatch(entry.name) for entry in entries):
            return folder, "folders"
        if any(_is_image(entry) and FLAT_NAME.match(entry.name) for entry in entries):
            return folder, "flat"
    raise DatasetNotFoundError(root, LAYOUT, "ImageNet validation images (wnid folders or ILSVRC2012_val_*.JPEG)")


def _read_solution_csv(path: Path) -> dict[str, np.ndarray]:
    """Kaggle's LOC_val_solution.csv: image id -> its objects [k, 5] (wnid, x0, y0, x1, y1) as strings."""
    table = {}
    with open(path, newline="") as handle:
        rows = csv.reader(handle)
        header = next(rows, None)
        if header != ["ImageId", "PredictionString"]:
            raise DatasetFormatError(path, f"header must be 'ImageId,PredictionString', got {header}", LAYOUT)
        for line, row in enumerate(rows, start=2):
            fields = row[1].split() if len(row) == 2 else []
            if not fields or len(fields) % 5:
                raise DatasetFormatError(path, f"line {line} is not 'ImageId,wnid x0 y0 x1 y1 ...'", LAYOUT)
            table[row[0]] = np.array(fields, dtype=object).reshape(-1, 5)
    return table


def _read_devkit(path: Path) -> dict[str, str]:
    """ILSVRC2012_validation_ground_truth.txt + meta.mat: image id (file stem) -> wnid."""
    meta = require(path.parent / "meta.mat", LAYOUT, "ImageNet devkit meta.mat (next to the ground-truth file)")
    from scipy.io import loadmat

    try:
        synsets = loadmat(meta, squeeze_me=True)["synsets"]
        ids, wnids = synsets["ILSVRC2012_ID"], synsets["WNID"]
        leaves = synsets["num_children"] == 0 if "num_children" in synsets.dtype.names else np.ones(len(ids), bool)
        id_to_wnid = {int(i): str(w) for i, w, leaf in zip(ids, wnids, leaves) if leaf}
    except (KeyError, ValueError, TypeError, OSError) as error:
        raise DatasetFormatError(meta, f"not a devkit meta.mat with a 'synsets' struct array ({error})",
                                 LAYOUT) from None
    try:
        ground_truth = [int(line) for line in path.read_text().split()]
    except ValueError:
        raise DatasetFormatError(path, "must hold one integer ILSVRC2012_ID per line", LAYOUT) from None
    unknown = sorted(set(ground_truth) - set(id_to_wnid))
    if unknown:
        raise DatasetFormatError(path, f"ILSVRC2012_ID {unknown[0]} is not a leaf synset of {meta}", LAYOUT)
    return {f"ILSVRC2012_val_{number:08d}": id_to_wnid[ilsvrc_id]
            for number, ilsvrc_id in enumerate(ground_truth, start=1)}


def read_voc_xml(path: Path, image_size: tuple[int, int]) -> tuple[list[str], np.ndarray]:
    """Object names and boxes [k, 4] of a PASCAL-VOC-style XML, rescaled to ``image_size`` (w, h).

    Coordinates are taken as given (continuous pixel edges, as the TIS pointing-game code uses them);
    when the XML's <size> differs from the image (resized copies of ImageNet), boxes are rescaled.
    """
    try:
        tree = ElementTree.parse(path).getroot()
        width, height = float(tree.findtext("size/width")), float(tree.findtext("size/height"))
        names, boxes = [], []
        for item in tree.iter("object"):
            box = item.find("bndbox")
            boxes.append([float(box.findtext(key)) for key in ("xmin", "ymin", "xmax", "ymax")])
            names.append(item.findtext("name").strip())
    except (ElementTree.ParseError, TypeError, AttributeError, ValueError) as error:
        raise DatasetFormatError(path, f"not a VOC-style annotation with size and object/bndbox ({error})",
                                 LAYOUT) from None
    scale = np.array([image_size[0] / width, image_size[1] / height] * 2, dtype=np.float32)
    return names, np.asarray(boxes, dtype=np.float32).reshape(-1, 4) * scale


@register_dataset("imagenet")
class ImageNetVal(DictDataset):
    """ImageNet (ILSVRC2012) validation set, the 50,000 images TIS and TokenTM evaluate on.

    Labels are timm / torchvision class indices (position of the wnid among the 1000 sorted wnids).
    Samples are ordered by (class index, file name) in both layouts, which is the order of
    torchvision's ``ImageNet(split="val")``: ``indices`` can therefore replay a published subset
    (e.g. the TIS authors' ``sub5000`` list), while ``n`` draws a seeded random one (TIS uses 5,000).
    Every sample: ``image``, ``label``, ``id`` (file stem); with ``boxes=True`` also ``boxes``
    [k, 4], the boxes of the labelled class in preprocessed-image pixels.

    Args:
        root: see the layout in the error of a missing file (module constant ``LAYOUT``).
        split: ``"val"``.
        preprocess: a :class:`Preprocess` or timm data config (default: 224, bicubic, crop 0.875).
        boxes: load bounding boxes (from the XML annotations, else LOC_val_solution.csv).
        n, seed, indices: serve a subset (see :func:`vitexplain.datasets.base.choose_indices`).
        images_dir, ground_truth, annotations_dir: explicit paths instead of the searched ones.
    """

    splits = ("val",)

    def __init__(self, root: str | Path, split: str = "val", *, preprocess: Preprocess | dict | None = None,
                 boxes: bool = False, n: int | None = None, seed: int = 0,
                 indices: Sequence[int] | str | Path | None = None, images_dir: str | Path | None = None,
                 ground_truth: str | Path | None = None, annotations_dir: str | Path | None = None):
        self.check_split(split)
        root = require(Path(root), LAYOUT, "ImageNet root directory", directory=True)
        self.preprocess = resolve_preprocess(preprocess, Preprocess())
        if images_dir is None:
            image_dir, layout = _find_image_dir(root)
        else:
            image_dir = require(Path(images_dir), LAYOUT, "ImageNet image directory", directory=True)
            layout = "folders" if any(WNID.fullmatch(p.name) for p in image_dir.iterdir() if p.is_dir()) else "flat"
        self._solution_path = root / SOLUTION_CSV
        self._solution = _read_solution_csv(self._solution_path) if self._solution_path.is_file() else None
        if layout == "folders":
            files = self._folder_files(image_dir)
        else:
            files = self._flat_files(image_dir, root, ground_truth)
        self.files = sorted(files, key=lambda item: (item[1], item[0].name))
        self.with_boxes = boxes
        self.provides = ("boxes",) if boxes else ()
        self._annotations = self._find_annotations(root, annotations_dir) if boxes else None
        super().__init__(len(self.files), n, seed, indices)

    @staticmethod
    def _folder_files(image_dir: Path) -> list[tuple[Path, int]]:
        folders = [p for p in image_dir.iterdir() if p.is_dir() and WNID.fullmatch(p.name)]
        return [(path, _class_of(folder.name, folder))
                for folder in folders for path in folder.iterdir() if _is_image(path)]

    def _flat_files(self, image_dir: Path, root: Path, ground_truth: str | Path | None) -> list[tuple[Path, int]]:
        paths = [p for p in image_dir.iterdir() if _is_image(p) and FLAT_NAME.match(p.name)]
        if ground_truth is not None:
            source = require(Path(ground_truth), LAYOUT, "ImageNet ground-truth file")
        elif self._solution is not None:
            source = self._solution_path
        else:
            found = [root / name for name in DEVKIT_TXT if (root / name).is_file()]
            if not found:
                raise DatasetNotFoundError(root / SOLUTION_CSV, LAYOUT, f"labels of the flat layout in {image_dir} "
                                           f"({SOLUTION_CSV} or {DEVKIT_TXT[0]})")
            source = found[0]
        if source.suffix == ".csv":
            table = self._solution if source == self._solution_path else _read_solution_csv(source)
            wnid_of = {name: objects[0, 0] for name, objects in table.items()}
        else:
            wnid_of = _read_devkit(source)
        missing = [path.name for path in paths if path.stem not in wnid_of]
        if missing:
            raise DatasetFormatError(source, f"has no label for {missing[0]}", LAYOUT)
        return [(path, _class_of(wnid_of[path.stem], source)) for path in paths]

    def _find_annotations(self, root: Path, annotations_dir: str | Path | None) -> Path | None:
        if annotations_dir is not None:
            return require(Path(annotations_dir), LAYOUT, "ImageNet annotation directory", directory=True)
        for relative in ANNOTATION_DIRS:
            if (root / relative).is_dir():
                return root / relative
        if self._solution is None:
            raise DatasetNotFoundError(root / ANNOTATION_DIRS[0], LAYOUT,
                                       f"boxes=True needs the XML annotations or {SOLUTION_CSV}")
        return None

    def _boxes(self, path: Path, label: int, image_size: tuple[int, int]) -> np.ndarray:
        if self._annotations is not None:
            xml = require(self._annotations / f"{path.stem}.xml", LAYOUT, "ImageNet box annotation")
            names, boxes = read_voc_xml(xml, image_size)
        else:
            if path.stem not in self._solution:
                raise DatasetFormatError(self._solution_path, f"has no boxes for {path.name}", LAYOUT)
            objects = self._solution[path.stem]
            names, boxes = list(objects[:, 0]), objects[:, 1:].astype(np.float32)
        classes = imagenet_class_index()
        keep = [classes.get(name) == label for name in names]
        return boxes[np.asarray(keep, dtype=bool)]

    def load(self, item: int) -> dict[str, Any]:
        path, label = self.files[item]
        image = load_image(path)
        boxes = self._boxes(path, label, image.size) if self.with_boxes else None
        tensor, _, moved = self.preprocess(image, boxes=boxes)
        sample = {"image": tensor, "label": label, "id": path.stem}
        if self.with_boxes:
            sample["boxes"] = moved
        return sample
