"""Images as they come in: files of any mode (vitexplain.image_files), explained batch by batch
(vitexplain.file_explanations), and non-finite tensors (vitexplain.explain)."""
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import vitexplain
from vitexplain.image_files import ImageLoadError, load_image

from conftest import make_vit


def png_header_only(width: int, height: int) -> bytes:
    """A 60-byte PNG whose header declares ``width`` x ``height`` pixels (PIL checks the size when opening)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def write_every_mode(folder) -> list[str]:
    """Small random images in RGB, grayscale (JPEG), RGBA, palette and 16-bit modes; their file names."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(folder / "rgb.png")
    Image.fromarray(rng.integers(0, 256, (30, 30), dtype=np.uint8), mode="L").save(folder / "gray.jpg")
    Image.fromarray(rng.integers(0, 256, (36, 36, 4), dtype=np.uint8), mode="RGBA").save(folder / "rgba.png")
    Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8), mode="L").convert("P").save(folder / "palette.png")
    Image.fromarray(rng.integers(0, 65536, (33, 31), dtype=np.uint16)).save(folder / "deep.png")
    return ["rgb.png", "gray.jpg", "rgba.png", "palette.png", "deep.png"]


def test_all_image_modes_load_and_a_non_image_is_named(tmp_path):
    (tmp_path / "notes.png").write_text("this is not an image")
    for name in write_every_mode(tmp_path):
        assert load_image(tmp_path / name).mode == "RGB"
    deep = np.asarray(load_image(tmp_path / "deep.png"))
    assert deep.max() > 128  # 16-bit values are rescaled, not clipped to white
    with pytest.raises(ImageLoadError, match="notes.png: not a readable image"):
        load_image(tmp_path / "notes.png")
    with pytest.raises(ImageLoadError, match="missing.png: no such file"):
        load_image(tmp_path / "missing.png")


def test_decompression_bombs_are_refused_and_large_images_load_quietly(tmp_path, recwarn):
    (tmp_path / "big.png").write_bytes(png_header_only(14000, 13000))  # 182 megapixels declared, 60 bytes
    with pytest.raises(ImageLoadError, match=r"big\.png: too large to open safely \(Image size \(182000000 pixels\)"):
        load_image(tmp_path / "big.png")
    limit = Image.MAX_IMAGE_PIXELS
    Image.new("RGB", (20, 10)).save(tmp_path / "over_limit.png")
    try:
        Image.MAX_IMAGE_PIXELS = 150  # 200 pixels: over the warning limit, under twice it
        assert load_image(tmp_path / "over_limit.png").size == (20, 10)
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_images_with_non_finite_pixels_are_refused(tmp_path, bad):
    values = np.ones((4, 5), dtype=np.float32)
    values[2, 3] = bad
    Image.fromarray(values).save(tmp_path / "float.tif")
    with pytest.raises(ImageLoadError, match=r"float\.tif: has NaN or infinite pixel values"):
        load_image(tmp_path / "float.tif")
    values[2, 3] = 0.5
    Image.fromarray(values).save(tmp_path / "finite.tif")
    assert load_image(tmp_path / "finite.tif").mode == "RGB"


@pytest.mark.parametrize("method", ["gae", "lrp"])
def test_explain_refuses_non_finite_images_naming_them(images, method):
    model = make_vit()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    images = images.clone()
    images[1, 0, 3, 4] = float("nan")
    images[3, 2, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or infinite values in the batch's image\(s\) 1, 3 \(counted from 0\)"):
        vitexplain.explain(model, images, method)
    assert not model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_explain_files_is_explain_on_the_preprocessed_files_and_loses_nothing_to_a_bad_one(tmp_path):
    """The library function behind `vitexplain explain`: maps equal to explain() of the same preprocessed
    batch, the class asked for or the prediction, an unreadable file told to on_error and the others kept."""
    from vitexplain.file_explanations import explain_files
    from vitexplain.image_files import load_image, make_transform

    model = make_vit(img_size=32, patch_size=8)
    config = {"input_size": (3, 32, 32), "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "crop_pct": 1.0,
              "interpolation": "bilinear"}
    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        files.append(str(tmp_path / f"img{i}.png"))
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(files[-1])
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    errors, steps = [], []
    found = list(explain_files(model, [files[0], str(broken), files[1], files[2]], ["gae", "rollout"], config=config,
                               batch_size=2, on_error=errors.append,
                               on_progress=lambda images, method: steps.append((images, method))))
    assert [item.name for item in found] == files and len(errors) == 1 and "broken.png" in errors[0]
    assert sum(images for images, _ in steps) == 4 * 2                     # every file, every method
    transform = make_transform(config)
    batch = torch.stack([transform(load_image(name)) for name in files])
    predicted = model(batch).argmax(-1)
    for method in ("gae", "rollout"):
        expected = vitexplain.explain(model, batch, method, target=predicted)
        torch.testing.assert_close(torch.stack([item.maps[method] for item in found]), expected)
    assert [item.target for item in found] == predicted.tolist() == [item.predicted for item in found]
    asked = list(explain_files(model, files[:1], ["gae"], config=config, target=3))
    assert asked[0].target == 3
    torch.testing.assert_close(asked[0].maps["gae"], vitexplain.explain(model, batch[:1], "gae", target=3)[0])
