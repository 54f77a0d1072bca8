"""The ``folder`` dataset: a user's own images with optional masks, labels and boxes, on tiny folders written here."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from vitexplain.datasets import (
    DatasetFormatError,
    DatasetNotFoundError,
    Preprocess,
    choose_indices,
    collate,
    get_dataset,
)

RED = (255, 0, 0)
RECT = (10, 6, 30, 24)  # x0, y0, x1, y1 of the red rectangle on a 40 x 30 image


def plain(size: int | tuple[int, int], crop_pct: float = 1.0, interpolation: str = "nearest") -> Preprocess:
    """Resize + centre crop, no normalisation: the image's pixels in [0, 1]."""
    return Preprocess(size=size, crop_pct=crop_pct, interpolation=interpolation, mean=(0, 0, 0), std=(1, 1, 1))


def picture(width: int = 40, height: int = 30, rect=RECT, colour=RED, background=(0, 0, 90)) -> np.ndarray:
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:] = background
    x0, y0, x1, y1 = rect
    pixels[y0:y1, x0:x1] = colour
    return pixels


def write(path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def rect_mask(width: int = 40, height: int = 30, rect=RECT) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    x0, y0, x1, y1 = rect
    mask[y0:y1, x0:x1] = 255
    return mask


# ------------------------------------------------------------------------------------------ images and labels

def test_images_sorted_by_relative_path_with_subfolder_labels(tmp_path):
    images = tmp_path / "images"
    for name in ("dog/b.JPG", "cat/z.png", "cat/a.jpeg", "bird/deep/q.webp", "cat/.hidden.png", ".trash/cat/x.png"):
        write(images / name, picture())
    (images / "cat" / "notes.txt").write_text("not an image")
    data = get_dataset("folder", images=images, labels="subfolders", preprocess=plain(20))
    # ImageFolder's rule, written out: the sorted class folders -> 0, 1, 2
    classes = sorted(p.name for p in images.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert data.classes == classes == ["bird", "cat", "dog"]
    assert data.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    samples = [data[i] for i in range(len(data))]
    assert [(s["id"], s["label"]) for s in samples] == [
        ("bird/deep/q.webp", 0), ("cat/a.jpeg", 1), ("cat/z.png", 1), ("dog/b.JPG", 2)]
    assert samples[0]["image"].shape == (3, 20, 20) and samples[0]["image"].dtype == torch.float32
    assert "mask" not in samples[0] and "boxes" not in samples[0] and data.provides == ()
    batch = collate(samples)
    assert batch["labels"].tolist() == [0, 1, 1, 2] and batch["images"].shape == (4, 3, 20, 20)


def test_no_labels_are_minus_one_and_images_directly_in_the_folder_refuse_subfolders(tmp_path):
    write(tmp_path / "a.png", picture())
    write(tmp_path / "sub" / "b.png", picture())
    data = get_dataset("folder", images=tmp_path, preprocess=plain(20))
    assert [data[i]["label"] for i in range(2)] == [-1, -1] and data.classes == []
    with pytest.raises(DatasetFormatError, match=r"1 image lie directly in it, in no class subfolder \(a\.png\)"):
        get_dataset("folder", images=tmp_path, labels="subfolders", preprocess=plain(20))


def test_csv_labels_by_path_stem_or_name_integers_and_class_names(tmp_path):
    images = tmp_path / "images"
    for name in ("x/one.png", "x/two.png", "y/three.jpg"):
        write(images / name, picture())
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("file,label\nx/one.png,7\nx/two,3\nthree.jpg,-1\n")  # path, path without suffix, file name
    data = get_dataset("folder", images=images, labels=numbers, preprocess=plain(20))
    assert [data[i]["label"] for i in range(3)] == [7, 3, -1]

    names = tmp_path / "names.csv"
    names.write_text("file,label\nthree,zebra\nx/one.png,ant\nx/two.png,zebra\n")  # rows in any order; a stem
    data = get_dataset("folder", images=images, labels=names, preprocess=plain(20))
    assert data.classes == ["ant", "zebra"] and [data[i]["label"] for i in range(3)] == [0, 1, 1]

    given = ["bee", "zebra", "ant"]
    data = get_dataset("folder", images=images, labels=names, class_names=given, preprocess=plain(20))
    assert [data[i]["label"] for i in range(3)] == [2, 1, 1] and data.class_to_idx["zebra"] == 1
    config = {"input_size": (3, 20, 20), "crop_pct": 1.0, "class_names": given}  # the model's, as the bench passes
    data = get_dataset("folder", images=images, labels=names, class_names="model", preprocess=config)
    assert [data[i]["label"] for i in range(3)] == [2, 1, 1]
    with pytest.raises(DatasetFormatError, match=r"1 label not among class_names \(zebra\)"):
        get_dataset("folder", images=images, labels=names, class_names=["ant"], preprocess=plain(20))
    with pytest.raises(DatasetFormatError, match=r"2 images have labels outside \[-1, 2\] \(class_names has 3\) "
                                                 r"\(x/one\.png: 7, x/two\.png: 3\)"):
        get_dataset("folder", images=images, labels=numbers, class_names=given, preprocess=plain(20))


# ------------------------------------------------------------------------------------------ masks

def test_masks_go_through_the_same_resize_and_centre_crop(tmp_path):
    # 40 x 30 with crop_pct 0.8 to 16 x 16: shorter side -> floor(16 / 0.8) = 20, so 26 x 20, crop offset (5, 2)
    write(tmp_path / "images" / "a" / "x.jpg", picture())
    write(tmp_path / "images" / "a" / "y.png", picture(rect=(0, 0, 12, 30)))
    write(tmp_path / "masks" / "a" / "x.png", rect_mask())
    write(tmp_path / "masks" / "a" / "y.png", rect_mask(rect=(0, 0, 12, 30)))
    data = get_dataset("folder", images=tmp_path / "images", masks=tmp_path / "masks",
                       preprocess=plain(16, crop_pct=0.8))
    assert data.provides == ("masks",)
    for index in range(2):
        sample = data[index]
        assert sample["mask"].dtype == torch.bool and sample["mask"].shape == (16, 16)
        red = (sample["image"][0] > 0.5) & (sample["image"][2] < 0.2)
        if sample["id"] == "a/y.png":  # png: nearest resampling of image and mask pick the same source pixels
            assert torch.equal(sample["mask"], red)
        else:  # jpeg: compression blurs the rectangle's border by a pixel
            assert (sample["mask"] != red).float().mean() < 0.1
    # independent: the rectangle's 12 columns land in output columns [0, 12 * 26 / 40 - 5) = [0, 2.8)
    assert data[1]["mask"].any(0).nonzero().flatten().tolist() == [0, 1, 2]

    # the digits models' preprocessing (bilinear, 112 x 112): mask and red pixels agree up to the blurred border
    digits = {"input_size": (3, 112, 112), "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3,
              "crop_pct": 1.0, "crop_mode": "center"}
    sample = get_dataset("folder", images=tmp_path / "images", masks=tmp_path / "masks", preprocess=digits)[1]
    red = (sample["image"][0] > 0) & (sample["image"][2] < -0.5)
    assert (sample["mask"] & red).sum() / (sample["mask"] | red).sum() > 0.9


def test_mask_foreground_rule_and_matching_by_plain_stem(tmp_path):
    for name in ("a/grey.png", "b/rgb.png", "alpha.png", "palette.png"):
        write(tmp_path / "images" / name, picture())
    masks = tmp_path / "masks"
    grey = np.zeros((30, 40), np.uint8)
    grey[0, :4] = 1  # any value > 0 is foreground
    write(masks / "a" / "grey.png", grey)
    rgb = np.zeros((30, 40, 3), np.uint8)
    rgb[1, :5, 1] = 9  # one channel > 0 is enough
    write(masks / "rgb.bmp", rgb)  # matched to b/rgb.png by its stem alone (unique)
    rgba = np.zeros((30, 40, 4), np.uint8)
    rgba[2, :6] = (255, 255, 255, 255)
    rgba[3, :] = (255, 255, 255, 0)  # coloured but fully transparent: background
    write(masks / "alpha.png", rgba)
    palette = Image.fromarray(grey * 3, "L").convert("P")  # palette indices, 0 is background
    palette.save(masks / "palette.png")
    data = get_dataset("folder", images=tmp_path / "images", masks=masks, preprocess=plain((30, 40)))
    counts = {data[i]["id"]: int(data[i]["mask"].sum()) for i in range(len(data))}
    assert counts == {"a/grey.png": 4, "alpha.png": 6, "b/rgb.png": 5, "palette.png": 4}


def test_mask_of_another_size_is_an_error_naming_both_files(tmp_path):
    write(tmp_path / "images" / "x.png", picture())
    write(tmp_path / "masks" / "x.png", rect_mask(20, 20, (0, 0, 5, 5)))
    data = get_dataset("folder", images=tmp_path / "images", masks=tmp_path / "masks", preprocess=plain(16))
    with pytest.raises(DatasetFormatError, match=r"masks/x\.png: is 20 x 20 pixels, its image x\.png 40 x 30"):
        data[0]


# ------------------------------------------------------------------------------------------ boxes

def test_boxes_move_with_the_resize_and_centre_crop(tmp_path):
    images = tmp_path / "images"
    write(images / "x.png", picture())
    write(images / "tall.png", picture(30, 60, rect=(0, 0, 1, 1)))
    csv_file = tmp_path / "boxes.csv"
    csv_file.write_text("file,x0,y0,x1,y1\nx.png,10,6,30,24\nx,0,0,12,30\ntall.png,6,24,27,36\nx.png,36,2,40,28\n")
    # by hand, 16 x 16 with crop_pct 0.8: the shorter side resized to floor(16 / 0.8) = 20, then a centre crop of 16
    #   x.png 40 x 30 -> 26 x 20 (26 = int(20 * 40 / 30)): scale (26 / 40, 20 / 30), crop offset ((26 - 16) / 2, 2)
    scale_x, scale_y, left, top = 26 / 40, 20 / 30, 5, 2
    expected_x = sorted([
        [10 * scale_x - left, 6 * scale_y - top, 30 * scale_x - left, 24 * scale_y - top],  # [1.5, 2, 14.5, 14]
        [0.0, 0.0, 12 * scale_x - left, 16.0],  # x0, y0 below 0 and y1 = 18 past the crop: clipped to [0, 0, 2.8, 16]
    ])  # the box at x 36..40 lands at 18.4..21 > 16: cropped away, dropped
    #   tall.png 30 x 60 -> 20 x 40: scale 2/3 both ways, crop offset (2, 12)
    s, left, top = 20 / 30, 2, 12
    expected_tall = [[6 * s - left, 24 * s - top, 27 * s - left, 36 * s - top]]  # [2, 4, 16, 12]
    json_file = tmp_path / "boxes.json"
    json_file.write_text(json.dumps({"x.png": [[10, 6, 30, 24], [0, 0, 12, 30], [36, 2, 40, 28]],
                                     "tall": [[6, 24, 27, 36]]}))
    for source in (csv_file, json_file):
        data = get_dataset("folder", images=images, boxes=source, preprocess=plain(16, crop_pct=0.8))
        assert data.provides == ("boxes",)
        by_id = {data[i]["id"]: data[i]["boxes"] for i in range(2)}
        found = sorted(by_id["x.png"].tolist())
        torch.testing.assert_close(torch.tensor(found), torch.tensor(expected_x), atol=1e-5, rtol=0)
        torch.testing.assert_close(by_id["tall.png"], torch.tensor(expected_tall), atol=1e-5, rtol=0)
        assert by_id["x.png"].dtype == torch.float32


def test_box_labels_keep_the_boxes_of_the_image_label(tmp_path):
    images = tmp_path / "images"
    write(images / "cat" / "a.png", picture())
    write(images / "dog" / "b.png", picture())
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("file,x0,y0,x1,y1,label\ncat/a.png,0,0,10,10,cat\ncat/a.png,20,0,30,10,dog\n"
                     "dog/b.png,0,0,10,10,1\ndog/b.png,5,5,15,15,\n")  # an integer label; no label: kept
    data = get_dataset("folder", images=images, labels="subfolders", boxes=boxes, preprocess=plain((30, 40)))
    assert data[0]["boxes"].tolist() == [[0, 0, 10, 10]]
    assert data[1]["boxes"].tolist() == [[0, 0, 10, 10], [5, 5, 15, 15]]
    unlabelled = get_dataset("folder", images=images, boxes=boxes, preprocess=plain((30, 40)))
    assert len(unlabelled[0]["boxes"]) == 2  # images without a label keep every box


# ------------------------------------------------------------------------------------------ pairing errors

def many(tmp_path, count: int = 5):
    images = tmp_path / "images"
    for number in range(count):
        write(images / f"im{number}.png", picture())
    return images


def test_images_without_a_mask_and_masks_without_an_image_are_one_error(tmp_path):
    images = many(tmp_path)
    masks = tmp_path / "masks"
    write(masks / "im2.png", rect_mask())
    write(masks / "stray.png", rect_mask())
    with pytest.raises(DatasetFormatError) as caught:
        get_dataset("folder", images=images, masks=masks)
    message = str(caught.value).split("\n")[0]
    assert message == (f"{masks}: 4 images have no mask (im0.png, im1.png, im3.png, ...); "
                       "1 mask matches no image (stray.png)")


def test_ambiguous_stems_are_refused(tmp_path):
    write(tmp_path / "images" / "a" / "x.png", picture())
    write(tmp_path / "images" / "b" / "x.png", picture())
    write(tmp_path / "masks" / "a" / "x.png", rect_mask())
    write(tmp_path / "masks" / "x.png", rect_mask())
    with pytest.raises(DatasetFormatError, match=r"image has no mask \(b/x\.png\); 1 mask matches several images "
                                                 r"\(x\.png\)"):
        get_dataset("folder", images=tmp_path / "images", masks=tmp_path / "masks")


def test_label_and_box_files_naming_unknown_files_or_missing_images(tmp_path):
    images = many(tmp_path)
    labels = tmp_path / "labels.csv"
    labels.write_text("file,label\nim0.png,1\nim1,2\nghost.png,3\nother/im2.png,1\n")
    with pytest.raises(DatasetFormatError) as caught:
        get_dataset("folder", images=images, labels=labels)
    assert str(caught.value).split("\n")[0] == (
        f"{labels}: 2 rows name no image (ghost.png, other/im2.png); "
        "3 images have no label (im2.png, im3.png, im4.png)")
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("file,x0,y0,x1,y1\n" + "".join(f"im{n}.png,1,1,5,5\n" for n in range(4)) + "nope.png,1,1,2,2\n"
                     "im0.png,5,5,1,1\n")
    with pytest.raises(DatasetFormatError) as caught:
        get_dataset("folder", images=images, boxes=boxes)
    assert str(caught.value).split("\n")[0] == (
        f"{boxes}: 1 row names no image (nope.png); 1 box is not 4 finite numbers with x0 < x1, y0 < y1 "
        "(im0.png (line 7)); 1 image has no box (im4.png)")
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("name,label\nim0.png,1\n")
    with pytest.raises(DatasetFormatError, match="header must be file,label, got name,label"):
        get_dataset("folder", images=images, labels=wrong)


def test_missing_and_empty_folders_are_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no images here")
    with pytest.raises(DatasetNotFoundError, match=f"image files .* not found: {tmp_path / 'empty'}\n"):
        get_dataset("folder", images=tmp_path / "empty")
    with pytest.raises(DatasetNotFoundError, match="images folder not found: .*nowhere"):
        get_dataset("folder", images=tmp_path / "nowhere")
    images = many(tmp_path, 1)
    with pytest.raises(DatasetNotFoundError, match="masks folder not found"):
        get_dataset("folder", images=images, masks=tmp_path / "no-masks")
    with pytest.raises(DatasetNotFoundError, match="boxes file not found"):
        get_dataset("folder", images=images, boxes=tmp_path / "none.csv")
    with pytest.raises(ValueError, match="needs the option images"):
        get_dataset("folder")


def test_a_mask_folder_inside_the_images_folder_is_not_read_as_images(tmp_path):
    images = many(tmp_path, 2)
    for number in range(2):
        write(images / "masks" / f"im{number}.png", rect_mask())
    data = get_dataset("folder", images=images, masks=images / "masks", preprocess=plain(16))
    assert data.files == ["im0.png", "im1.png"] and data[1]["mask"].any()


# ------------------------------------------------------------------------------------------ subsets and the bench

def test_get_dataset_serves_seeded_subsets(tmp_path):
    images = many(tmp_path, 9)
    full = get_dataset("folder", images=images, preprocess=plain(16))
    subset = get_dataset("folder", images=images, preprocess=plain(16), n=4, seed=3)
    chosen = choose_indices(9, 4, 3).tolist()
    assert len(subset) == 4 and [subset[i]["id"] for i in range(4)] == [full.files[i] for i in chosen]
    again = get_dataset("folder", images=images, preprocess=plain(16), n=4, seed=3)
    assert [again[i]["id"] for i in range(4)] == [subset[i]["id"] for i in range(4)]
    picked = get_dataset("folder", images=images, preprocess=plain(16), indices=[8, 0])
    assert [picked[i]["id"] for i in range(2)] == ["im8.png", "im0.png"]
    with pytest.raises(ValueError, match="has no split 'val'"):
        get_dataset("folder", split="val", images=images)


def test_bench_runs_on_a_folder_with_masks_and_boxes(tmp_path, monkeypatch):
    from vitexplain.bench import BenchConfig, run_benchmark

    monkeypatch.chdir(tmp_path)  # the config's relative paths are read from the working directory
    rows = ["file,x0,y0,x1,y1"]
    for number, (digit, rect) in enumerate([("3", (20, 30, 70, 90)), ("3", (40, 10, 110, 60)),
                                            ("7", (5, 5, 60, 100)), ("7", (60, 40, 115, 95))]):
        name = f"{digit}/img{number}.png"  # 120 x 100: resized to 134 x 112 and centre-cropped for digits_vit
        white_on_black = picture(120, 100, rect, colour=(255, 255, 255), background=(0, 0, 0))
        write(tmp_path / "data" / "images" / name, white_on_black)
        write(tmp_path / "data" / "masks" / name, rect_mask(120, 100, rect))
        rows.append(f"{name},{','.join(map(str, rect))}")
    (tmp_path / "data" / "boxes.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "bench.yaml").write_text(
        "models: [digits_vit]\nmethods: [raw_attention, gae]\nmetrics: [segmentation, pointing_game, sparseness]\n"
        "dataset: {name: folder, options: {images: data/images, masks: data/masks, labels: subfolders,\n"
        "                                  class_names: model, boxes: data/boxes.csv}}\n"
        "batch_size: 3\noutput_dir: out\nprogress: false\ndevice: cpu\ngallery: 0\n")
    config = BenchConfig.from_yaml(tmp_path / "bench.yaml")
    result = run_benchmark(config)
    assert result.errors == []
    for method in ("raw_attention", "gae"):
        assert result.images["digits_vit"][method] == {"segmentation": 4, "pointing_game": 4, "sparseness": 4}
        scores = result.scores["digits_vit"][method]
        assert all(math.isfinite(value) for metric in scores.values() for value in metric.values()), scores
        assert scores["pointing_game"]["included"] + scores["pointing_game"]["excluded"] == 4
    # labels: the model's class names '0'..'9', so folder 3 is class 3 (not 0, as sorted folders alone would give)
    data = get_dataset("folder", images="data/images", labels="subfolders", class_names="model",
                       preprocess={"input_size": (3, 112, 112), "class_names": [str(d) for d in range(10)]})
    assert data.labels == [3, 3, 7, 7]
