"""ImageNet-Segmentation (Guillaumin et al., IJCV 2014): 4,276 ImageNet images with foreground masks."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .base import DatasetFormatError, DictDataset, register_dataset, require
from .preprocess import Preprocess, resolve_preprocess

FILE_NAME = "gtsegs_ijcv.mat"
LAYOUT = f"""\
  root/{FILE_NAME} (or root is that file): a MATLAB v7.3 (HDF5) file whose struct 'value' holds
    value/img  [N, 1] object references, each to a uint8 image stored [3, W, H] (MATLAB H x W x 3)
    value/gt   [N, 1] object references, each to a 1 x 1 cell whose reference points to the
               foreground mask stored [W, H] (MATLAB H x W, nonzero = object)"""


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("reading ImageNet-Segmentation (gtsegs_ijcv.mat, MATLAB v7.3 / HDF5) needs h5py: "
                          "pip install h5py") from None
    return h5py


@register_dataset("imagenet_seg")
class ImageNetSegmentation(DictDataset):
    """ImageNet-Segmentation, the segmentation test of TokenTM (Table 1) and GradToken (Table 1).

    Reads ``gtsegs_ijcv.mat`` as Chefer et al.'s loader (hila-chefer/Transformer-Explainability,
    ``data/imagenet.py``) does: image ``i`` is ``f[f["value/img"][i, 0]]`` transposed to H x W x 3,
    its mask ``f[f[f["value/gt"][i, 0]][0, 0]]`` transposed to H x W. Labels are unknown (-1): the
    protocol explains the predicted class. The default preprocessing follows that evaluation code
    (``Resize((224, 224))``, no crop): ``crop_mode="squash"``, ``crop_pct=1``; pass the model's own
    ``preprocess`` to change it. Samples: ``image``, ``label`` (-1), ``id``, ``mask`` (bool).

    Args:
        root: the directory holding ``gtsegs_ijcv.mat``, or the file itself.
        split: ``"test"`` (the file is one evaluation set).
        preprocess: a :class:`Preprocess` or timm data config.
        n, seed, indices: serve a subset (see :func:`vitexplain.datasets.base.choose_indices`).
    """

    splits = ("test",)
    provides = ("masks",)

    def __init__(self, root: str | Path, split: str = "test", *, preprocess: Preprocess | dict | None = None,
                 n: int | None = None, seed: int = 0, indices: Sequence[int] | str | Path | None = None):
        self.check_split(split)
        root = Path(root)
        self.path = require(root if root.suffix == ".mat" else root / FILE_NAME, LAYOUT, "ImageNet-Segmentation file")
        self.preprocess = resolve_preprocess(preprocess, Preprocess(crop_mode="squash", crop_pct=1.0))
        h5py = _h5py()
        try:
            with h5py.File(self.path, "r") as handle:
                counts = {key: handle[f"value/{key}"].shape for key in ("img", "gt")}
        except OSError as error:
            raise DatasetFormatError(self.path, f"not an HDF5 (MATLAB v7.3) file ({error})", LAYOUT) from None
        except KeyError as error:
            raise DatasetFormatError(self.path, f"lacks value/img or value/gt ({error})", LAYOUT) from None
        if len(counts["img"]) != 2 or counts["img"] != counts["gt"] or counts["img"][1] != 1:
            raise DatasetFormatError(self.path, f"value/img and value/gt must both be [N, 1], got {counts}", LAYOUT)
        super().__init__(counts["img"][0], n, seed, indices)

    def _read(self, item: int) -> tuple[np.ndarray, np.ndarray]:
        h5py = _h5py()
        with h5py.File(self.path, "r") as handle:
            try:
                image = np.asarray(handle[handle["value/img"][item, 0]]).T
                mask = np.asarray(handle[handle[handle["value/gt"][item, 0]][0, 0]]).T
            except (TypeError, ValueError, KeyError) as error:
                raise DatasetFormatError(self.path, f"entry {item}: value/img or value/gt is not an object "
                                         f"reference as MATLAB v7.3 writes cells ({error})", LAYOUT) from None
        if image.ndim == 3 and image.shape[2] == 1:
            image = image[:, :, 0]
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3) or mask.shape != image.shape[:2]:
            raise DatasetFormatError(self.path, f"entry {item}: image {image.shape} and mask {mask.shape} must be "
                                     "H x W x 3 (or H x W) and H x W", LAYOUT)
        return image, mask

    def load(self, item: int) -> dict[str, Any]:
        image, mask = self._read(item)
        pixels = Image.fromarray(image.astype(np.uint8)).convert("RGB")
        tensor, moved, _ = self.preprocess(pixels, mask=mask != 0)
        return {"image": tensor, "label": -1, "id": f"gtsegs_ijcv_{item:04d}", "mask": moved}
