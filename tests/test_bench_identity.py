"""The bench's cache is keyed by what it holds: every stored map and value carries its image's identity (its id and
a digest of its content), so a changed, added, removed or renamed image is computed alone, everything unchanged is
reused, and a stored value never answers for another image (issue 41's reproduction on a folder dataset)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.datasets import get_dataset
from vitexplain.datasets.base import content_digest, identity_of
from vitexplain.output_folders import MARKER

METHODS = ["rollout", "random_baseline"]
METRICS = ["segmentation", "sparseness"]


def _draw(path, seed: int) -> None:
    """A 40 x 40 picture of noise with a bright square, and its mask (the square) beside it in ``masks/``."""
    generator = np.random.default_rng(seed)
    pixels = generator.integers(0, 120, (40, 40, 3), dtype=np.uint8)
    top, left = generator.integers(0, 20, 2)
    pixels[top:top + 20, left:left + 20] = 230
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    mask = np.zeros((40, 40), dtype=np.uint8)
    mask[top:top + 20, left:left + 20] = 255
    masks = path.parent.parent / "masks"
    masks.mkdir(exist_ok=True)
    Image.fromarray(mask).save(masks / path.name)


def _config(root, output_dir, gallery: int = 2) -> BenchConfig:
    return BenchConfig(models=["digits_vit"], methods=METHODS, metrics=METRICS, output_dir=output_dir,
                       dataset={"name": "folder", "options": {"images": str(root / "images"),
                                                              "masks": str(root / "masks")}},
                       batch_size=3, gallery=gallery, progress=False, device="cpu")


def _numbers(result) -> tuple:
    return result.scores, result.intervals, result.images


def _rows(output_dir) -> dict[str, set[str]]:
    """Every stored shard file of the run's maps and values -> the identities of its rows."""
    found = {}
    for path in output_dir.glob("cache/**/*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            found[str(path)] = set(json.loads(handle.metadata()["keys"]))
    return found


@pytest.fixture
def folder(tmp_path):
    for seed, name in enumerate(["b.png", "c.png", "d.png", "e.png"]):
        _draw(tmp_path / "images" / name, seed)
    return tmp_path


def test_added_changed_and_renamed_images_are_computed_alone_and_the_scores_are_those_of_a_fresh_run(folder):
    out = folder / "out"
    first = run_benchmark(_config(folder, out))
    assert not first.errors and first.images["digits_vit"]["rollout"]["segmentation"] == 4
    before = _rows(out)
    _draw(folder / "images" / "a.png", 99)                     # sorts first: every other image moves one place
    _draw(folder / "images" / "c.png", 7)                      # other pixels under the same name
    (folder / "images" / "e.png").rename(folder / "images" / "f.png")
    (folder / "masks" / "e.png").rename(folder / "masks" / "f.png")
    again = run_benchmark(_config(folder, out))
    fresh = run_benchmark(_config(folder, folder / "fresh"))
    assert not again.errors and not fresh.errors
    assert _numbers(again) == _numbers(fresh)                  # bitwise: == on every float
    assert again.images["digits_vit"]["rollout"]["segmentation"] == 5
    dataset = get_dataset("folder", images=folder / "images", masks=folder / "masks")
    recomputed = {identity_of(dataset, index) for index in (0, 2, 4)}     # a.png, c.png, f.png
    assert {key.split("#")[0] for key in recomputed} == {"a.png", "c.png", "f.png"}
    added = {path: keys for path, keys in _rows(out).items() if path not in before}
    # one new shard per store (2 methods x (maps + 2 metrics)), each holding those three images alone
    assert len(added) == len(METHODS) * (1 + len(METRICS)) and all(keys == recomputed for keys in added.values())
    assert [gallery.ids for gallery in again.galleries] == [gallery.ids for gallery in fresh.galleries]


def test_an_identity_sees_the_image_its_mask_and_its_label_and_a_digest_every_value(folder):
    def identities(**options):
        dataset = get_dataset("folder", images=folder / "images", masks=folder / "masks", **options)
        return [identity_of(dataset, index) for index in range(len(dataset))]

    first = identities()
    assert [key.split("#")[0] for key in first] == ["b.png", "c.png", "d.png", "e.png"] and identities() == first
    mask = np.asarray(Image.open(folder / "masks" / "d.png")).copy()
    mask[0, 0] = 255 - mask[0, 0]
    Image.fromarray(mask).save(folder / "masks" / "d.png")
    assert [a == b for a, b in zip(identities(), first)] == [True, True, False, True]
    (folder / "labels.csv").write_text("file,label\nb,1\nc,2\nd,3\ne,4\n")
    labelled = identities(labels=folder / "labels.csv")
    assert all(a != b for a, b in zip(labelled, identities()))
    assert content_digest({"image": np.zeros(3), "label": 1}) != content_digest({"image": np.zeros(3), "label": 2})
    assert content_digest({"image": np.zeros(3)}) != content_digest({"image": np.zeros(3, dtype=np.float32)})
    assert content_digest(b"abc", 1) == content_digest(b"abc", 1) != content_digest(b"abd", 1)


def test_an_output_folder_inside_the_images_folder_is_not_read_as_images(folder):
    out = folder / "images" / "bench-out"
    first = run_benchmark(_config(folder, out, gallery=0))
    assert (out / MARKER).is_file()
    (out / "plots").mkdir(exist_ok=True)                       # as the curve plots of other protocols are
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(out / "plots" / "curve.png")
    again = run_benchmark(_config(folder, out, gallery=0))
    assert not again.errors and again.images["digits_vit"]["rollout"]["segmentation"] == 4
    assert _numbers(again) == _numbers(first)
