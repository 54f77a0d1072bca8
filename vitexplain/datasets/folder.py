"""A folder of your own images, with optional foreground masks, labels and boxes (``folder``)."""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..image_files import load_image
from ..output_folders import MARKER
from .base import DatasetFormatError, DatasetNotFoundError, DictDataset, content_digest, register_dataset, require
from .preprocess import Preprocess, resolve_preprocess

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
SUBFOLDERS = "subfolders"
LAYOUT = """\
  images/                 every image file below it, any depth (.png .jpg .jpeg .bmp .tif .tiff .webp, any case;
                          paths with a part starting with '.' skipped), served sorted by relative path
    cat/x.jpg             labels: subfolders -> class = the first folder below images/ (sorted names -> 0, 1, ...)
  masks/ (optional)       one mask per image, same relative path without suffix: masks/cat/x.png <-> images/cat/x.jpg
                          (a mask directly in masks/ also matches by file-name stem alone when that is unique);
                          same size as its image; foreground = pixel value > 0 (grey / palette index / 16-bit;
                          RGB: any channel > 0; fully transparent pixels are background)
  labels.csv (optional)   header 'file,label'; file = relative path, or it without suffix, or (when unique) a bare
                          file name or stem; label = an integer class index (-1: unknown) or a class name
                          (names -> indices by their sorted order, or by class_names)
  boxes.csv (optional)    header 'file,x0,y0,x1,y1[,label]', one row per box, several rows per image, x0 < x1,
                          y0 < y1 in pixels of the ORIGINAL image; where a row has a label and its image too,
                          the box is kept only when they agree
  boxes.json (optional)   {"<file>": [[x0, y0, x1, y1], ...], ...} (same files and pixels)
  when masks / a labels file / boxes are given, every image needs its mask / label / box(es)"""


def _some(names: Sequence[str]) -> str:
    """``"a, b, c, ..."``: at most three of ``names``."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _counted(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _problem(names: Sequence[str], one: str, many: str) -> list[str]:
    """``["12 images have no mask (a.png, b.png, c.png, ...)"]``, or nothing when ``names`` is empty."""
    return [f"{_counted(len(names), one, many)} ({_some(list(names))})"] if names else []


def _files(folder: Path, skip: Path | None = None) -> list[str]:
    """Relative POSIX paths of the image files below ``folder`` (none below the folder ``skip`` or below a folder
    vitexplain writes its output to, no part of the path starting with '.'), sorted."""
    skipped = [marker.parent.relative_to(folder).parts for marker in folder.rglob(MARKER)]
    if skip is not None and skip.resolve().is_relative_to(folder.resolve()):
        skipped.append(skip.resolve().relative_to(folder.resolve()).parts)
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or path.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        if any(relative.parts[:len(parts)] == parts for parts in skipped):
            continue
        if path.is_file():
            found.append(relative.as_posix())
    return sorted(found)


class _Names:
    """Finds an image by the name a mask file, CSV row or JSON key gives it: its relative path, that path
    without suffix, else, for a name without a folder part, its file name or file-name stem (ambiguous
    when several images have it)."""

    def __init__(self, files: Sequence[str]):
        self.levels: list[dict[str, list[int]]] = [defaultdict(list) for _ in range(4)]
        for index, name in enumerate(files):
            path = PurePosixPath(name)
            for level, key in enumerate((name, path.with_suffix("").as_posix(), path.name, path.stem)):
                self.levels[level][key].append(index)

    def find(self, name: str) -> list[int]:
        """The images ``name`` may mean: one, several (ambiguous) or none."""
        name = name.strip().replace("\\", "/").removeprefix("./")
        for level in range(2 if "/" in name else 4):
            if name in self.levels[level]:
                return self.levels[level][name]
        return []


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _foreground(path: Path) -> np.ndarray:
    """A mask file as bool [h, w]: value > 0 (grey, palette index, 16-bit, float; RGB: any channel > 0);
    where the file has an alpha channel, fully transparent pixels are background."""
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode in ("RGBA", "LA", "PA"):
                values = np.asarray(image)
                return (values[..., :-1] > 0).any(-1) & (values[..., -1] > 0)
            if mode not in ("1", "L", "P", "I", "F") and not mode.startswith("I;16"):
                image = image.convert("RGB")
            values = np.asarray(image)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise DatasetFormatError(path, f"is not a readable mask image ({error})") from None
    return (values > 0).any(-1) if values.ndim == 3 else values > 0


@register_dataset("folder")
class ImageFolderDataset(DictDataset):
    """Your own images in a folder, with optional foreground masks, labels and boxes (``LAYOUT``).

    Every pairing (image <-> mask, label row, box row) is checked when the dataset is built, before any
    image is read: images without a mask, masks, rows or keys that name no image (or several), images
    missing from a labels file or without a box are all refused in one :class:`DatasetFormatError` naming
    the file or folder, how many are concerned and at most three of them. Nothing is dropped silently.

    Samples: ``image`` float [3, H, W] (the model's preprocessing), ``label`` int (-1 when unknown),
    ``id`` the image's path relative to ``images``; with ``masks`` also ``mask`` bool [H, W] (resized by
    nearest neighbour and cropped exactly as the image); with ``boxes`` also ``boxes`` float [k, 4]
    (x0, y0, x1, y1) in pixels of the preprocessed image (scaled and shifted as the image, clipped, boxes
    cropped away dropped). ``provides`` names the ground truth the batches carry: ``"masks"``, ``"boxes"``.
    ``classes`` (list of names, index = label) and ``class_to_idx`` are set when labels are class names or
    ``class_names`` is given, else empty.

    Args:
        images: the folder of images (a path; relative paths are relative to the working directory).
        split: ``"all"`` (the folder is one set).
        masks: a folder of foreground masks, one per image (see ``LAYOUT``); a mask folder inside ``images``
            is not read as images.
        labels: ``"subfolders"`` (class = the image's first folder below ``images``, as torchvision's
            ImageFolder), a CSV file ``file,label``, or None (every label -1).
        boxes: a CSV (``file,x0,y0,x1,y1[,label]``) or JSON (``{"file": [[x0, y0, x1, y1], ...]}``) file of
            boxes in pixels of the original images.
        class_names: names -> indices: a list (index = position; a name not in it is an error), ``"model"``
            (the model's class names, from ``preprocess["class_names"]``, which the bench passes for models
            with a card, e.g. ``digits_vit``), or None (the sorted names found).
        preprocess: a :class:`Preprocess` or timm data config (default: ``Preprocess()``: 224, bicubic,
            crop 0.875, ImageNet mean / std; the bench passes the model's).
        n, seed, indices: serve a subset (see :func:`vitexplain.datasets.base.choose_indices`).

    Example bench config::

        dataset:
          name: folder
          options: {images: my_photos/images, masks: my_photos/masks, labels: subfolders,
                    boxes: my_photos/boxes.csv}
    """

    splits = ("all",)

    def __init__(self, images: str | Path | None = None, split: str = "all", *, masks: str | Path | None = None,
                 labels: str | Path | None = None, boxes: str | Path | None = None,
                 class_names: Sequence[str] | str | None = None, preprocess: Preprocess | dict | None = None,
                 n: int | None = None, seed: int = 0, indices: Sequence[int] | str | Path | None = None):
        self.check_split(split)
        if images is None:
            raise ValueError(f"dataset 'folder' needs the option images (the folder of image files)\n"
                             f"expected layout:\n{LAYOUT}")
        self.root = require(Path(images).expanduser(), LAYOUT, "images folder", directory=True)
        mask_dir = None if masks is None else require(Path(masks).expanduser(), LAYOUT, "masks folder",
                                                      directory=True)
        self.files = _files(self.root, skip=mask_dir)
        if not self.files:
            raise DatasetNotFoundError(self.root, LAYOUT, f"image files ({' '.join(IMAGE_SUFFIXES)})")
        self.preprocess = resolve_preprocess(preprocess, Preprocess())
        names = _Names(self.files)
        given = self._class_names(class_names, preprocess)
        self.labels, self.classes = self._labels(labels, names, given)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.masks = None if mask_dir is None else self._pair_masks(mask_dir, names)
        self.boxes = None if boxes is None else self._read_boxes(Path(boxes).expanduser(), names)
        self.provides = tuple(name for name, held in (("masks", self.masks), ("boxes", self.boxes))
                              if held is not None)
        super().__init__(len(self.files), n, seed, indices)

    # ------------------------------------------------------------------------------------ pairing

    @staticmethod
    def _class_names(class_names: Sequence[str] | str | None, preprocess: Any) -> list[str] | None:
        if class_names is None:
            return None
        if isinstance(class_names, str):
            if class_names != "model":
                raise ValueError(f"class_names must be a list of names, 'model' or None, got {class_names!r}")
            found = preprocess.get("class_names") if isinstance(preprocess, dict) else None
            if not found:
                raise ValueError("class_names: model needs the model's class names in the preprocess config "
                                 "(a model with a card, e.g. digits_vit); give the names as a list instead")
            class_names = found
        names = [str(name) for name in class_names]
        if len(set(names)) != len(names):
            repeated = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"class_names has repeated names: {_some(repeated)}")
        return names

    def _labels(self, labels: str | Path | None, names: _Names,
                given: list[str] | None) -> tuple[list[int], list[str]]:
        """Each image's label and the class names (index = label)."""
        if labels is None:
            return [-1] * len(self.files), given or []
        if str(labels) == SUBFOLDERS:
            flat = [name for name in self.files if "/" not in name]
            if flat:
                raise DatasetFormatError(self.root, f"labels: subfolders, but {_counted(len(flat), 'image', 'images')} "
                                         f"lie directly in it, in no class subfolder ({_some(flat)})", LAYOUT)
            found = [name.split("/", 1)[0] for name in self.files]
            return self._indices(found, given, self.root, "subfolder")
        path = require(Path(labels).expanduser(), LAYOUT, "labels file")
        table = self._read_label_csv(path, names)
        texts = [table[index] for index in range(len(self.files))]
        if all(_integer(text) is not None for text in texts):
            numbers = [int(text) for text in texts]
            limit = len(given) if given else None
            bad = [f"{self.files[i]}: {v}" for i, v in enumerate(numbers) if v < -1 or (limit and v >= limit)]
            if bad:
                allowed = f"[-1, {limit - 1}] (class_names has {limit})" if limit else ">= -1 (-1: unknown)"
                raise DatasetFormatError(path, f"{_counted(len(bad), 'image has a label', 'images have labels')} "
                                         f"outside {allowed} ({_some(bad)})", LAYOUT)
            return numbers, given or []
        return self._indices(texts, given, path, "label")

    def _indices(self, found: list[str], given: list[str] | None, source: Path,
                 what: str) -> tuple[list[int], list[str]]:
        classes = given if given is not None else sorted(set(found))
        lookup = {name: index for index, name in enumerate(classes)}
        unknown = sorted({name for name in found if name not in lookup})
        if unknown:
            raise DatasetFormatError(source, f"{_counted(len(unknown), what, what + 's')} not among class_names "
                                     f"({_some(unknown)})", LAYOUT)
        return [lookup[name] for name in found], list(classes)

    def _read_label_csv(self, path: Path, names: _Names) -> dict[int, str]:
        rows = self._read_csv(path, ("file", "label"), ())
        table: dict[int, str] = {}
        problems = self._rows_to_images(rows, names)
        clashes = []
        for row, matched in rows:
            index = matched[0] if len(matched) == 1 else None
            if index is None:
                continue
            label = row["label"].strip()
            if not label:
                clashes.append(row["where"])
            elif index in table and table[index] != label:
                clashes.append(self.files[index])
            else:
                table[index] = label
        problems += _problem(clashes, "row has an empty or second, different label",
                             "rows have empty or second, different labels")
        missing = [name for index, name in enumerate(self.files) if index not in table]
        problems += _problem(missing, "image has no label", "images have no label")
        if problems:
            raise DatasetFormatError(path, "; ".join(problems), LAYOUT)
        return table

    def _read_csv(self, path: Path, needed: tuple[str, ...],
                  optional: tuple[str, ...]) -> list[tuple[dict[str, str], list[int]]]:
        """Rows (with ``where``: their line) of a CSV whose header has ``needed`` (and maybe ``optional``) columns."""
        try:
            with open(path, newline="", encoding="utf-8-sig") as handle:
                reader = csv.DictReader(handle)
                header = [name.strip() for name in reader.fieldnames or []]
                reader.fieldnames = header
                missing = [name for name in needed if name not in header]
                if missing:
                    raise DatasetFormatError(path, f"header must be {','.join(needed)}"
                                             f"{''.join(f'[,{o}]' for o in optional)}, got {','.join(header)}",
                                             LAYOUT)
                rows = []
                for row in reader:
                    if not any((value or "").strip() for value in row.values() if isinstance(value, str)):
                        continue
                    cells = {name: (row.get(name) or "") for name in (*needed, *optional)}
                    rows.append(({**cells, "where": f"line {reader.line_num}"}, []))
        except (UnicodeDecodeError, csv.Error) as error:
            raise DatasetFormatError(path, f"is not a UTF-8 CSV file ({error})", LAYOUT) from None
        return rows

    def _rows_to_images(self, rows: list[tuple[dict[str, str], list[int]]], names: _Names) -> list[str]:
        """Match each row's ``file`` to the images (in place); the problems: rows naming none or several."""
        unknown, several = [], []
        for row, matched in rows:
            matched.extend(names.find(row["file"]))
            if not matched:
                unknown.append(row["file"].strip() or row["where"])
            elif len(matched) > 1:
                several.append(row["file"].strip())
        return (_problem(sorted(set(unknown)), "row names no image", "rows name no image")
                + _problem(sorted(set(several)), "row names several images (give the relative path)",
                           "rows name several images (give the relative paths)"))

    def _pair_masks(self, folder: Path, names: _Names) -> list[Path]:
        """The mask of every image, or one error naming what does not pair."""
        masks = _files(folder)
        paired: dict[int, list[str]] = defaultdict(list)
        orphans, several = [], []
        for mask in masks:
            matched = names.find(PurePosixPath(mask).with_suffix("").as_posix())
            if not matched:
                orphans.append(mask)
            elif len(matched) > 1:
                several.append(mask)
            else:
                paired[matched[0]].append(mask)
        missing = [name for index, name in enumerate(self.files) if index not in paired]
        doubled = [name for index, name in enumerate(self.files) if len(paired.get(index, ())) > 1]
        problems = (_problem(missing, "image has no mask", "images have no mask")
                    + _problem(orphans, "mask matches no image", "masks match no image")
                    + _problem(several, "mask matches several images", "masks match several images")
                    + _problem(doubled, "image has several masks", "images have several masks"))
        if problems:
            raise DatasetFormatError(folder, "; ".join(problems), LAYOUT)
        return [folder / paired[index][0] for index in range(len(self.files))]

    def _read_boxes(self, path: Path, names: _Names) -> list[np.ndarray]:
        """Every image's boxes [k, 4] in original pixels (those of its label, when both are known)."""
        path = require(path, LAYOUT, "boxes file")
        if path.suffix.lower() == ".json":
            rows = self._read_box_json(path)
        elif path.suffix.lower() == ".csv":
            rows = self._read_csv(path, ("file", "x0", "y0", "x1", "y1"), ("label",))
        else:
            raise DatasetFormatError(path, "boxes must be a .csv or .json file", LAYOUT)
        problems = self._rows_to_images(rows, names)
        found: dict[int, list[list[float]]] = defaultdict(list)
        malformed, unknown_classes, other = [], set(), set()
        for row, matched in rows:
            box = self._box(row)
            if box is None:
                malformed.append(f"{row['file'].strip()} ({row['where']})")
                continue
            if len(matched) != 1:
                continue
            index = matched[0]
            label = self._box_label(row.get("label", "").strip(), unknown_classes) if self.labels[index] >= 0 else None
            if label is not None and label != self.labels[index]:
                other.add(index)
                continue
            found[index].append(box)
        problems += _problem(malformed, "box is not 4 finite numbers with x0 < x1, y0 < y1",
                             "boxes are not 4 finite numbers with x0 < x1, y0 < y1")
        problems += _problem(sorted(unknown_classes), "box label is no class of the dataset",
                             "box labels are no classes of the dataset")
        missing = [name for index, name in enumerate(self.files) if index not in found and index not in other]
        problems += _problem(missing, "image has no box", "images have no box")
        unlabelled = [name for index, name in enumerate(self.files) if index not in found and index in other]
        problems += _problem(unlabelled, "image has no box of its label", "images have no box of their label")
        if problems:
            raise DatasetFormatError(path, "; ".join(problems), LAYOUT)
        return [np.asarray(found[index], dtype=np.float32).reshape(-1, 4) for index in range(len(self.files))]

    @staticmethod
    def _read_box_json(path: Path) -> list[tuple[dict[str, str], list[int]]]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DatasetFormatError(path, f"is not a JSON file ({error})", LAYOUT) from None
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise DatasetFormatError(path, 'must map each file to a list of boxes: {"x.jpg": [[x0, y0, x1, y1]]}',
                                     LAYOUT)
        rows = []
        for file, boxes in data.items():
            for number, box in enumerate(boxes, start=1):
                values = box if isinstance(box, list) and len(box) == 4 else [None] * 4
                corners = {key: "" if isinstance(value, bool) else str(value)
                           for key, value in zip(("x0", "y0", "x1", "y1"), values)}
                rows.append(({"file": file, **corners, "where": f"box {number}"}, []))
        return rows

    @staticmethod
    def _box(row: dict[str, str]) -> list[float] | None:
        try:
            box = [float(row[key]) for key in ("x0", "y0", "x1", "y1")]
        except ValueError:
            return None
        if not all(math.isfinite(v) for v in box) or box[2] <= box[0] or box[3] <= box[1]:
            return None
        return box

    def _box_label(self, text: str, unknown: set[str]) -> int | None:
        """A box row's class index: None without one; an integer as written; a name through the classes."""
        if not text:
            return None
        if _integer(text) is not None:
            return int(text)
        if text not in self.class_to_idx:
            unknown.add(text)
            return None
        return self.class_to_idx[text]

    # ------------------------------------------------------------------------------------ samples

    def identity(self, index: int) -> str:
        """``"<relative path>#<digest>"`` of served item ``index``, from the bytes of its image and mask files, its
        label and boxes: what the bench's cache is keyed by (no image decoded)."""
        item = int(self.indices[index])
        name = self.files[item]
        parts = [(self.root / name).read_bytes(), self.labels[item]]
        if self.masks is not None:
            parts.append(self.masks[item].read_bytes())
        if self.boxes is not None:
            parts.append(self.boxes[item])
        return f"{name}#{content_digest(*parts)}"

    def load(self, item: int) -> dict[str, Any]:
        name = self.files[item]
        image = load_image(self.root / name)
        geometry = self.preprocess.geometry(*image.size)
        sample = {"image": self.preprocess.image(image, geometry), "label": self.labels[item], "id": name}
        if self.masks is not None:
            path = self.masks[item]
            foreground = _foreground(path)
            if foreground.shape != (image.height, image.width):
                raise DatasetFormatError(path, f"is {foreground.shape[1]} x {foreground.shape[0]} pixels, its image "
                                         f"{name} {image.width} x {image.height}: a mask must have its image's size")
            sample["mask"] = self.preprocess.mask(foreground, geometry)
        if self.boxes is not None:
            sample["boxes"] = self.preprocess.boxes(self.boxes[item], geometry)
        return sample
