"""Preprocessing, batching, the dataset registry and subsets."""
from __future__ import annotations

import dataclasses

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from vitexplain.datasets import Preprocess, available_datasets, choose_indices, collate, get_dataset
from vitexplain.reproduce.data import preprocess_for

from conftest import make_vit


def random_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("width,height", [(50, 40), (37, 61), (32, 32)])
@pytest.mark.parametrize("mode,size,crop_pct", [("center", 32, 0.875), ("squash", 32, 0.9), ("center", (24, 40), 0.8)])
def test_images_equal_timm_eval_transform(width, height, mode, size, crop_pct):
    image = random_image(width, height)
    ours = Preprocess(size=size, crop_pct=crop_pct, crop_mode=mode, interpolation="bilinear")(image)[0]
    input_size = (3, size, size) if isinstance(size, int) else (3, *size)
    timm_transform = create_transform(input_size=input_size, interpolation="bilinear", crop_pct=crop_pct,
                                      crop_mode=mode, is_training=False)
    reference = timm_transform(image)
    assert ours.shape == reference.shape
    assert torch.allclose(ours, reference, atol=1e-6)


@pytest.mark.parametrize("mode", ["center", "squash"])
def test_masks_follow_the_image_geometry(mode):
    # a bright rectangle and its mask go through the same resize (nearest for both here) and crop
    pixels = np.zeros((45, 70), dtype=np.uint8)
    pixels[10:30, 20:61] = 255
    image = Image.fromarray(pixels).convert("RGB")
    preprocess = Preprocess(size=24, crop_pct=0.8, crop_mode=mode, interpolation="nearest", mean=(0, 0, 0),
                            std=(1, 1, 1))
    moved_image, moved_mask, _ = preprocess(image, mask=pixels > 0)
    assert moved_mask.dtype == torch.bool and moved_mask.shape == (24, 24)
    assert torch.equal(moved_mask, moved_image[0] > 0.5)
    assert moved_mask.any() and not moved_mask.all()


def test_boxes_scaled_shifted_clipped_and_dropped():
    # 80 x 60 image, size 32, crop_pct 0.8 -> shorter side 40, longer int(40 * 80 / 60) = 53;
    # crop offsets round((53 - 32) / 2) = 10 (half to even) and round((40 - 32) / 2) = 4
    preprocess = Preprocess(size=32, crop_pct=0.8)
    geometry = preprocess.geometry(80, 60)
    assert geometry.resized == (53, 40) and geometry.offset == (10, 4)
    boxes = np.array([[10, 6, 70, 36], [30, 30, 45, 45], [0, 0, 5, 5]], dtype=np.float32)
    moved = Preprocess.boxes(boxes, geometry)
    sx, sy = 53 / 80, 40 / 60
    expected = torch.tensor([
        [0.0, 6 * sy - 4, 32.0, 36 * sy - 4],                     # x clipped on both sides
        [30 * sx - 10, 30 * sy - 4, 45 * sx - 10, 45 * sy - 4],  # inside
    ])                                                           # the third box falls off the crop
    assert torch.allclose(moved, expected, atol=1e-5)


def test_boxes_match_the_moved_mask():
    mask = np.zeros((61, 37), dtype=bool)
    mask[5:50, 12:30] = True
    preprocess = Preprocess(size=32, crop_pct=0.875)
    _, moved_mask, moved_boxes = preprocess(random_image(37, 61), mask=mask, boxes=np.array([[12, 5, 30, 50]]))
    rows, cols = moved_mask.any(1).nonzero().flatten(), moved_mask.any(0).nonzero().flatten()
    tight = torch.tensor([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=torch.float32)
    assert (moved_boxes[0] - tight).abs().max() <= 1.0


def test_preprocess_from_data_config_and_model():
    config = {"input_size": (3, 32, 48), "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.25,) * 3,
              "crop_pct": 0.9, "crop_mode": "squash"}
    assert Preprocess.from_data_config(config) == Preprocess(size=(32, 48), mean=(0.5,) * 3, std=(0.25,) * 3,
                                                             interpolation="bilinear", crop_pct=0.9, crop_mode="squash")
    assert Preprocess.from_data_config(config, crop_pct=1.0).crop_pct == 1.0
    model = make_vit()
    model.pretrained_cfg = {"input_size": (3, 32, 32), "interpolation": "bilinear", "crop_pct": 1.0,
                            "mean": (0.5,) * 3, "std": (0.5,) * 3}
    built = Preprocess.from_model(model)
    assert (built.size, built.crop_pct, built.interpolation, built.mean) == ((32, 32), 1.0, "bilinear", (0.5,) * 3)


def albumentations_tis(image: Image.Image, size: int, resize: int) -> torch.Tensor:
    """The TIS authors' transform written out with OpenCV: albumentations' Normalize (ImageNet, of the 8-bit
    image), Resize(resize, resize) with cv2.INTER_LINEAR on the float image, CenterCrop(size)."""
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255
    normalised = (np.asarray(image.convert("RGB")).astype(np.float32) - mean) * np.reciprocal(std)
    resized = cv2.resize(normalised, (resize, resize), interpolation=cv2.INTER_LINEAR)
    top = (resize - size) // 2
    return torch.from_numpy(np.ascontiguousarray(resized[top:top + size, top:top + size])).permute(2, 0, 1)


@pytest.mark.parametrize("width,height,size", [(300, 200, 56), (61, 97, 56), (40, 40, 56), (500, 375, 224)])
def test_tis_preprocessing_equals_the_authors_albumentations_transform(width, height, size):
    image = random_image(width, height, seed=width)
    tis = preprocess_for("tis", {"input_size": (3, size, size), "mean": (0.5,) * 3, "std": (0.5,) * 3}, "")
    ours = tis(image)[0]
    reference = albumentations_tis(image, size, size * 256 // 224)
    assert ours.shape == reference.shape == (3, size, size)
    # float32 cv2 computes the sampling positions in single precision: a few 1e-4 at most
    assert torch.allclose(ours, reference, atol=1e-3)
    antialiased = dataclasses.replace(tis, antialias=True)(image)[0]     # PIL's resize of the 8-bit image
    assert (antialiased - reference).abs().max() > 0.01                   # at least its rounding to 8 bits


@pytest.mark.parametrize("bad", [dict(crop_mode="border"), dict(interpolation="cubic"), dict(crop_pct=0.0),
                                 dict(mean=(0.5, 0.5)), dict(std=(1, 0, 1)), dict(size=(32, 0)),
                                 dict(antialias=False, interpolation="bicubic")])
def test_preprocess_rejects_bad_settings(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Preprocess(**bad)


def test_collate_names_like_eval_batch():
    def sample(i, k):
        return {"image": torch.full((3, 4, 4), float(i)), "label": i, "id": f"s{i}",
                "mask": torch.zeros(4, 4, dtype=torch.bool), "boxes": torch.ones(k, 4) * i,
                "second": {"label": 10 + i, "mask": torch.ones(4, 4, dtype=torch.bool), "boxes": torch.zeros(1, 4)}}

    batch = collate([sample(0, 1), sample(1, 3)])
    assert batch["images"].shape == (2, 3, 4, 4) and batch["images"][1].eq(1).all()
    assert batch["labels"].tolist() == [0, 1] and batch["labels"].dtype == torch.long
    assert batch["ids"] == ["s0", "s1"]
    assert batch["masks"].shape == (2, 4, 4)
    assert [b.shape[0] for b in batch["boxes"]] == [1, 3]
    assert batch["second"]["targets"].tolist() == [10, 11] and batch["second"]["masks"].shape == (2, 4, 4)
    assert len(batch["second"]["boxes"]) == 2
    with pytest.raises(ValueError, match="different keys"):
        collate([sample(0, 1), {"image": torch.zeros(3, 4, 4), "label": 0, "id": "x"}])


def test_registry_names_and_errors(tmp_path):
    assert {"imagenet", "imagenet_seg", "voc", "cifar10", "cifar100", "digits"} <= set(available_datasets())
    with pytest.raises(ValueError, match="did you mean 'cifar10'"):
        get_dataset("cifar1O", tmp_path)
    with pytest.raises(TypeError, match="no option 'bogus'.*options are"):
        get_dataset("digits", bogus=1)
    with pytest.raises(ValueError, match="give its root"):
        get_dataset("voc")
    with pytest.raises(ValueError, match="takes no root"):
        get_dataset("digits", tmp_path)
    with pytest.raises(ValueError, match="no split 'val'"):
        get_dataset("digits", split="val", n=2)
    assert len(get_dataset("digits", n=3)) == 3


def test_subsets(tmp_path):
    first, again, other = (choose_indices(100, 10, seed=seed) for seed in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.unique().numel() == 10 and torch.equal(first, first.sort().values) and first.max() < 100
    assert torch.equal(choose_indices(5), torch.arange(5))
    listing = tmp_path / "sub.yaml"
    listing.write_text("- 3\n- 1\n\n- 4\n")
    assert choose_indices(5, indices=listing).tolist() == [3, 1, 4]
    with pytest.raises(ValueError, match="n must be"):
        choose_indices(5, 6)
    with pytest.raises(IndexError):
        choose_indices(5, indices=[0, 5])
    with pytest.raises(ValueError, match="either"):
        choose_indices(5, 2, indices=[1])
