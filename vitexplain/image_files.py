"""Reading image files of any common mode into RGB and preprocessing them for a model, one at a time (the dataset
loaders) or batch by batch (:func:`read_batches`, which :mod:`vitexplain.file_explanations` explains)."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError


class ImageLoadError(ValueError):
    """A file could not be read as an image."""


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB view of any PIL mode: 16-bit and float images are rescaled, transparency goes over white."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(values.max(), 1.0)
        gray = np.clip(values / top * 255.0, 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if image.mode == "P" or image.mode in ("LA", "PA"):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def load_image(path: str | Path) -> Image.Image:
    """Open an image file as RGB; anything that is not an image raises :class:`ImageLoadError` naming the file.

    Images over PIL's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS`` x 2, 179 megapixels by
    default) are refused, not loaded; those between the limit and twice it are loaded without
    PIL's warning. Float images holding NaN or infinite values are refused.
    """
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                if image.mode == "F" and not np.isfinite(np.asarray(image)).all():
                    raise ImageLoadError(f"{path}: has NaN or infinite pixel values")
                return _to_rgb(image)
    except ImageLoadError:
        raise
    except FileNotFoundError:
        raise ImageLoadError(f"{path}: no such file") from None
    except Image.DecompressionBombError as error:
        raise ImageLoadError(f"{path}: too large to open safely ({error}); downscale it first") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ImageLoadError(f"{path}: not a readable image ({error})") from None


def make_transform(config: dict):
    """The evaluation transform of a timm data config (resize, centre crop, normalise)."""
    from timm.data import create_transform

    keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
    return create_transform(**{key: config[key] for key in keys if key in config}, is_training=False)


def display_image(image: Image.Image, config: dict) -> np.ndarray:
    """The image as the model sees it (same resize and crop), without normalisation, as uint8 [H, W, 3]."""
    from timm.data import create_transform

    keys = ("input_size", "interpolation", "crop_pct", "crop_mode")
    transform = create_transform(**{key: config[key] for key in keys if key in config}, is_training=False,
                                 mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    tensor: torch.Tensor = transform(image)
    return (tensor.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


@dataclass
class ImageBatch:
    """One batch of image files, read: the files as given, the preprocessed images on the model's device
    [B, 3, H, W], and each image as the model sees it (uint8 [H, W, 3], for drawing)."""

    names: list[str]
    images: torch.Tensor
    shown: list[np.ndarray]


def read_batches(files: Sequence[str | Path], config: dict, batch_size: int, device: torch.device | str,
                 on_error: Callable[[str], None]) -> Iterator[tuple[int, ImageBatch | None]]:
    """The files, ``batch_size`` at a time and read only then (memory follows the batch size), as (number of
    files taken, the batch of those that could be read, or None); an unreadable file goes to ``on_error``."""
    transform = make_transform(config)
    for start in range(0, len(files), batch_size):
        chunk = [str(path) for path in files[start:start + batch_size]]
        names, tensors, shown = [], [], []
        for name in chunk:
            try:
                picture = load_image(name)
            except ImageLoadError as error:
                on_error(str(error))
                continue
            names.append(name)
            tensors.append(transform(picture))
            shown.append(display_image(picture, config))
        yield len(chunk), (ImageBatch(names, torch.stack(tensors).to(device), shown) if names else None)
