"""File-based loaders on small fixtures written in each dataset's own format."""
from __future__ import annotations

import collections
import pickle

import h5py
import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image

from vitexplain.datasets import DatasetFormatError, DatasetNotFoundError, Preprocess, collate, get_dataset


def identity(height: int, width: int) -> Preprocess:
    """Keeps the source pixels: output size = source size, no resampling, no normalisation."""
    return Preprocess(size=(height, width), crop_pct=1.0, crop_mode="squash", interpolation="nearest",
                      mean=(0, 0, 0), std=(1, 1, 1))


def write_image(path, width=24, height=16, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), value, dtype=np.uint8)).save(path)


# ------------------------------------------------------------------------------------------ ImageNet
# facts of ImageNet-1k (torchvision / timm class order): tench n01440764 = 0, goldfish n01443537 = 1,
# kit fox n02119789 = 278, toilet tissue n15075141 = 999

def test_imagenet_class_folders(tmp_path):
    for wnid, names in {"n15075141": ["b.JPEG"], "n01443537": ["d.JPEG", "c.JPEG"], "n01440764": ["a.jpg"]}.items():
        for name in names:
            write_image(tmp_path / "val" / wnid / name)
    (tmp_path / "val" / "n01440764" / "notes.txt").write_text("not an image")
    data = get_dataset("imagenet", tmp_path, preprocess=identity(16, 24))
    samples = [data[i] for i in range(len(data))]
    assert [(s["id"], s["label"]) for s in samples] == [("a", 0), ("c", 1), ("d", 1), ("b", 999)]
    assert samples[0]["image"].shape == (3, 16, 24) and "boxes" not in samples[0]


def test_imagenet_unknown_wnid_folder(tmp_path):
    write_image(tmp_path / "val" / "n99999999" / "x.JPEG")
    with pytest.raises(DatasetFormatError, match="n99999999.*not one of the 1000"):
        get_dataset("imagenet", tmp_path)


def kaggle_layout(root):
    """Flat images under ILSVRC/Data/CLS-LOC/val, LOC_val_solution.csv, XML boxes."""
    images = root / "ILSVRC" / "Data" / "CLS-LOC" / "val"
    for number, value in ((1, 10), (2, 20), (3, 30)):
        write_image(images / f"ILSVRC2012_val_{number:08d}.JPEG", width=40, height=20, value=value)
    (root / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000002,n01440764 4 2 20 10 \n"
        "ILSVRC2012_val_00000001,n02119789 0 0 40 20 n02119789 10 5 30 15 \n"
        "ILSVRC2012_val_00000003,n01440764 8 4 16 12 \n")
    annotations = root / "ILSVRC" / "Annotations" / "CLS-LOC" / "val"
    annotations.mkdir(parents=True)
    objects = {1: [("n02119789", (2, 4, 22, 14))],
               2: [("n01440764", (4, 2, 20, 10)), ("n01443537", (0, 0, 10, 10))],  # second: another class
               3: [("n01440764", (16, 8, 32, 24))]}                              # xml size: 80 x 40
    for number, items in objects.items():
        width, height = (80, 40) if number == 3 else (40, 20)
        boxes = "".join(f"<object><name>{name}</name><bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin>"
                        f"<xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>" for name, b in items)
        (annotations / f"ILSVRC2012_val_{number:08d}.xml").write_text(
            f"<annotation><filename>ILSVRC2012_val_{number:08d}</filename><size><width>{width}</width>"
            f"<height>{height}</height><depth>3</depth></size>{boxes}</annotation>")
    return annotations


def test_imagenet_flat_with_solution_csv_and_xml_boxes(tmp_path):
    kaggle_layout(tmp_path)
    # squash 40 x 20 -> 20 x 20: x halves, y stays
    data = get_dataset("imagenet", tmp_path, boxes=True, preprocess=identity(20, 20))
    samples = [data[i] for i in range(3)]
    # order: (class index, file name): tench images 2 and 3, then the kit fox
    assert [(s["id"][-1], s["label"]) for s in samples] == [("2", 0), ("3", 0), ("1", 278)]
    assert torch.allclose(samples[0]["boxes"], torch.tensor([[2.0, 2, 10, 10]]))   # goldfish box dropped
    assert torch.allclose(samples[1]["boxes"], torch.tensor([[4.0, 4, 8, 12]]))    # xml size 80 x 40 rescaled
    assert torch.allclose(samples[2]["boxes"], torch.tensor([[1.0, 4, 11, 14]]))
    batch = collate([data[i] for i in range(3)])
    assert batch["labels"].tolist() == [0, 0, 278] and len(batch["boxes"]) == 3


def test_imagenet_boxes_from_csv_without_xml(tmp_path):
    annotations = kaggle_layout(tmp_path)
    for xml in annotations.iterdir():
        xml.unlink()
    annotations.rmdir()
    data = get_dataset("imagenet", tmp_path, boxes=True, preprocess=identity(20, 20),
                       images_dir=tmp_path / "ILSVRC" / "Data" / "CLS-LOC" / "val")
    assert torch.allclose(data[0]["boxes"], torch.tensor([[2.0, 2, 10, 10]]))
    assert torch.allclose(data[2]["boxes"], torch.tensor([[0.0, 0, 20, 20], [5, 5, 15, 15]]))


def test_imagenet_malformed_xml_and_csv(tmp_path):
    annotations = kaggle_layout(tmp_path)
    (annotations / "ILSVRC2012_val_00000002.xml").write_text("<annotation><size><width>40</width></size>")
    data = get_dataset("imagenet", tmp_path, boxes=True)
    with pytest.raises(DatasetFormatError, match="ILSVRC2012_val_00000002.xml"):
        data[0]
    (tmp_path / "LOC_val_solution.csv").write_text("image,label\nILSVRC2012_val_00000001,n02119789 0 0 1 1\n")
    with pytest.raises(DatasetFormatError, match="LOC_val_solution.csv.*header"):
        get_dataset("imagenet", tmp_path)


def devkit_layout(root):
    images = root / "ILSVRC2012_img_val"
    for number in (1, 2, 3):
        write_image(images / f"ILSVRC2012_val_{number:08d}.JPEG")
    data = root / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    # ILSVRC2012_IDs are not in wnid order: ID 1 is the kit fox, ID 2 the tench; 1001 is an inner node
    synsets = np.zeros((3, 1), dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O"), ("num_children", "O")])
    synsets[0, 0], synsets[1, 0], synsets[2, 0] = (1, "n02119789", 0), (2, "n01440764", 0), (1001, "n00001740", 5)
    scipy.io.savemat(data / "meta.mat", {"synsets": synsets})
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("2\n1\n2\n")
    return data


def test_imagenet_flat_with_devkit_ground_truth(tmp_path):
    devkit_layout(tmp_path)
    data = get_dataset("imagenet", tmp_path, preprocess=identity(16, 24))
    assert [(data[i]["id"], data[i]["label"]) for i in range(3)] == [
        ("ILSVRC2012_val_00000001", 0), ("ILSVRC2012_val_00000003", 0), ("ILSVRC2012_val_00000002", 278)]
    subset = get_dataset("imagenet", tmp_path, n=2, seed=5)
    assert len(subset) == 2 and subset.indices.tolist() == sorted(subset.indices.tolist())
    assert get_dataset("imagenet", tmp_path, indices=[2, 0])[0]["label"] == 278


def test_imagenet_missing_files_name_the_file_and_layout(tmp_path):
    data = devkit_layout(tmp_path)
    (data / "meta.mat").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"(?s)meta\.mat.*expected layout:.*synsets"):
        get_dataset("imagenet", tmp_path)
    (data / "ILSVRC2012_validation_ground_truth.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"(?s)LOC_val_solution\.csv.*expected layout"):
        get_dataset("imagenet", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"(?s)wnid folders.*expected layout:.*class folders"):
        get_dataset("imagenet", tmp_path / "empty")
    write_image(tmp_path / "f" / "val" / "n01440764" / "a.JPEG")
    with pytest.raises(DatasetNotFoundError, match=r"(?s)boxes=True.*Annotations/CLS-LOC/val"):
        get_dataset("imagenet", tmp_path / "f", boxes=True)


def test_imagenet_devkit_label_outside_meta(tmp_path):
    data = devkit_layout(tmp_path)
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("2\n7\n2\n")
    with pytest.raises(DatasetFormatError, match="ground_truth.txt.*ILSVRC2012_ID 7"):
        get_dataset("imagenet", tmp_path)


# ------------------------------------------------------------------------------- ImageNet-Segmentation

def write_gtsegs(path, images, masks):
    """The layout MATLAB v7.3 writes for struct 'value' with cell fields img and gt (column-major arrays)."""
    with h5py.File(path, "w") as handle:
        refs = handle.create_group("#refs#")
        img_refs, gt_refs = [], []
        for i, (image, mask) in enumerate(zip(images, masks)):
            img_refs.append(refs.create_dataset(f"img{i}", data=image.T).ref)       # H x W x 3 -> [3, W, H]
            mask_set = refs.create_dataset(f"mask{i}", data=mask.T)                 # H x W -> [W, H]
            cell = refs.create_dataset(f"cell{i}", shape=(1, 1), dtype=h5py.ref_dtype)
            cell[0, 0] = mask_set.ref
            gt_refs.append(cell.ref)
        value = handle.create_group("value")
        for name, column in (("img", img_refs), ("gt", gt_refs)):
            dataset = value.create_dataset(name, shape=(len(column), 1), dtype=h5py.ref_dtype)
            for i, ref in enumerate(column):
                dataset[i, 0] = ref


def seg_fixture(count=3):
    rng = np.random.default_rng(0)
    shapes = [(20, 30), (18, 18), (12, 28)][:count]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    masks = []
    for h, w in shapes:
        mask = np.zeros((h, w), dtype=np.uint8)
        mask[2: h // 2, 3: w - 4] = 1           # asymmetric, so a transposition would show
        masks.append(mask)
    return images, masks


def test_imagenet_seg_reads_matlab_layout(tmp_path):
    images, masks = seg_fixture()
    write_gtsegs(tmp_path / "gtsegs_ijcv.mat", images, masks)
    for i, (image, mask) in enumerate(zip(images, masks)):
        h, w = mask.shape
        data = get_dataset("imagenet_seg", tmp_path, preprocess=identity(h, w))
        sample = data[i]
        assert sample["label"] == -1 and sample["id"] == f"gtsegs_ijcv_{i:04d}"
        assert torch.allclose(sample["image"], torch.from_numpy(image).permute(2, 0, 1).float() / 255)
        assert sample["mask"].dtype == torch.bool and torch.equal(sample["mask"], torch.from_numpy(mask > 0))
    default = get_dataset("imagenet_seg", tmp_path / "gtsegs_ijcv.mat", n=2)
    assert len(default) == 2 and default[0]["image"].shape == (3, 224, 224) and default[0]["mask"].shape == (224, 224)


def test_imagenet_seg_missing_and_malformed(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"(?s)gtsegs_ijcv\.mat.*expected layout:.*value/img"):
        get_dataset("imagenet_seg", tmp_path)
    (tmp_path / "gtsegs_ijcv.mat").write_bytes(b"MATLAB 5.0 MAT-file, not HDF5")
    with pytest.raises(DatasetFormatError, match="not an HDF5"):
        get_dataset("imagenet_seg", tmp_path)
    with h5py.File(tmp_path / "gtsegs_ijcv.mat", "w") as handle:
        handle.create_dataset("value/img", data=np.zeros((2, 1)))
    with pytest.raises(DatasetFormatError, match="value/gt"):
        get_dataset("imagenet_seg", tmp_path)
    with h5py.File(tmp_path / "gtsegs_ijcv.mat", "w") as handle:
        handle.create_dataset("value/img", data=np.zeros((2, 1)))
        handle.create_dataset("value/gt", data=np.zeros((2, 1)))
    data = get_dataset("imagenet_seg", tmp_path)
    with pytest.raises(DatasetFormatError, match="entry 1.*object reference"):
        data[1]


# ------------------------------------------------------------------------------------------- VOC

def save_palette_png(path, classes):
    """A palette PNG of class indices, as VOC ships (a full palette, so PIL keeps the indices)."""
    png = Image.fromarray(classes, mode="P")
    png.putpalette(np.random.default_rng(1).integers(0, 256, 768).astype(np.uint8).tolist())
    path.parent.mkdir(parents=True, exist_ok=True)
    png.save(path)


def voc_fixture(root):
    base = root / "VOCdevkit" / "VOC2012"
    (base / "ImageSets" / "Segmentation").mkdir(parents=True)
    (base / "ImageSets" / "Segmentation" / "val.txt").write_text("2007_000001\n2007_000002\n")
    class_masks = {}
    for name, value in (("2007_000001", 90), ("2007_000002", 160)):
        write_image(base / "JPEGImages" / f"{name}.jpg", width=20, height=12, value=value)
        classes = np.zeros((12, 20), dtype=np.uint8)
        if name == "2007_000001":
            classes[2:10, 1:9] = 15      # person, 64 px
            classes[3:6, 12:18] = 8      # cat, 18 px
            classes[1, :] = 255          # void row
        save_palette_png(base / "SegmentationClass" / f"{name}.png", classes)
        class_masks[name] = classes
    return base, class_masks


def test_voc_class_masks(tmp_path):
    base, class_masks = voc_fixture(tmp_path)
    data = get_dataset("voc", tmp_path, preprocess=identity(12, 20))
    first, second = data[0], data[1]
    expected = torch.from_numpy(class_masks["2007_000001"])
    assert torch.equal(first["class_mask"], expected)
    assert torch.equal(first["mask"], (expected > 0) & (expected < 255))
    assert torch.equal(first["ignore"], expected == 255)
    assert first["classes"].tolist() == [7, 14] and first["label"] == 14          # 0-based: cat 7, person 14
    assert second["classes"].tolist() == [] and second["label"] == -1 and not second["mask"].any()
    batch = collate([first, second])
    assert batch["masks"].shape == (2, 12, 20) and batch["classes"][0].tolist() == [7, 14]
    assert len(get_dataset("voc", base)) == 2                                      # root may be VOC2012 itself


def test_voc_missing_and_malformed(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"(?s)ImageSets/Segmentation.*expected layout:.*SegmentationClass"):
        get_dataset("voc", tmp_path)
    base, _ = voc_fixture(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="train.txt"):
        get_dataset("voc", tmp_path, split="train")
    Image.fromarray(np.zeros((12, 20, 3), dtype=np.uint8)).save(base / "SegmentationClass" / "2007_000001.png")
    with pytest.raises(DatasetFormatError, match="2007_000001.png.*palette"):
        get_dataset("voc", tmp_path)[0]
    save_palette_png(base / "SegmentationClass" / "2007_000002.png", np.full((12, 20), 30, dtype=np.uint8))
    with pytest.raises(DatasetFormatError, match="2007_000002.png.*class index 30"):
        get_dataset("voc", tmp_path)[1]


# ------------------------------------------------------------------------------------------ CIFAR

def cifar_pixels(count):
    """Data rows built pixel by pixel: value(channel, row, col) at channel * 1024 + row * 32 + col."""
    data = np.zeros((count, 3072), dtype=np.uint8)
    for i in range(count):
        for channel in range(3):
            for row in range(32):
                for col in range(32):
                    data[i, channel * 1024 + row * 32 + col] = (i * 50 + channel * 80 + row * 3 + col) % 256
    return data


def write_pickle(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        pickle.dump(content, handle, protocol=2)


@pytest.mark.parametrize("name,folder,test_file,label_key,meta_file,names_key,classes", [
    ("cifar10", "cifar-10-batches-py", "test_batch", "labels", "batches.meta", "label_names", 10),
    ("cifar100", "cifar-100-python", "test", "fine_labels", "meta", "fine_label_names", 100),
])
def test_cifar_pickles(tmp_path, name, folder, test_file, label_key, meta_file, names_key, classes):
    data = cifar_pixels(3)
    labels = [classes - 1, 0, 4]
    write_pickle(tmp_path / folder / test_file, {"batch_label": "testing batch 1 of 1", label_key: labels,
                                                 "data": data, "filenames": ["a.png", "b.png", "c.png"]})
    write_pickle(tmp_path / folder / meta_file, {names_key: [f"class{i}" for i in range(classes)]})
    dataset = get_dataset(name, tmp_path, preprocess=identity(32, 32))
    for i in range(3):
        sample = dataset[i]
        expected = torch.tensor([[[(i * 50 + c * 80 + r * 3 + k) % 256 for k in range(32)] for r in range(32)]
                                 for c in range(3)], dtype=torch.float32) / 255
        assert torch.allclose(sample["image"], expected) and sample["label"] == labels[i]
        assert sample["id"] == f"test_{i:05d}"
    assert dataset.class_names[-1] == f"class{classes - 1}"
    assert get_dataset(name, tmp_path)[0]["image"].shape == (3, 224, 224)


def test_cifar_missing_and_malformed(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"(?s)test_batch.*expected layout:.*cifar-10-batches-py"):
        get_dataset("cifar10", tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    write_pickle(folder / "test_batch", ["not", "a", "dict"])
    with pytest.raises(DatasetFormatError, match="test_batch.*expected a dict"):
        get_dataset("cifar10", tmp_path)
    write_pickle(folder / "test_batch", collections.OrderedDict(data=np.zeros((1, 3072), np.uint8), labels=[0]))
    with pytest.raises(DatasetFormatError, match="test_batch.*refusing to load collections.OrderedDict"):
        get_dataset("cifar10", tmp_path)
    write_pickle(folder / "test_batch", {"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]})
    write_pickle(folder / "batches.meta", {"label_names": ["a", "b"]})
    with pytest.raises(DatasetFormatError, match="uint8 \\[N, 3072\\]"):
        get_dataset("cifar10", tmp_path)
    write_pickle(folder / "test_batch", {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 5]})
    with pytest.raises(DatasetFormatError, match=r"labels must lie in \[0, 2\)"):
        get_dataset("cifar10", tmp_path)
