"""Property-based checks of what users hand the library (issue 41): whatever the shapes, dtypes, devices and values
of the maps, images, targets and masks given to ``vitexplain.evaluate`` and ``vitexplain.explain``, or the files of a
``folder`` dataset, the answer is a correct result or one line of the library's own refusal (raised by a ``raise`` of
vitexplain, of a user-error type) — never a raw error from deep inside, never a silently changed number, and the
caller's tensors unchanged. Hypothesis draws the cases (derandomized: the same cases on every run and in CI).
"""
from __future__ import annotations

import csv
import functools
import math
import tempfile
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

import vitexplain
from vitexplain.datasets import get_dataset
from vitexplain.datasets.base import DatasetFormatError, DatasetNotFoundError
from vitexplain.image_files import ImageLoadError
from vitexplain.maps import resize

from conftest import make_vit

#: what the library raises for what a user gave (InvalidOption, DatasetFormatError, ImageLoadError are of these)
USER_ERRORS = (ValueError, TypeError)
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
FLOATS = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
DTYPES = [*FLOATS, "int32", "int64", "bool"]
#: values planted in a map or an image: none, a NaN, an infinity, beyond float32, below float32's smallest
SPECIALS = [None, math.nan, math.inf, -math.inf, 1e300, 1e-300]
IMAGE = 32  # the tiny ViT's input size (tests/conftest.py)


@functools.cache
def model() -> torch.nn.Module:
    return make_vit()


@functools.cache
def images(count: int) -> torch.Tensor:
    return torch.randn(count, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(count))


def refused_in_one_line(error: BaseException) -> None:
    """``error`` is the library's refusal: a user-error type, one line, raised by a ``raise`` statement of vitexplain
    (not a raw IndexError / RuntimeError of torch, nor a TypeError of Python deep inside)."""
    assert isinstance(error, USER_ERRORS), f"{type(error).__name__}: {error}"
    message = str(error)
    assert message.strip() and "\n" not in message, message
    frame = traceback.extract_tb(error.__traceback__)[-1]
    assert "/vitexplain/" in frame.filename.replace("\\", "/") and (frame.line or "").lstrip().startswith("raise"), \
        f"raised at {frame.filename}:{frame.lineno} ({frame.line}): {type(error).__name__}: {message}"


def attempt(problems: list[str], call):
    """``call()``: refused in one line exactly when ``problems`` lists something, else its result (None refused)."""
    try:
        found = call()
    except Exception as error:  # noqa: BLE001 - what it raised is the property
        event("refused")
        refused_in_one_line(error)
        assert problems, f"refused a valid call: {error}"
        return None
    event("accepted")
    assert not problems, f"accepted {problems}"
    return found


def array(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` (float64) in ``dtype``, as a user would have them (overflowing float16 to inf as numpy does)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bool":
            return values > 0
        if dtype.startswith("int"):
            return np.nan_to_num(values, nan=0, posinf=0, neginf=0).clip(-1e6, 1e6).round().astype(dtype)
        return values.astype(FLOATS[dtype])


def plain_gini(maps: np.ndarray, size: int) -> np.ndarray:
    """The Gini index of each map (Chalasani et al.; shifted to >= 0, + 1e-7), computed here in float64 from the
    float32 maps upsampled to the image size."""
    up = resize(torch.from_numpy(maps.astype(np.float32)), (size, size)).double().flatten(1).numpy()
    up = up - up.min(1, keepdims=True) + 1e-7
    up.sort(1)
    n = up.shape[1]
    index = np.arange(1, n + 1)
    return ((2 * index - n - 1) * up).sum(1) / (n * up.sum(1))


maps_cases = st.fixed_dictionaries({
    "count": st.integers(1, 3), "extra": st.sampled_from([0] * 6 + [1, -1]),
    "size": st.sampled_from([(4, 4), (1, 1), (3, 5), (IMAGE, IMAGE), (7, 2)]),
    "ndim": st.sampled_from([3] * 6 + [2, 4]), "dtype": st.sampled_from(DTYPES),
    "kind": st.sampled_from(["tensor"] * 3 + ["numpy"] * 3 + ["list", "meta"]),
    "special": st.sampled_from([None] * 5 + SPECIALS[1:]), "scale": st.sampled_from([1.0, 1e-3, 1e6, 1e30]),
    "seed": st.integers(0, 3),
})


@settings(max_examples=40, **SETTINGS)
@given(case=maps_cases)
def test_evaluate_scores_maps_of_any_dtype_as_float32_or_refuses_them_in_one_line(case):
    """``evaluate(..., "sparseness")`` on maps of any shape, dtype (float16/32/64, int, bool), container (tensor,
    numpy array, list) and device (cpu, meta), with a NaN, an infinity or a value beyond float32 planted: the values
    are a plain float64 Gini index of the maps as float32 (a numpy array, an int or a bool map scores as its float32
    copy), else one line of refusal, which every unscorable case gets. Tries 40 cases."""
    count = case["count"]
    rng = np.random.default_rng(case["seed"])
    shape = (count + case["extra"], *case["size"])[3 - case["ndim"]:] if case["ndim"] <= 3 else \
        (count + case["extra"], 1, *case["size"])
    values = rng.standard_normal(shape) * case["scale"]
    if case["special"] is not None and values.size:
        values.flat[rng.integers(values.size)] = case["special"]
    given_maps = array(values, case["dtype"])
    if case["kind"] == "tensor":
        maps = torch.from_numpy(given_maps)
    elif case["kind"] == "meta":
        maps = torch.from_numpy(given_maps).to("meta")
    elif case["kind"] == "list":
        maps = given_maps.tolist()
    else:
        maps = given_maps
    before = given_maps.copy()
    with np.errstate(over="ignore", under="ignore"):
        as32 = given_maps.astype(np.float32)
        scorable = (case["kind"] in ("tensor", "numpy") and case["ndim"] == 3 and case["extra"] == 0
                    and np.isfinite(given_maps.astype(np.float64)).all() and np.isfinite(as32).all()
                    and ((as32 == 0) == (given_maps == 0)).all())
    try:
        scores = vitexplain.evaluate(model(), images(count), maps, "sparseness")
    except Exception as error:  # noqa: BLE001 - what it raised is the property
        event("refused")
        refused_in_one_line(error)
        assert not scorable, f"refused scorable maps: {error}"
    else:
        event("scored")
        assert scorable, "scored maps it should have refused"
        np.testing.assert_allclose(scores.values["sparseness"].numpy(), plain_gini(as32, IMAGE), rtol=1e-9, atol=1e-12)
        assert scores.images == count
    np.testing.assert_array_equal(given_maps, before)


evaluate_cases = st.fixed_dictionaries({
    "count": st.integers(1, 3),
    "targets": st.sampled_from([None, None, 0, 3, 9, "list", "list", "int32", -1, 10, 12, "short", "float", "bool",
                                "meta", "big"]),
    "labels": st.sampled_from([None, None, "good", "unknown", "out"]),
    "batch_size": st.sampled_from([1, 2, 3, 32, 32, 0, -1, 2.5, True, None, "2"]),
    "metrics": st.sampled_from(["sparseness", "segmentation", ("sparseness", "segmentation"), ("insertion_deletion",),
                                ("segmentation", "insertion_deletion"), (), ("sparseness", "sparseness"),
                                ["segmentation", "insertion_deletion", "segmentation"]]),
    "mask_size": st.sampled_from([IMAGE] * 5 + [16, 33]),
    "mask_dtype": st.sampled_from(["bool"] * 4 + ["uint8", "float32", "halves", "meta", "numpy"]),
})


@settings(max_examples=60, **SETTINGS)
@given(case=evaluate_cases)
def test_evaluate_checks_targets_labels_masks_batch_size_and_metrics_at_the_door(case):
    """``evaluate`` with targets (None, an int in or out of the 10 classes, a list, int32 / float / bool / meta tensors,
    one too few), labels (in or out of the classes, -1), ``batch_size`` (0, -1, 2.5, True, None, text), metric lists
    (empty, repeated) and masks (another size; bool, uint8 / float 0-1, halves, meta, numpy): a valid call gives each
    metric one value per image, the same as the canonical call (targets as a long tensor, bool masks, batch_size 32),
    and every invalid one is refused in one line before any metric runs. Tries 60 cases."""
    count = case["count"]
    batch = images(count)
    maps = torch.rand(count, 4, 4, generator=torch.Generator().manual_seed(3))
    problems = []
    targets, canonical = case["targets"], None
    if isinstance(targets, int):
        canonical = torch.full((count,), targets)
        if not 0 <= targets < 10:
            problems.append("target out of classes")
    elif targets == "list":
        targets = [i % 10 for i in range(count)]
        canonical = torch.tensor(targets)
    elif targets == "short":
        targets = list(range(count - 1))
        problems.append("one target too few")
    elif targets == "int32":
        targets = torch.arange(count, dtype=torch.int32)
        canonical = targets.long()
    elif targets == "big":
        targets = torch.tensor([3] * (count - 1) + [10])
        problems.append("target out of classes")
    elif targets is not None:
        targets = {"float": torch.zeros(count), "bool": torch.ones(count, dtype=torch.bool),
                   "meta": torch.zeros(count, dtype=torch.long, device="meta")}[targets]
        problems.append(f"targets of dtype {targets.dtype} on {targets.device}")
    labels = {None: None, "good": [1] * count, "unknown": [-1] * count, "out": [10] * count}[case["labels"]]
    if case["labels"] == "out":
        problems.append("label out of classes")
    size = case["mask_size"]
    truth_masks = torch.rand(count, size, size, generator=torch.Generator().manual_seed(5)) > 0.5
    masks = {"bool": truth_masks, "uint8": truth_masks.to(torch.uint8), "float32": truth_masks.float(),
             "halves": truth_masks.float() / 2, "meta": truth_masks.to("meta"),
             "numpy": truth_masks.numpy()}[case["mask_dtype"]]
    names = [case["metrics"]] if isinstance(case["metrics"], str) else list(case["metrics"])
    if size != IMAGE or case["mask_dtype"] in ("halves", "meta"):
        problems.append("masks that do not fit (checked whether a metric reads them or not)")
    if not names or len(set(names)) < len(names):
        problems.append("metrics empty or repeated")
    batch_size = case["batch_size"]
    if not (isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size >= 1):
        problems.append(f"batch_size {batch_size!r}")
    kept = [batch.clone(), maps.clone(), truth_masks.clone()]
    call = dict(truth={"masks": masks}, mean=(0.5,) * 3, std=(0.5,) * 3,
                **({"n_steps": 2} if "insertion_deletion" in names else {}))
    scores = attempt(problems, lambda: vitexplain.evaluate(model(), batch, maps, case["metrics"], targets,
                                                           labels=labels, batch_size=batch_size, **call))
    if scores is not None:
        found = {names[0]: scores} if isinstance(case["metrics"], str) else scores
        reference = vitexplain.evaluate(model(), batch, maps, names, canonical, labels=labels,
                                        **{**call, "truth": {"masks": truth_masks}})
        assert set(found) == set(names)
        for name in names:
            for key, value in found[name].values.items():
                assert value.shape[0] == count
                # equal up to float32 rounding: another batch_size forwards the perturbed copies in other batches
                torch.testing.assert_close(value, reference[name].values[key], rtol=1e-6, atol=1e-6, equal_nan=True)
    for tensor, original in zip((batch, maps, truth_masks), kept):
        assert torch.equal(tensor, original)


explain_cases = st.fixed_dictionaries({
    "count": st.integers(1, 3), "channels": st.sampled_from([3] * 6 + [1, 4]),
    "size": st.sampled_from([IMAGE] * 6 + [16, 33]), "dtype": st.sampled_from(["float32"] * 3 + DTYPES),
    "kind": st.sampled_from(["tensor"] * 6 + ["numpy", "meta", "empty"]),
    "special": st.sampled_from([None] * 5 + [math.nan, math.inf, 1e300]),
    "target": st.sampled_from([None, None, 0, 9, "list", -1, 10, "short", "float-list", "bool"]),
    "method": st.sampled_from(["gae", "rollout", "rise"]),
    "batch_size": st.sampled_from([None, None, 2, 0, -1, 2.5]),
})


@settings(max_examples=30, **SETTINGS)
@given(case=explain_cases)
def test_explain_gives_finite_maps_of_the_grid_or_refuses_in_one_line(case):
    """``explain`` on images of any channel count, size, dtype (float16/32/64, int, bool), container and device (cpu,
    meta, an empty batch), with a NaN, an infinity or a value beyond float32 planted, targets in or out of the 10
    classes (ints, lists, floats, bools) and RISE's ``batch_size`` (2, 0, -1, 2.5): a valid call gives finite float32
    maps [B, 4, 4], the same as for the images as float32 (a float16 / float64 batch is seen in float32), the images
    unchanged; every other is refused in one line. Tries 30 cases."""
    count = 0 if case["kind"] == "empty" else case["count"]
    rng = np.random.default_rng(count)
    values = rng.standard_normal((count, case["channels"], case["size"], case["size"]))
    if case["special"] is not None and count:
        values.flat[rng.integers(values.size)] = case["special"]
    given_images = array(values, case["dtype"])
    inputs = given_images if case["kind"] == "numpy" else torch.from_numpy(given_images)
    inputs = inputs.to("meta") if case["kind"] == "meta" else inputs
    before = given_images.copy()
    problems = []
    if case["kind"] in ("numpy", "meta", "empty"):
        problems.append(case["kind"])
    if case["channels"] != 3 or case["size"] != IMAGE:
        problems.append("shape")
    if case["dtype"] not in FLOATS:
        problems.append("not float")
    with np.errstate(over="ignore"):
        if not np.isfinite(given_images.astype(np.float32)).all():
            problems.append("not finite in float32")
    target = case["target"]
    if isinstance(target, int) and not 0 <= target < 10:
        problems.append("target out of classes")
    elif target == "list":
        target = [i % 10 for i in range(count)]
    elif target == "short":
        target = list(range(count + 1))
        problems.append("targets not one per image")
    elif target == "float-list":
        target = [0.5] * count
        problems.append("float targets")
    elif target == "bool":
        target = torch.ones(count, dtype=torch.bool)
        problems.append("bool targets")
    options = {"n_masks": 4, "seed": 0} if case["method"] == "rise" else {}
    if case["batch_size"] is not None and case["method"] == "rise":
        options["batch_size"] = case["batch_size"]
        if not (isinstance(case["batch_size"], int) and case["batch_size"] >= 1):
            problems.append("batch_size")
    maps = attempt(problems, lambda: vitexplain.explain(model(), inputs, case["method"], target=target, **options))
    if maps is not None:
        assert maps.shape == (count, 4, 4) and maps.dtype == torch.float32 and torch.isfinite(maps).all()
        as32 = torch.from_numpy(given_images.astype(np.float32))
        torch.testing.assert_close(maps, vitexplain.explain(model(), as32, case["method"], target=target, **options))
    np.testing.assert_array_equal(given_images, before)


def nan_where_bright(adapter, images, target=None):
    """A plug-in's method gone wrong: the mean of the channels, NaN on images brighter than 0 on average."""
    maps = images.mean(1)
    maps[images.mean((1, 2, 3)) > 0] = math.nan
    return maps


def test_explain_files_and_the_cli_refuse_non_finite_maps_per_image_and_method(tmp_path, capsys):
    """A method returning NaN maps for some images: ``explain`` refuses the batch naming the method and the images,
    as the bench refuses such maps; ``explain_files`` and ``vitexplain explain`` lose that method's map of those images
    alone (one error line each, exit code 1), and the other images and methods are written."""
    from vitexplain.cli.main import main
    from vitexplain.file_explanations import explain_files
    from vitexplain.models import load_model
    from vitexplain.registry import METHODS, register_method

    register_method(resolution="pixel", reads="output", cost=1)(nan_where_bright)
    try:
        for name, grey in (("dark.png", 20), ("bright.png", 235), ("dim.png", 40)):
            Image.new("RGB", (40, 30), (grey,) * 3).save(tmp_path / name)
        model, config = load_model("digits_vit", device="cpu")
        batch = torch.stack([torch.full((3, 112, 112), -0.8), torch.full((3, 112, 112), 0.8)])
        with pytest.raises(ValueError, match=r"^method 'nan_where_bright': the map of image 1 contains NaN or inf"):
            vitexplain.explain(model, batch, "nan_where_bright")
        errors = []
        found = list(explain_files(
            model, [tmp_path / n for n in ("dark.png", "bright.png", "dim.png")], ["nan_where_bright", "rollout"],
            config=config, batch_size=3, on_error=errors.append))
        assert [sorted(item.maps) for item in found] == [["nan_where_bright", "rollout"], ["rollout"],
                                                        ["nan_where_bright", "rollout"]]
        assert errors == [f"method nan_where_bright on {tmp_path / 'bright.png'}: its map contains NaN or infinite "
                          "values"]
        assert all(torch.isfinite(m).all() for item in found for m in item.maps.values())
        out = tmp_path / "out"
        code = main(["explain", str(tmp_path / "dark.png"), str(tmp_path / "bright.png"), "--model", "digits_vit",
                     "--device", "cpu", "--method", "nan_where_bright", "--batch-size", "2", "--no-progress",
                     "-o", str(out)])
        printed = capsys.readouterr()
        assert code == 1
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [   # not its marker file
            "dark.nan_where_bright.npy", "dark.nan_where_bright.png"]
        assert [line for line in printed.err.splitlines() if line.startswith("error:")] == [
            f"error: method nan_where_bright on {tmp_path / 'bright.png'}: its map contains NaN or infinite values"]
        assert np.isfinite(np.load(out / "dark.nan_where_bright.npy")).all()
        with pytest.raises(ValueError, match="batch_size of explain_files must be an integer >= 1, got 0"):
            next(explain_files(model, [tmp_path / "dark.png"], ["rollout"],
                                                            config=config, batch_size=0))
        with pytest.raises(ValueError, match=r"^target 10 is not a class of this model \(it has 10 classes"):
            next(explain_files(model, [tmp_path / "dark.png"], ["rollout"],
                                                            config=config, target=10))
    finally:
        METHODS.remove("nan_where_bright")


MODES = ["RGB", "L", "RGBA", "P", "I;16", "F", "1", "CMYK", "LA"]

folder_cases = st.fixed_dictionaries({
    "files": st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["a", "b c", "ü", "x.y", "UP", "d/e", "f/a", "-1", ".hidden"]),
        "suffix": st.sampled_from([".png", ".PNG", ".tif", ".jpg", ".txt"]),
        "mode": st.sampled_from(MODES), "width": st.integers(1, 9), "height": st.integers(1, 9),
        "mask": st.sampled_from(["same", "same", "other size", "none", "not an image", "rgba"]),
        "label": st.sampled_from(["0", "3", "-1", "-2", "cat", "", None]),
        "broken": st.sampled_from([False, False, False, True]),
        "special": st.sampled_from([None, None, math.nan]),
    }), min_size=1, max_size=4, unique_by=lambda f: f["name"]),
    "masks": st.booleans(), "labels": st.booleans(),
})


def _write_image(path: Path, mode: str, width: int, height: int, seed: int, special: float | None) -> Path:
    """An image file of ``mode`` at ``path``, or beside it with a suffix that can hold the mode; the path written."""
    rng = np.random.default_rng(seed)
    if mode in ("F", "I;16", "CMYK"):
        path = path.with_suffix(".tif")
    elif path.suffix.lower() == ".jpg" and mode not in ("RGB", "L"):
        path = path.with_suffix(".png")
    if mode == "F":
        values = rng.standard_normal((height, width)).astype(np.float32)
        if special is not None:
            values[0, 0] = special
        Image.fromarray(values, mode="F").save(path)
    else:
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode).save(path)
    return path


@settings(max_examples=25, **SETTINGS)
@given(case=folder_cases)
def test_a_folder_dataset_serves_every_file_exactly_or_names_the_problem(case):
    """A ``folder`` dataset of 1-4 generated images (odd names: spaces, umlauts, dots, hidden, subfolders; modes RGB,
    L, RGBA, P, I;16, F with or without a NaN, 1, CMYK, LA; 1-9 pixels; broken files), with or without masks (same
    size, another size, missing, not an image, RGBA) and labels.csv (ints, -1, -2, names, empty, missing rows):
    either every served sample is an image [3, 8, 8] of finite values, a bool mask [8, 8] and the label the CSV gave,
    or building or loading is refused by the library's own error whose first line names the file. Tries 25 cases."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "images").mkdir()
        (root / "masks").mkdir()
        expected = {}
        rows = []
        for seed, file in enumerate(case["files"]):
            relative = file["name"] + file["suffix"]
            path = root / "images" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if file["broken"] or file["suffix"] == ".txt":
                path.write_text("not an image")
            else:
                path = _write_image(path, file["mode"], file["width"], file["height"], seed, file["special"])
            written = path.relative_to(root / "images").as_posix()
            expected[written] = file
            if file["label"] is not None:
                rows.append((written, file["label"]))
            if case["masks"] and file["mask"] != "none":
                mask = root / "masks" / Path(written).with_suffix(".png")
                mask.parent.mkdir(parents=True, exist_ok=True)
                if file["mask"] == "not an image":
                    mask.write_text("no mask")
                else:
                    size = (file["width"] + (file["mask"] == "other size"), file["height"])
                    mode = "RGBA" if file["mask"] == "rgba" else "L"
                    Image.new(mode, size, (255, 0, 0, 255) if mode == "RGBA" else 255).save(mask)
        if case["labels"]:
            with open(root / "labels.csv", "w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows([("file", "label"), *rows])
        options = dict(images=root / "images", preprocess={"input_size": (3, 8, 8), "mean": (0.5,) * 3,
                                                           "std": (0.5,) * 3, "crop_pct": 1.0})
        if case["masks"]:
            options["masks"] = root / "masks"
        if case["labels"]:
            options["labels"] = root / "labels.csv"
        try:
            dataset = get_dataset("folder", **options)
            samples = [dataset[i] for i in range(len(dataset))]
        except (DatasetFormatError, DatasetNotFoundError, ImageLoadError, ValueError) as error:
            first = str(error).splitlines()[0]
            assert str(root) in first or "class_names" in first, first
            frame = traceback.extract_tb(error.__traceback__)[-1]
            assert "/vitexplain/" in frame.filename.replace("\\", "/"), (frame, first)
            event("refused")
            return
        event("served")
        served = [name for name in expected if not name.split("/")[-1].startswith(".")
                  and not name.endswith(".txt")]
        assert sorted(sample["id"] for sample in samples) == sorted(served)
        texts = [expected[name]["label"] for name in served] if case["labels"] else []
        names = [] if all(text.lstrip("-").isdigit() for text in texts) else sorted(set(texts))
        for sample in samples:
            file = expected[sample["id"]]
            assert not file["broken"] and not (file["mode"] == "F" and file["special"] is not None)
            assert sample["image"].shape == (3, 8, 8) and torch.isfinite(sample["image"]).all()
            if case["masks"]:
                assert file["mask"] in ("same", "rgba")
                assert sample["mask"].dtype == torch.bool and sample["mask"].shape == (8, 8) and sample["mask"].all()
            if not case["labels"]:
                assert sample["label"] == -1
            elif names:
                assert sample["label"] == names.index(file["label"])
            else:
                assert sample["label"] == int(file["label"]) >= -1
