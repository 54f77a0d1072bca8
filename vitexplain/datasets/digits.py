"""``digits``: the project's own benchmark with exact ground truth, built from scikit-learn's 8x8 digit scans.

Each 112 x 112 canvas holds one handwritten digit (or two of different classes) at a random
position and size on a cluttered background, with the digit's pixel mask and bounding box. The
decisions (canvas and patch size, clutter, split) are argued in docs/decisions/datasets.md.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import DictDataset, register_dataset
from .preprocess import Preprocess, resolve_preprocess

CANVAS = 112                 # pixels; with 8-pixel patches a 14 x 14 token grid, as ViT-B/16 at 224
PATCH = 8                    # patch size of the models the benchmark is meant for
MEAN = STD = (0.5, 0.5, 0.5)  # normalisation: [0, 1] -> [-1, 1]
DIGIT_SIZES = (24, 48)       # side of the 8 x 8 scan once scaled, pixels (3 to 6 patches), inclusive
INK_THRESHOLD = 31 / 103     # foreground: scaled ink >= ~0.3 of full ink; never a tie (see _render)
DIGIT_CONTRAST = (0.7, 1.0)  # brightness of a digit's full ink
NOISE_GRID = 28              # background noise drawn on a 28 x 28 grid, upsampled bilinearly (4-pixel blobs)
NOISE_MAX = 0.2              # background noise brightness in [0, NOISE_MAX]
FRAGMENTS = 4                # clutter strokes per canvas
FRAGMENT_WINDOW = 4          # a fragment is a 4 x 4 window of a scan (a quarter of it) at digit scale
FRAGMENT_CONTRAST = (0.15, 0.4)  # dimmer than any digit (DIGIT_CONTRAST), so the digit is the salient object
KEEP_OUT = 4                 # pixels around each digit's square that fragments never touch
TEST_FRACTION = 0.2          # scans of each class held out for the test split
BLOCK = 256                  # canvases drawn per random stream, so canvas i never depends on n
_SPLIT_CODES = {"train": 0, "test": 1}


@functools.lru_cache(maxsize=1)
def _scans() -> tuple[Tensor, Tensor]:
    """The 1,797 scans of ``sklearn.datasets.load_digits`` as ink in [0, 1] [N, 8, 8], and their classes [N]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the digits benchmark is built from scikit-learn's bundled digits: "
                          "pip install scikit-learn") from None
    data = load_digits()
    return torch.from_numpy(data.images / 16.0).float(), torch.from_numpy(data.target).long()


def split_scans(split_seed: int = 0, test_fraction: float = TEST_FRACTION) -> dict[str, Tensor]:
    """Scan indices of each split: per class, a seeded ``test_fraction`` of its scans goes to ``test``."""
    classes = _scans()[1].numpy()
    rng = np.random.default_rng([split_seed])
    test = []
    for digit in range(10):
        members = rng.permutation(np.flatnonzero(classes == digit))
        test.append(members[: round(test_fraction * len(members))])
    test = np.sort(np.concatenate(test))
    train = np.setdiff1d(np.arange(len(classes)), test)
    return {"train": torch.from_numpy(train), "test": torch.from_numpy(test)}


def _draw_block(rng: np.random.Generator, pool: np.ndarray, classes: np.ndarray, objects: int) -> dict[str, np.ndarray]:
    """Random layout of ``BLOCK`` canvases: digits, their squares and contrast, fragments, noise."""
    count = (BLOCK, objects)
    first = pool[rng.integers(0, len(pool), BLOCK)]
    scans = first[:, None]
    if objects == 2:  # second digit: a uniformly drawn scan of another class
        order = pool[np.argsort(classes[pool], kind="stable")]          # the pool grouped by class
        counts = np.bincount(classes[pool], minlength=10)
        other = (classes[first] + rng.integers(1, 10, BLOCK)) % 10
        pick = (rng.random(BLOCK) * counts[other]).astype(int)
        scans = np.stack([first, order[np.cumsum(counts)[other] - counts[other] + pick]], 1)
    sizes = rng.integers(DIGIT_SIZES[0], DIGIT_SIZES[1] + 1, count)
    if objects == 1:
        x, y = (rng.integers(0, CANVAS - sizes + 1) for _ in range(2))
    else:  # each digit in its own half, halves side by side or stacked, which digit where at random
        half = CANVAS // 2
        slot = np.stack([np.zeros(BLOCK, int), np.ones(BLOCK, int)], 1) ^ rng.integers(0, 2, (BLOCK, 1))
        along = slot * half + rng.integers(0, half - sizes + 1)
        across = rng.integers(0, CANVAS - sizes + 1)
        horizontal = rng.integers(0, 2, (BLOCK, 1)).astype(bool)
        x, y = np.where(horizontal, along, across), np.where(horizontal, across, along)
    fragment_sizes = rng.integers(DIGIT_SIZES[0], DIGIT_SIZES[1] + 1, (BLOCK, FRAGMENTS)) * FRAGMENT_WINDOW // 8
    return {
        "scans": scans, "x": x, "y": y, "sizes": sizes,
        "contrast": rng.uniform(*DIGIT_CONTRAST, count),
        "fragment_scans": pool[rng.integers(0, len(pool), (BLOCK, FRAGMENTS))],
        "fragment_windows": rng.integers(0, 8 - FRAGMENT_WINDOW + 1, (BLOCK, FRAGMENTS, 2)),
        "fragment_x": rng.integers(-(fragment_sizes // 2), CANVAS - fragment_sizes // 2),
        "fragment_y": rng.integers(-(fragment_sizes // 2), CANVAS - fragment_sizes // 2),
        "fragment_sizes": fragment_sizes,
        "fragment_contrast": rng.uniform(*FRAGMENT_CONTRAST, (BLOCK, FRAGMENTS)),
        "noise": rng.integers(0, 256, (BLOCK, NOISE_GRID, NOISE_GRID), dtype=np.uint8),
    }


def _tiles(sources: Tensor, size: Tensor, tile: int, nearest: Tensor | None = None,
           stroke: Tensor | None = None) -> Tensor:
    """Square sources [M, h, w] scaled bilinearly (zero padding) to ``size`` [M] pixels at the top-left
    of tiles [M, tile, tile]; nothing outside that square, so a digit stays within its square.

    Styles (per source, None: none): ``nearest`` [M] bool scales those sources by nearest neighbour
    instead; ``stroke`` [M] int thickens (> 0) or thins (< 0) their strokes by that many pixels
    (grey dilation / erosion with a 3 x 3 window, repeated; no ink outside the square), inside the
    square only.
    """
    scale = tile / size.to(sources.dtype)
    theta = torch.zeros(len(sources), 2, 3, dtype=sources.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = scale
    theta[:, 0, 2] = theta[:, 1, 2] = scale - 1
    grid = F.affine_grid(theta, [len(sources), 1, tile, tile], align_corners=False)
    tiles = F.grid_sample(sources[:, None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    if nearest is not None and nearest.any():
        blocky = F.grid_sample(sources[:, None], grid, mode="nearest", padding_mode="zeros", align_corners=False)
        tiles = torch.where(nearest[:, None, None, None], blocky, tiles)
    inside = torch.arange(tile) < size[:, None]
    inside = (inside[:, :, None] & inside[:, None, :])[:, None]
    for width in range(int(stroke.abs().max()) if stroke is not None else 0):
        padded = F.pad(tiles * inside, (1, 1, 1, 1))  # no ink outside the square, on every side
        grown, thinned = F.max_pool2d(padded, 3, 1), -F.max_pool2d(-padded, 3, 1)
        tiles = torch.where((stroke > width)[:, None, None, None], grown,
                            torch.where((stroke < -width)[:, None, None, None], thinned, tiles))
    return (tiles * inside)[:, 0]


def _stamp(tiles: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """Canvases [B, CANVAS, CANVAS]: the maximum of tiles [B, K, T, T] (non-negative) put with their
    top-left pixel at (x, y) [B, K]; what falls off the canvas goes to a discarded extra slot."""
    count, _, tile, _ = tiles.shape
    offsets = torch.arange(tile)
    rows, cols = y[..., None] + offsets, x[..., None] + offsets                      # [B, K, T]
    on_canvas = ((rows >= 0) & (rows < CANVAS))[..., :, None] & ((cols >= 0) & (cols < CANVAS))[..., None, :]
    index = torch.where(on_canvas, rows[..., :, None] * CANVAS + cols[..., None, :], CANVAS * CANVAS)
    canvas = torch.zeros(count, CANVAS * CANVAS + 1, dtype=tiles.dtype)
    canvas.scatter_reduce_(1, index.reshape(count, -1), tiles.reshape(count, -1), "amax")
    return canvas[:, :-1].view(count, CANVAS, CANVAS)


def tight_boxes(masks: Tensor) -> Tensor:
    """Boxes (x0, y0, x1, y1) in pixel edges of the nonzero pixels of masks [..., H, W] (zeros if empty)."""
    def extent(hits: Tensor) -> tuple[Tensor, Tensor]:
        positions = torch.arange(hits.shape[-1], dtype=torch.float32)
        low = torch.where(hits, positions, float("inf")).amin(-1)
        high = torch.where(hits, positions + 1, float("-inf")).amax(-1)
        empty = ~hits.any(-1)
        return low.masked_fill(empty, 0), high.masked_fill(empty, 0)

    (x0, x1), (y0, y1) = extent(masks.any(-2)), extent(masks.any(-1))
    return torch.stack([x0, y0, x1, y1], -1)


@register_dataset("digits")
class Digits(DictDataset):
    """Synthetic localisation benchmark with exact masks: real handwritten digits on cluttered canvases.

    Canvas ``i`` of a split is a pure function of (``seed``, ``split``, ``objects``, ``split_seed``,
    ``i``): layouts are drawn in blocks of 256 canvases, each block from its own seeded NumPy
    generator, so ``n`` only decides how many canvases there are and canvas ``i`` is the same in
    every batch. Rendering is lazy and batched (:meth:`render`), so memory grows with the layout
    tables only. Scans of the test split never appear in the training split, neither as digits
    nor as clutter (:func:`split_scans`).

    A canvas: low-contrast background noise (28 x 28 grid upsampled), ``FRAGMENTS`` clutter
    strokes (4 x 4 windows of other scans of the same split, at digit scale, so at most a quarter
    of a digit and dimmer on average), kept ``KEEP_OUT`` pixels away from the digits' squares,
    and the digit(s) on top (brightest value wins). Grey levels in [0, 1] are normalised with
    ``MEAN`` / ``STD`` (0.5 / 0.5) and repeated over 3 channels.

    Samples: ``image`` [3, 112, 112], ``label`` (0-9), ``id``, ``mask`` bool (scaled ink >=
    ``INK_THRESHOLD``), ``boxes`` [1, 4] (tight box of the mask); with ``objects=2`` also
    ``second`` = ``{"label", "mask", "boxes"}`` of the other digit, of another class, in the other
    half of the canvas (masks and boxes disjoint).

    Args:
        split: ``"test"`` or ``"train"``.
        n: number of canvases.
        seed: seeds the canvases.
        objects: 1 (one digit) or 2 (two digits of different classes, the class-sensitivity test).
        split_seed: seeds the 80/20 split of the scans (keep it fixed between training and testing).
        preprocess: only its ``mean`` / ``std`` are used; its size must be 112 (canvases are drawn at size).
    """

    splits = ("test", "train")

    def __init__(self, split: str = "test", *, n: int = 1000, seed: int = 0, objects: int = 1,
                 split_seed: int = 0, preprocess: Preprocess | dict | None = None):
        self.check_split(split)
        if objects not in (1, 2):
            raise ValueError(f"objects must be 1 or 2, got {objects!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.preprocess = resolve_preprocess(preprocess, Preprocess(size=CANVAS, mean=MEAN, std=STD))
        if self.preprocess.size != (CANVAS, CANVAS):
            raise ValueError(f"digits canvases are {CANVAS} x {CANVAS}; "
                             f"the preprocessing asks for {self.preprocess.size}")
        self.split, self.seed, self.objects = split, seed, objects
        self.provides = ("masks", "boxes", "second") if objects == 2 else ("masks", "boxes")
        self.pool = split_scans(split_seed)[split]
        classes = _scans()[1].numpy()
        blocks = [_draw_block(np.random.default_rng([seed, _SPLIT_CODES[split], objects, b]), self.pool.numpy(),
                              classes, objects) for b in range(-(-n // BLOCK))]
        #: the layout of every canvas: arrays [n, ...] (see ``_draw_block``), public for inspection
        self.layout = {key: torch.from_numpy(np.concatenate([block[key] for block in blocks])[:n])
                       for key in blocks[0]}
        super().__init__(n)

    def render(self, indices: Tensor | list[int], chunk: int = 64, *, nearest: Tensor | None = None,
               stroke: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Images [B, 3, 112, 112] (normalised) and digit masks [B, objects, 112, 112] of canvases ``indices``.

        Optional styles of each canvas [B] (training's rendering augmentation; None: the benchmark's
        drawing): ``nearest`` (bool) scales its scans — digits and clutter — by nearest neighbour
        instead of bilinearly; ``stroke`` (int) thickens (> 0) or thins (< 0) their strokes by that
        many pixels. The masks follow the drawn ink.
        """
        indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        styles = {"nearest": nearest, "stroke": stroke}
        for name, style in styles.items():
            if style is not None and style.numel() != len(indices):
                raise ValueError(f"{name} must hold one value per canvas ({len(indices)}), got {style.numel()}")
        parts = [self._render(indices[start:start + chunk],
                              *(None if style is None else style.reshape(-1)[start:start + chunk]
                                for style in styles.values()))
                 for start in range(0, len(indices), chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _render(self, indices: Tensor, nearest: Tensor | None = None,
                stroke: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scans = _scans()[0]
        lay = {key: value[indices] for key, value in self.layout.items()}
        count, objects = len(indices), self.objects

        def each(style: Tensor | None, per_canvas: int) -> Tensor | None:  # a canvas's style for each of its tiles
            return None if style is None else style.repeat_interleave(per_canvas)

        # digit ink in float64: bilinear values of 1/16 steps at sizes 24-48 are fractions whose
        # denominators divide 16 (2 size)^2, which 103 never divides, so no value ties INK_THRESHOLD
        # and the mask does not depend on rounding (same on every machine); nearest neighbour and the
        # stroke styles only pick among those values
        digit_tiles = _tiles(scans[lay["scans"].flatten()].double(), lay["sizes"].flatten(), DIGIT_SIZES[1],
                             each(nearest, objects), each(stroke, objects))
        ink = _stamp(digit_tiles[:, None], lay["x"].flatten()[:, None], lay["y"].flatten()[:, None])
        ink = ink.view(count, objects, CANVAS, CANVAS)
        digits = (ink * lay["contrast"][..., None, None]).amax(1).float()

        offsets = torch.arange(FRAGMENT_WINDOW)
        rows = lay["fragment_windows"][..., 0, None] + offsets               # [B, F, W]
        cols = lay["fragment_windows"][..., 1, None] + offsets
        windows = scans[lay["fragment_scans"][..., None, None], rows[..., :, None], cols[..., None, :]]
        tile = DIGIT_SIZES[1] * FRAGMENT_WINDOW // 8
        strokes = _tiles(windows.flatten(0, 1), lay["fragment_sizes"].flatten(), tile, each(nearest, FRAGMENTS),
                         each(stroke, FRAGMENTS)).view(count, FRAGMENTS, tile, tile)
        clutter = _stamp(strokes * lay["fragment_contrast"].float()[..., None, None], lay["fragment_x"],
                         lay["fragment_y"])
        clutter = clutter.masked_fill(self._keep_out(lay), 0)

        noise = lay["noise"].float()[:, None] * (NOISE_MAX / 255)
        background = F.interpolate(noise, size=(CANVAS, CANVAS), mode="bilinear", align_corners=False)[:, 0]
        grey = torch.maximum(torch.maximum(background, clutter), digits)
        mean = torch.tensor(self.preprocess.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.preprocess.std).view(1, 3, 1, 1)
        return (grey[:, None] - mean) / std, ink >= INK_THRESHOLD

    @staticmethod
    def _keep_out(lay: dict[str, Tensor]) -> Tensor:
        """Pixels within ``KEEP_OUT`` of a digit's square [B, CANVAS, CANVAS]."""
        pixels = torch.arange(CANVAS)

        def near(start: Tensor) -> Tensor:  # [B, objects, CANVAS]
            return (pixels >= start[..., None] - KEEP_OUT) & (pixels < (start + lay["sizes"])[..., None] + KEEP_OUT)

        return (near(lay["y"])[..., :, None] & near(lay["x"])[..., None, :]).any(1)

    def load(self, item: int) -> dict[str, Any]:
        images, masks = self.render([item])
        boxes = tight_boxes(masks[0])
        labels = _scans()[1][self.layout["scans"][item]].tolist()
        kind = "digits" if self.objects == 1 else "digits2"
        sample = {"image": images[0], "label": labels[0], "id": f"{kind}-{self.split}-s{self.seed}-{item:06d}",
                  "mask": masks[0, 0], "boxes": boxes[:1]}
        if self.objects == 2:
            sample["second"] = {"label": labels[1], "mask": masks[0, 1], "boxes": boxes[1:]}
        return sample
