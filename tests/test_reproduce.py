"""Reproduction recipes: every table end to end on tiny fixtures in each dataset's own format."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import vitexplain.bench.plots
import vitexplain.reproduce
from vitexplain.cli.main import main
from vitexplain.datasets import available_datasets, get_dataset
from vitexplain.metrics import available_metrics
from vitexplain.registry import available_methods
from vitexplain.reproduce import (
    RecipeInputError,
    ReproducedTable,
    available_recipes,
    estimate_gpu_hours,
    get_recipe,
    plan_recipe,
    run_recipe,
)
from vitexplain.reproduce.data import PerClassItems
from vitexplain.reproduce.table import Cell

from conftest import make_vit
from test_datasets_files import kaggle_layout, seg_fixture, voc_fixture, write_gtsegs, write_pickle
from test_hf_bert import BERT_TINY, make_bert, make_tokenizer
from test_rationale_f1 import write_movies

TEXT_METHODS = available_methods("text")

PUBLISHED = Path(vitexplain.reproduce.__file__).parent / "published"
CLASSES = {"deit_base": 1000, "vit_base": 1000, "vit_large": 1000, "deit_cifar10": 10, "deit_cifar100": 100,
           "vit_voc": 20}
#: recipes whose rows index blocks up to 11 need 12-block stand-ins
DEEP = {"tokentm-table7", "gradtoken-fig11"}
#: test-only protocol: fewer masks, steps and samples
FAST_METHODS = {"tis": {"n_masks": 8}, "rise": {"n_masks": 8}, "integrated_gradients": {"n_steps": 2},
                "smoothgrad": {"n_samples": 2}, "tam": {"n_steps": 2}, "bt_head": {"n_steps": 2},
                "bt_token": {"n_steps": 2}}
FAST_METRICS = {"insertion_deletion": {"n_steps": 4}, "max_sensitivity": {"n_samples": 2}}


@pytest.fixture(autouse=True)
def no_curve_plots(monkeypatch):
    """The bench's PNG curves (tested with the bench, unused by the tables) take most of a tiny run's time."""
    monkeypatch.setattr(vitexplain.bench.plots, "draw_curves", lambda *args, **kwargs: b"<svg></svg>")


def published(name: str) -> dict:
    """The table's published numbers, read straight from the YAML file."""
    return yaml.safe_load((PUBLISHED / f"{name.split('-')[0]}.yaml").read_text())["tables"][name]


def stand_ins(name: str, inputs: dict[str, Path] | None = None) -> dict[str, torch.nn.Module | str]:
    """Tiny random models for the recipe's models; a tiny BERT's directory for the text model."""
    depth = 12 if name in DEEP else 2
    models = {key: make_vit(seed=i, depth=depth, num_classes=CLASSES[key])
              for i, key in enumerate(get_recipe(name).models()) if key in CLASSES}
    if "bert_movies" in get_recipe(name).models():
        models["bert_movies"] = str(inputs["movie_reviews"].parent / "bert")
    return models


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reproduce-data")
    (root / "seg").mkdir()
    write_gtsegs(root / "seg" / "gtsegs_ijcv.mat", *seg_fixture(3))
    kaggle_layout(root / "imagenet")                   # 3 images, labels and XML boxes
    rng = np.random.default_rng(0)
    for folder, test_file, key, meta, names, classes in (
            ("cifar-10-batches-py", "test_batch", "labels", "batches.meta", "label_names", 10),
            ("cifar-100-python", "test", "fine_labels", "meta", "fine_label_names", 100)):
        write_pickle(root / "cifar" / folder / test_file,
                     {"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), key: [0, classes - 1, 3]})
        write_pickle(root / "cifar" / folder / meta, {names: [f"c{i}" for i in range(classes)]})
    voc_fixture(root / "voc")                          # image 1: cat and person; image 2: background only
    write_movies(root / "movies", [("the movie was good and the acting great".split(), "POS", [(3, 4), (7, 8)]),
                                   ("a boring plot".split(), "NEG", [(1, 2)]),
                                   ("bad film".split(), "NEG", [(0, 1)])])
    bert = root / "bert"                               # 512 positions: reviews are padded to 512 word pieces
    make_bert(labels=2, **{**BERT_TINY, "max_position_embeddings": 512}).save_pretrained(bert)
    make_tokenizer(root).save_pretrained(bert)
    return {"imagenet_seg": root / "seg", "imagenet": root / "imagenet", "cifar10": root / "cifar",
            "cifar100": root / "cifar", "voc": root / "voc", "movie_reviews": root / "movies"}


def missing_piece(reason: str) -> bool:
    """Whether a 'not run' reason names a method, metric or dataset that is indeed not registered,
    or a method that indeed does not explain text."""
    if reason.endswith("does not explain text in vitexplain"):
        return reason.split("'")[1] not in TEXT_METHODS
    for kind, registered in (("explanation method", available_methods()), ("metric", available_metrics()),
                             ("dataset", available_datasets())):
        if reason.startswith(f"not run: {kind} '"):
            name = reason.split("'")[1]
            return name not in registered and reason.endswith("is not registered in vitexplain")
    return False


@pytest.mark.parametrize("name", available_recipes())
def test_recipe_end_to_end(name, inputs, tmp_path):
    table = run_recipe(name, data=inputs, models=stand_ins(name, inputs), output_dir=tmp_path, device="cpu",
                       batch_size=4, limit=2, method_options=FAST_METHODS, metric_options=FAST_METRICS, progress=False)
    expected = published(name)
    rows = list(expected["rows"])
    columns = list(expected["rows"][rows[0]])
    assert table.rows == rows and [key for key, _ in table.columns] == columns
    assert not table.errors
    for row in rows:
        for column in columns:
            cell = table.cells[row, column]
            assert cell.published == expected["rows"][row][column]
            if cell.reproduced is not None:
                assert math.isfinite(cell.reproduced) and cell.reason is None and cell.images == 2
                if cell.published is not None:
                    assert cell.difference == pytest.approx(cell.reproduced - cell.published)
            elif cell.reason != "the paper has no number in this cell":
                assert missing_piece(cell.reason), cell.reason
            else:
                assert cell.published is None
    lines = list(csv.DictReader(Path(table.files["csv"]).open()))
    assert [(line["row"], line["column"]) for line in lines] == [(r, c) for r in rows for c in columns]
    for line in lines:
        value = expected["rows"][line["row"]][line["column"]]
        assert line["published"] == ("" if value is None else repr(float(value)))
        if line["reproduced"] and line["published"]:
            assert float(line["difference"]) == pytest.approx(float(line["reproduced"]) - float(line["published"]))
    body = [line for line in Path(table.files["markdown"]).read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| Method", "| ---"))]
    assert [line.split(" | ")[0][2:] for line in body] == rows
    assert all(line.count(" | ") == 3 * len(columns) for line in body)
    page = Path(table.files["html"]).read_text()
    assert page.count('<th scope="row">') == len(rows) and page.count('class="delta"') == len(rows) * len(columns)
    assert json.loads(Path(table.files["json"]).read_text())["recipe"] == name
    assert any("limit: 2" in line for line in table.deviations)


def test_published_numbers_spot_checked_against_the_papers():
    """Numbers typed from the papers' text, to catch a misread table or a swapped column."""
    typed = [("tokentm-table1", "Ours", "map", 86.45), ("tokentm-table1", "ATTCAT", "miou", 27.90),
             ("tokentm-table2", "Cons. LRP", "label/negative", 45.76),
             ("tokentm-table3", "GAE", "predicted/positive", 17.52),
             ("tokentm-table4", "Trans. Attr.", "label/positive", 18.38),
             ("tokentm-table5", "GAE", "log_odds/vit_large", -5.601),
             ("tokentm-table5", "Grad-CAM", "aopc/vit_large", 0.457),
             ("tokentm-table6", "+ AF", "negative", 55.25), ("tokentm-table7", "9 layers", "positive", 19.24),
             ("gradtoken-table1", "absLRP", "voc/miou", 29.90),
             ("gradtoken-table1", "AGCAM", "imagenet_seg/map", 87.77),
             ("gradtoken-table2", "ViT-CX", "negative/label", 57.57),
             ("gradtoken-table2", "Rollout", "negative/predicted", 53.1),
             ("gradtoken-table2", "Rollout", "positive/label", None), ("gradtoken-table3", "GradToken-1", "map", 88.01),
             ("gradtoken-table4", "GradToken-i", "miou", 51.32), ("gradtoken-fig11", "2", "miou", 68.27),
             ("gradtoken-fig11", "2", "pixel_accuracy", None), ("gradtoken-fig6", "GradToken", "k=40", None),
             ("tis-table1", "IntegratedGrad", "insertion/blur", 0.69),
             ("tis-table1", "ViT-CX", "deletion/random", 0.18),
             ("tis-table2", "Att. Rollout", "insertion_minus_deletion/black", -0.05),
             ("tis-table3", "TIS", "deit", 0.825), ("tis-table3", "BT H", "vit", 0.855),
             ("tis-table4", "Chefer1", "deit", 1.017), ("tis-table4", "RISE", "vit", 0.009)]
    for name, row, column, value in typed:
        assert published(name)["rows"][row][column] == value, (name, row, column)


def test_headers_follow_the_papers():
    assert [h for _, h in [(c.key, c.header) for c in get_recipe("tokentm-table2").columns]] == [
        ("Predicted label", "Neg. ↑"), ("Predicted label", "Pos. ↓"), ("GT label", "Neg. ↑"), ("GT label", "Pos. ↓")]
    assert [c.header for c in get_recipe("gradtoken-table2").columns] == [
        ("Positive ↓", "Label Unknown"), ("Positive ↓", "Label Known"),
        ("Negative ↑", "Label Unknown"), ("Negative ↑", "Label Known")]
    assert [c.header for c in get_recipe("tis-table3").columns] == [("DeiT",), ("ViT",)]
    assert [c.header[1] for c in get_recipe("tis-table1").columns][:4] == ["Mean", "Blur", "Black", "Rand"]


def test_protocol_settings_of_the_papers():
    rows = {row.label: row for row in get_recipe("tokentm-table1").rows}
    assert rows["Rollout"].options == {"start_layer": 1} and rows["Trans. Attr."].options == {"start_layer": 1}
    for name in ("tokentm-table1", "tokentm-table5", "gradtoken-table1", "gradtoken-table2"):
        for row in get_recipe(name).rows:      # the LRP baselines with the Linear rule of Chefer et al.'s code
            if row.method in ("lrp", "partial_lrp"):
                assert row.options == {"linear_rule": "separate"}, (name, row.label)
    table1 = get_recipe("gradtoken-table1")
    literature = [s for s in table1.settings if s.key == "imagenet_seg_literature"][0]
    assert literature.metrics[0].options == {"threshold": "mean"} and "Rollout" in literature.rows
    column = table1.columns[0]
    assert table1.setting_for("GradToken", column).metrics[0].options == {"threshold": "best"}
    assert table1.setting_for("Rollout", column) is literature
    tis = get_recipe("tis-table1")
    assert tis.seed == 12345 and tis.settings[0].data.subset == 5000 and tis.settings[0].target == "label"
    assert get_recipe("gradtoken-table2").setting_for("Rollout", get_recipe("gradtoken-table2").columns[1]) is None
    table4 = get_recipe("tis-table4")                  # max-sensitivity as each method's wrapper feeds Captum
    for column in table4.columns:
        options = {row.label: table4.setting_for(row.label, column).metrics[0].options for row in table4.rows}
        assert options["TIS"] == {"n_samples": 10, "radius": 0.02, "normalise": "minmax", "reseed": True}
        assert options["Attention Rollout"] == {"n_samples": 10, "radius": 0.02, "normalise": "max"}
        assert options["ViT-CX"] == options["SmoothGrad"] == {"n_samples": 10, "radius": 0.02, "reseed": True}
        assert options["RISE"] == options["Chefer1"] == {"n_samples": 10, "radius": 0.02}
        for row in table4.rows:                        # each row in exactly one setting per model
            assert sum(s.covers(row.label) for s in table4.settings if s.group == column.group) == 1


def test_gradtoken_recipes_run_the_printed_method_and_the_transposed_variant():
    for name in ("gradtoken-table1", "gradtoken-table2", "gradtoken-fig6", "gradtoken-table3", "gradtoken-table4",
                 "gradtoken-fig11"):
        rows = {row.label: row for row in get_recipe(name).rows if row.method == "gradtoken"}
        printed = [label for label, row in rows.items() if "transpose" not in row.options]
        twins = [label for label, row in rows.items() if row.options.get("transpose") is True]
        propagating = [label for label in printed if rows[label].options.get("propagation", "matmul") == "matmul"
                       and rows[label].options.get("start_layer") != 11]   # block 11 of 12: no propagation
        assert twins == [f"{label} (transposed)" for label in propagating] and twins, name
        assert all(rows[f"{label} (transposed)"].options == {**rows[label].options, "transpose": True}
                   for label in propagating)
    table2 = get_recipe("gradtoken-table2")
    assert table2.setting_for("GradToken (transposed)", table2.columns[1]) is not None       # 'Label Known' too


def test_segmentation_tables_name_the_threshold_of_each_number(inputs, tmp_path):
    """GradToken's best threshold: one per method (PAcc and mIoU at it) unless the per-number choice is asked for."""
    from vitexplain.metrics.segmentation import THRESHOLD_GRID

    for choice in ("best", "best_per_metric"):
        options = {} if choice == "best" else {"segmentation": {"threshold": choice}}
        table = run_recipe("gradtoken-table4", data=inputs, models=stand_ins("gradtoken-table4"), device="cpu",
                           output_dir=tmp_path / choice, limit=2, metric_options=options, progress=False)
        markdown = table.markdown()
        for row in table.rows:
            accuracy, miou = table.cells[row, "pixel_accuracy"].note, table.cells[row, "miou"].note
            assert table.cells[row, "map"].note is None
            assert {accuracy, miou} <= {f"binarised at threshold {t:g}" for t in THRESHOLD_GRID}
            assert accuracy == miou or choice == "best_per_metric"
            assert f"] {accuracy}" in markdown and f"] {miou}" in markdown


def test_missing_data_is_listed_before_any_computation(inputs, tmp_path):
    with pytest.raises(RecipeInputError) as caught:
        run_recipe("tokentm-table6", data={}, models=stand_ins("tokentm-table6"), output_dir=tmp_path, device="cpu")
    message = str(caught.value)
    assert "--imagenet-seg PATH" in message and "--imagenet PATH" in message
    assert "data={'imagenet_seg': PATH}" in message
    with pytest.raises(RecipeInputError, match=r"(?s)gtsegs_ijcv\.mat.*expected layout"):
        run_recipe("tokentm-table1", data={"imagenet_seg": tmp_path / "absent"}, models=stand_ins("tokentm-table1"),
                   output_dir=tmp_path, device="cpu")
    with pytest.raises(RecipeInputError, match=r"(?s)model deit_cifar10.*--model deit_cifar10=") as caught:
        run_recipe("tokentm-table2", data={}, output_dir=tmp_path, device="cpu")
    assert "--cifar10 PATH" in str(caught.value)
    with pytest.raises(RecipeInputError, match="does not exist"):
        run_recipe("tokentm-table2", data=inputs, models={"deit_cifar10": str(tmp_path / "absent.pth")},
                   output_dir=tmp_path, device="cpu")
    with pytest.raises(RecipeInputError, match=r"(?s)ILSVRC2012_val_00000001\.xml|Annotations"):
        broken = tmp_path / "imagenet-without-boxes"
        kaggle_layout(broken)
        for xml in (broken / "ILSVRC" / "Annotations" / "CLS-LOC" / "val").iterdir():
            xml.unlink()
        (broken / "ILSVRC" / "Annotations" / "CLS-LOC" / "val").rmdir()
        (broken / "LOC_val_solution.csv").unlink()
        run_recipe("tis-table3", data={"imagenet": broken}, models=stand_ins("tis-table3"), output_dir=tmp_path,
                   device="cpu")
    assert not (tmp_path / "bench").exists()


def test_published_index_list_replaces_the_seeded_subset(inputs, tmp_path):
    indices = tmp_path / "sub.yaml"
    indices.write_text("- 2\n- 0\n")                  # the TIS authors' list format
    table = run_recipe("tis-table3", data={**inputs, "tis_indices": indices}, models=stand_ins("tis-table3"),
                       output_dir=tmp_path, device="cpu", method_options=FAST_METHODS, progress=False)
    assert {cell.images for cell in table.cells.values()} == {2}      # 2 of the 3 images, no limit given
    assert not any("limit" in line for line in table.deviations)


def test_overrides_are_checked():
    with pytest.raises(ValueError, match="'n_mask'"):
        plan_recipe(get_recipe("tis-table1"), method_options={"tis": {"n_mask": 8}})
    with pytest.raises(ValueError, match="unknown model key"):
        run_recipe("tokentm-table1", models={"vit_huge": make_vit()}, device="cpu")


def test_voc_items_are_one_per_class_present(inputs):
    voc = get_dataset("voc", inputs["voc"])
    items = PerClassItems(voc)
    assert len(items) == 2                                  # image 1: cat (7), person (14); image 2: none
    class_mask = voc[0]["class_mask"]
    for position, cls in enumerate((7, 14)):
        item = items[position]
        assert item["label"] == cls and item["id"] == f"2007_000001#{cls}"
        assert torch.equal(item["mask"], class_mask == cls + 1) and item["mask"].any()


def test_rendering_marks_missing_and_partial_cells():
    cells = {("A<b>", "x"): Cell("A<b>", "x", 0.5, 0.25, "Table 9"),
             ("A<b>", "y"): Cell("A<b>", "y", None, 1.0, "Table 9", reason="not run: no such method"),
             ("C", "x"): Cell("C", "x", 2.0, None, "Table 9", images=3, failed=1),
             ("C", "y"): Cell("C", "y", None, 1.5, "Table 9", reason="not run: no such method"),
             ("D", "x"): Cell("D", "x", 3.0, 2.0, "Table 9", images=3, note="binarised at threshold 0.4"),
             ("D", "y"): Cell("D", "y", 1.0, 2.0, "Table 9", images=3, failed=1, note="binarised at threshold 0.4")}
    table = ReproducedTable("demo", "Paper", "Table 9", 2, ["A<b>", "C", "D"], [("x", ("G", "X")), ("y", ("G", "Y"))],
                            cells)
    markdown = table.markdown()
    assert "| A<b> | 0.50 | 0.25 | +0.25 | n/a [1] | 1.00 |  |" in markdown
    assert "| C | 2.00 [2] | – |  | n/a [1] | 1.50 |  |" in markdown
    assert "[1] not run: no such method" in markdown
    assert "[2] 1 image(s) failed; the number is over the other 3" in markdown
    assert "| D | 3.00 [3] | 2.00 | +1.00 | 1.00 [4] | 2.00 | -1.00 |" in markdown
    assert "[3] binarised at threshold 0.4" in markdown
    assert "[4] 1 image(s) failed; the number is over the other 3; binarised at threshold 0.4" in markdown
    page = table.html()
    assert "A&lt;b&gt;" in page and "A<b>" not in page and '<th colspan="6">G</th>' in page
    rows = list(csv.DictReader(table.csv_text().splitlines()))
    assert rows[0]["difference"] == repr(0.25) and rows[2]["published"] == "" and rows[2]["difference"] == ""
    assert rows[4]["note"] == "binarised at threshold 0.4" and rows[0]["note"] == ""


def test_gpu_estimate_scales_with_images():
    recipe = get_recipe("tokentm-table1")
    assert estimate_gpu_hours(recipe, limit=100) == pytest.approx(estimate_gpu_hours(recipe) * 100 / 4276)
    # max-sensitivity explains every image again per noise sample: far dearer than the pointing game
    assert estimate_gpu_hours(get_recipe("tis-table4")) > 5 * estimate_gpu_hours(get_recipe("tis-table3"))


def tiny_checkpoint(folder: Path) -> Path:
    model = make_vit(depth=2, num_classes=1000)
    path = folder / "tiny_deit.pth"
    torch.save(model.state_dict(), path)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=1000)
    path.with_suffix(".json").write_text(json.dumps({"arch": "deit_base_patch16_224", "model_kwargs": kwargs}))
    return path


def test_cli_lists_and_runs(inputs, tmp_path, capsys):
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in available_recipes()) and "GPU hours" in listing
    assert "--model deit_cifar10=PATH" in listing
    assert "    rows:    GradToken-i, GradToken-i (transposed), GradToken-ii, GradToken-ii (transposed)\n" in listing
    checkpoint = tiny_checkpoint(tmp_path)
    model = f"deit_base={checkpoint}"
    assert main(["reproduce", "tokentm-table1", "--model", model, "-o", str(tmp_path / "out")]) == 2
    assert "--imagenet-seg PATH" in capsys.readouterr().err
    assert main(["reproduce", "tokentm-table1", "--imagenet-seg", str(inputs["imagenet_seg"]), "--model", model,
                 "-o", str(tmp_path / "out"), "--limit", "2", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| Ours |" in out and (tmp_path / "out" / "tokentm-table1" / "table.html").is_file()
