"""Resize, centre-crop and normalise an image, and move its masks and boxes the same way."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_MODES = ("center", "squash")
INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class Geometry:
    """Where an image of the source size lands: resized to ``resized`` (w, h), then cropped at ``offset``
    (left, top)."""

    source: tuple[int, int]
    resized: tuple[int, int]
    offset: tuple[int, int]
    size: tuple[int, int]

    def crop_box(self) -> tuple[int, int, int, int]:
        left, top = self.offset
        return left, top, left + self.size[1], top + self.size[0]


@dataclass(frozen=True)
class Preprocess:
    """The evaluation transform of timm (``transforms_imagenet_eval``), applied to images, masks and boxes.

    Image: resize (``crop_mode="center"``: the shorter side to ``floor(size / crop_pct)`` keeping the
    aspect ratio; ``"squash"``: both sides to ``floor(size / crop_pct)``), centre crop to ``size``,
    scale to [0, 1], normalise with ``mean`` / ``std``. Masks go through the same resize (nearest)
    and crop; boxes are scaled and shifted the same way, clipped to the image, and boxes left empty
    are dropped. Same arithmetic as timm/torchvision on PIL images (shorter side truncated, crop
    offsets rounded half to even), so the images equal ``timm.data.create_transform``'s.

    With ``antialias=False`` the image is normalised first and the float image resized with torch's
    ``interpolate`` (``align_corners=False``, no antialiasing), which equals OpenCV's ``INTER_LINEAR``
    on float images: the TIS authors' albumentations pipeline (``Normalize``, then ``Resize``, then
    ``CenterCrop``), instead of PIL's antialiased resize of the 8-bit image.

    Attributes:
        size: output (height, width); an int means a square.
        mean, std: per-channel normalisation.
        interpolation: PIL resampling of the image (nearest, bilinear, bicubic, lanczos, box, hamming);
            with ``antialias=False`` only ``"bilinear"``.
        crop_pct: fraction of the resized image kept by the centre crop, in (0, 1].
        crop_mode: ``"center"`` or ``"squash"`` (timm's ``"border"`` is not supported).
        antialias: True: PIL's resize of the 8-bit image (antialiased when shrinking), as timm and
            torchvision; False: bilinear resize of the normalised float image without antialiasing.
    """

    size: tuple[int, int] | int = (224, 224)
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    crop_mode: str = "center"
    antialias: bool = True

    def __post_init__(self) -> None:
        size = (self.size, self.size) if isinstance(self.size, int) else tuple(self.size)
        if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
            raise ValueError(f"size must be a positive int or (height, width), got {self.size!r}")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std positive; got {self.mean}, {self.std}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {sorted(INTERPOLATIONS)}, got {self.interpolation!r}")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {CROP_MODES}, got {self.crop_mode!r}")
        if not self.antialias and self.interpolation != "bilinear":
            raise ValueError(f"antialias=False resizes bilinearly (OpenCV's INTER_LINEAR); got interpolation "
                             f"{self.interpolation!r}")

    @classmethod
    def from_data_config(cls, config: dict[str, Any], **overrides) -> Preprocess:
        """From a timm data config (:func:`vitexplain.models.data_config`, as
        :func:`~vitexplain.models.load_model` returns it)."""
        fields = dict(size=tuple(config["input_size"][-2:]), mean=config.get("mean", IMAGENET_MEAN),
                      std=config.get("std", IMAGENET_STD), interpolation=config.get("interpolation", "bicubic"),
                      crop_pct=config.get("crop_pct") or 0.875, crop_mode=config.get("crop_mode") or "center")
        return cls(**{**fields, **overrides})

    @classmethod
    def from_model(cls, model: torch.nn.Module, **overrides) -> Preprocess:
        """From a model's data config (:func:`vitexplain.models.data_config`: timm's, at the size the model was
        built at)."""
        from ..models import data_config

        return cls.from_data_config(data_config(model), **overrides)

    def geometry(self, width: int, height: int) -> Geometry:
        """Resized size and crop offset for a ``width`` x ``height`` source image."""
        out_h, out_w = self.size
        scale_h, scale_w = math.floor(out_h / self.crop_pct), math.floor(out_w / self.crop_pct)
        if self.crop_mode == "squash":
            resized = (scale_w, scale_h)
        elif scale_h == scale_w:  # torchvision Resize(int): shorter side to scale, longer side truncated
            short, long = sorted((width, height))
            other = int(scale_h * long / short)
            resized = (scale_w, other) if width <= height else (other, scale_h)
        else:  # timm ResizeKeepRatio: the side that needs the least shrinking fits its target
            ratio = min(width / scale_w, height / scale_h)
            resized = (round(width / ratio), round(height / ratio))
        offset = (int(round((resized[0] - out_w) / 2.0)), int(round((resized[1] - out_h) / 2.0)))
        return Geometry((width, height), resized, offset, self.size)

    def image(self, image: Image.Image, geometry: Geometry | None = None) -> Tensor:
        """The normalised float image [3, H, W] of an RGB PIL image."""
        geometry = geometry or self.geometry(*image.size)
        mean, std = torch.tensor(self.mean).view(3, 1, 1), torch.tensor(self.std).view(3, 1, 1)
        rgb = image.convert("RGB")
        if self.antialias:
            pixels = rgb.resize(geometry.resized, INTERPOLATIONS[self.interpolation]).crop(geometry.crop_box())
            return (_float_pixels(pixels) - mean) / std
        width, height = geometry.resized
        resized = F.interpolate(((_float_pixels(rgb) - mean) / std)[None], size=(height, width), mode="bilinear",
                                align_corners=False, antialias=False)[0]
        left, top, right, bottom = geometry.crop_box()
        return resized[:, top:bottom, left:right]

    def mask(self, mask: np.ndarray, geometry: Geometry) -> Tensor:
        """A label or boolean mask [h, w] of the source image, resized (nearest) and cropped like it."""
        if mask.shape != geometry.source[::-1]:
            raise ValueError(f"mask of shape {mask.shape} does not match the image size {geometry.source[::-1]}")
        values = Image.fromarray(mask.astype(np.uint8))
        moved = np.asarray(values.resize(geometry.resized, Image.Resampling.NEAREST).crop(geometry.crop_box()))
        return torch.from_numpy(moved.astype(mask.dtype, copy=True))

    @staticmethod
    def boxes(boxes: np.ndarray | Tensor, geometry: Geometry) -> Tensor:
        """Boxes [k, 4] xyxy in source pixels -> output pixels; clipped, and empty ones dropped."""
        boxes = torch.as_tensor(np.asarray(boxes, dtype=np.float32)).reshape(-1, 4)
        (src_w, src_h), (res_w, res_h), (left, top) = geometry.source, geometry.resized, geometry.offset
        scale = torch.tensor([res_w / src_w, res_h / src_h] * 2)
        shift = torch.tensor([left, top] * 2, dtype=torch.float32)
        limit = torch.tensor([geometry.size[1], geometry.size[0]] * 2, dtype=torch.float32)
        moved = torch.minimum((boxes * scale - shift).clamp(min=0), limit)
        keep = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
        return moved[keep]

    def __call__(self, image: Image.Image, mask: np.ndarray | None = None,
                 boxes: np.ndarray | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(image [3, H, W], mask [H, W] or None, boxes [k, 4] or None) of one source image."""
        geometry = self.geometry(*image.size)
        return (self.image(image, geometry), None if mask is None else self.mask(mask, geometry),
                None if boxes is None else self.boxes(boxes, geometry))


def _float_pixels(image: Image.Image) -> Tensor:
    """An RGB PIL image as floats in [0, 1], [3, H, W]."""
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)


def resolve_preprocess(preprocess: Preprocess | dict | None, default: Preprocess) -> Preprocess:
    """A :class:`Preprocess` from ``None`` (the dataset's default), a Preprocess, or a timm data config."""
    if preprocess is None:
        return default
    if isinstance(preprocess, Preprocess):
        return preprocess
    if isinstance(preprocess, dict):
        return Preprocess.from_data_config(preprocess)
    raise TypeError("preprocess must be a Preprocess, a timm data config dict or None, "
                    f"got {type(preprocess).__name__}")
