"""The generated ``digits`` benchmark: determinism, ground truth, split, two-digit canvases."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

from vitexplain.datasets import Preprocess, collate, get_dataset
from vitexplain.datasets.digits import INK_THRESHOLD, NOISE_MAX, split_scans

SCANS = load_digits()


def reference_ink(scan: np.ndarray, x: int, y: int, size: int, canvas: int = 112) -> np.ndarray:
    """The scan (ink in [0, 1]) scaled bilinearly to a size x size square at (x, y), pixel by pixel.

    Pixel centres map to scan coordinates u = (px + 0.5 - x) * 8 / size - 0.5; neighbours outside
    the 8 x 8 scan count as zero.
    """
    out = np.zeros((canvas, canvas))

    def at(r, c):
        return scan[r, c] if 0 <= r < 8 and 0 <= c < 8 else 0.0

    for py in range(y, y + size):
        for px in range(x, x + size):
            u, v = (px + 0.5 - x) * 8 / size - 0.5, (py + 0.5 - y) * 8 / size - 0.5
            c0, r0 = math.floor(u), math.floor(v)
            fu, fv = u - c0, v - r0
            out[py, px] = ((1 - fv) * ((1 - fu) * at(r0, c0) + fu * at(r0, c0 + 1))
                           + fv * ((1 - fu) * at(r0 + 1, c0) + fu * at(r0 + 1, c0 + 1)))
    return out


def test_same_seed_same_canvases_and_independent_of_n_and_batch():
    first, again = get_dataset("digits", n=300, seed=3), get_dataset("digits", n=260, seed=3)
    picked = [4, 257]                                        # in the first and the second block of 256
    images, masks = first.render(picked)
    images_again, masks_again = again.render(picked)
    assert torch.equal(images, images_again) and torch.equal(masks, masks_again)
    alone = first.render([6])[0]
    assert torch.equal(alone[0], first.render(range(10))[0][6])   # a canvas does not depend on its batch
    other = get_dataset("digits", n=10, seed=4).render([4])[0]
    assert not torch.equal(other[0], images[0])


def test_masks_and_boxes_match_the_digit_pixels():
    data = get_dataset("digits", n=12, seed=1)
    for i in range(12):
        sample = data[i]
        scan = int(data.layout["scans"][i, 0])
        x, y, size = (int(data.layout[key][i, 0]) for key in ("x", "y", "sizes"))
        ink = reference_ink(SCANS.images[scan] / 16.0, x, y, size)
        expected = ink >= INK_THRESHOLD
        assert np.array_equal(sample["mask"].numpy(), expected)
        rows, cols = np.nonzero(expected)
        assert torch.equal(sample["boxes"], torch.tensor([[cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]],
                                                         dtype=torch.float32))
        assert sample["label"] == SCANS.target[scan]
        grey = sample["image"] * 0.5 + 0.5
        assert torch.equal(grey[0], grey[1]) and torch.equal(grey[0], grey[2])
        # the digit is drawn on top: on its mask the pixel is its contrast times its ink
        contrast = float(data.layout["contrast"][i, 0])
        on_digit = torch.from_numpy(expected) & sample["mask"]
        assert torch.allclose(grey[0][on_digit], torch.from_numpy(contrast * ink).float()[on_digit], atol=1e-4)


def reference_nearest_ink(scan: np.ndarray, x: int, y: int, size: int, canvas: int = 112):
    """The scan scaled by nearest neighbour to a size x size square at (x, y), pixel by pixel, and the
    pixels whose centre falls exactly halfway between two scan pixels (a tie, left out of the checks).

    A pixel centre maps to scan coordinate u = (px + 0.5 - x) * 8 / size - 0.5, computed exactly;
    nearest neighbour takes the scan pixel at the nearest integer.
    """
    from fractions import Fraction

    out, tie = np.zeros((canvas, canvas)), np.zeros((canvas, canvas), bool)

    def nearest(offset):
        u = (Fraction(2 * offset + 1, 2) * 8 / size) - Fraction(1, 2)
        return math.floor(u + Fraction(1, 2)), u - math.floor(u) == Fraction(1, 2)

    for py in range(y, y + size):
        for px in range(x, x + size):
            (r, tie_r), (c, tie_c) = nearest(py - y), nearest(px - x)
            out[py, px], tie[py, px] = scan[r, c], tie_r or tie_c
    return out, tie


def reference_stroke(mask: np.ndarray, x: int, y: int, size: int, width: int) -> np.ndarray:
    """A digit's mask with its strokes thickened (``width`` > 0) or thinned (< 0) by |width| pixels, pixel
    by pixel: each pass keeps a pixel of the square when any (thicken) / every (thin) pixel of its 3 x 3
    neighbourhood is ink, pixels outside the square counting as no ink."""
    def ink(m, r, c):
        return y <= r < y + size and x <= c < x + size and m[r, c]

    for _ in range(abs(width)):
        new = np.zeros_like(mask)
        for r in range(y, y + size):
            for c in range(x, x + size):
                around = [ink(mask, r + dr, c + dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)]
                new[r, c] = any(around) if width > 0 else all(around)
        mask = new
    return mask


def test_nearest_neighbour_and_stroke_styles_draw_the_written_out_digit():
    data = get_dataset("digits", n=12, seed=1)
    nearest = torch.tensor([True] * 6 + [False] * 6)
    stroke = torch.tensor([0, 1, -1, 2, -2, 0, 1, -1, 2, -2, 0, 0])
    images, masks = data.render(range(12), nearest=nearest, stroke=stroke)
    plain_images, plain_masks = data.render(range(12))
    checked = 0
    for i in range(12):
        scan = int(data.layout["scans"][i, 0])
        x, y, size = (int(data.layout[key][i, 0]) for key in ("x", "y", "sizes"))
        if nearest[i]:
            ink, tie = reference_nearest_ink(SCANS.images[scan] / 16.0, x, y, size)
        else:
            ink, tie = reference_ink(SCANS.images[scan] / 16.0, x, y, size), np.zeros((112, 112), bool)
        expected = reference_stroke(ink >= INK_THRESHOLD, x, y, size, int(stroke[i]))
        tie = reference_stroke(tie, x, y, size, abs(int(stroke[i]))) | tie  # what a tie pixel can reach
        assert np.array_equal(masks[i, 0].numpy()[~tie], expected[~tie]), i
        checked += 1 - tie.sum() / size ** 2  # the share of the digit's square checked
        if nearest[i] and int(stroke[i]) == 0:  # on its mask the pixel is the digit's contrast times its ink
            on = torch.from_numpy(expected & ~tie)
            grey = images[i, 0] * 0.5 + 0.5
            contrast = float(data.layout["contrast"][i, 0])
            assert torch.allclose(grey[on], torch.from_numpy(contrast * ink).float()[on], atol=1e-4)
        if int(stroke[i]) != 0:
            assert not np.array_equal(expected, ink >= INK_THRESHOLD)  # the stroke style changed the digit
    assert checked / 12 > 0.75  # ties (whole rows / columns at some sizes) fall either way in floating point
    assert torch.equal(images[10:], plain_images[10:]) and torch.equal(masks[10:], plain_masks[10:])
    # a canvas's style is its own: the same canvas alone, in another batch, is drawn the same
    alone = data.render([3], nearest=nearest[3:4], stroke=stroke[3:4])
    assert torch.equal(alone[0][0], images[3]) and torch.equal(alone[1][0], masks[3])
    assert not torch.equal(images[3], plain_images[3])
    with pytest.raises(ValueError, match=r"stroke must hold one value per canvas \(12\), got 3"):
        data.render(range(12), stroke=torch.zeros(3, dtype=torch.long))


def test_clutter_is_present_but_away_from_the_digit():
    data = get_dataset("digits", n=16, seed=2)
    images, masks = data.render(range(16))
    grey = images[:, 0] * 0.5 + 0.5
    keep_out = data._keep_out(data.layout)
    digit_square = data._keep_out({**data.layout, "x": data.layout["x"] + 4, "y": data.layout["y"] + 4,
                                   "sizes": data.layout["sizes"] - 8})
    ring = keep_out & ~digit_square                      # near the digit but not on it: noise only
    assert grey[ring].max() <= NOISE_MAX + 1e-6
    assert (grey.masked_fill(keep_out, 0).flatten(1).amax(1) > NOISE_MAX + 0.1).float().mean() > 0.5


def test_train_and_test_scans_are_disjoint():
    pools = split_scans()
    train, test = set(pools["train"].tolist()), set(pools["test"].tolist())
    assert not train & test and len(train | test) == len(SCANS.target)
    for digit in range(10):
        members = np.flatnonzero(SCANS.target == digit)
        assert len(test & set(members.tolist())) == round(0.2 * len(members))
    for split, pool in (("train", train), ("test", test)):
        data = get_dataset("digits", split=split, n=300, objects=2)
        used = set(data.layout["scans"].flatten().tolist()) | set(data.layout["fragment_scans"].flatten().tolist())
        assert used <= pool
    assert split_scans(split_seed=1)["test"].tolist() != pools["test"].tolist()


def test_two_digit_canvases():
    data = get_dataset("digits", n=300, objects=2, seed=5)
    classes = torch.from_numpy(SCANS.target)[data.layout["scans"]]
    assert (classes[:, 0] != classes[:, 1]).all()
    batch = collate([data[i] for i in range(8)])
    first, second = batch["masks"], batch["second"]["masks"]
    assert first.flatten(1).any(1).all() and second.flatten(1).any(1).all()
    assert not (first & second).any()
    assert (batch["labels"] != batch["second"]["targets"]).all()
    for box, other in zip(batch["boxes"], batch["second"]["boxes"]):
        (a0, b0, a1, b1), (c0, d0, c1, d1) = box[0].tolist(), other[0].tolist()
        assert a1 <= c0 or c1 <= a0 or b1 <= d0 or d1 <= b0          # the boxes do not overlap
    assert batch["ids"][0].startswith("digits2-test-s5-")


def test_dataloader_and_preprocess_check():
    data = get_dataset("digits", n=5, split="train")
    batch = next(iter(DataLoader(data, batch_size=5, collate_fn=collate)))
    assert batch["images"].shape == (5, 3, 112, 112) and batch["boxes"][0].shape == (1, 4)
    assert batch["images"].min() >= -1 and batch["images"].max() <= 1
    shifted = get_dataset("digits", n=5, split="train",
                          preprocess=Preprocess(size=112, mean=(0.2,) * 3, std=(0.4,) * 3))
    assert torch.allclose(shifted[0]["image"] * 0.4 + 0.2, data[0]["image"] * 0.5 + 0.5, atol=1e-6)
    with pytest.raises(ValueError, match="112 x 112"):
        get_dataset("digits", n=5, preprocess=Preprocess(size=224))
    with pytest.raises(ValueError, match="objects must be 1 or 2"):
        get_dataset("digits", n=5, objects=3)
