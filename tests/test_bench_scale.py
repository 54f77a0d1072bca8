"""benchmarks/bench_scale.py's pieces: its generated set (each image brighter inside an ellipse, the ellipse its mask,
made from the index alone) and its methods and metrics, run through the bench on 2 images and a tiny model. The
script's timings are measured by hand (docs/decisions/performance.md), never in a test."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

from vitexplain.bench import BenchConfig, run_benchmark

from conftest import make_vit


def _bench_scale():
    path = Path(__file__).parents[1] / "benchmarks" / "bench_scale.py"
    spec = importlib.util.spec_from_file_location("bench_scale", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_images_are_brighter_on_an_elliptic_mask_and_depend_on_the_index_only():
    data = _bench_scale().GeneratedSegmentation(4)
    first, again, other = data[3], data[3], data[2]
    assert torch.equal(first["image"], again["image"]) and torch.equal(first["mask"], again["mask"])
    assert first["label"] == again["label"] and first["id"] == "generated-00003"
    assert not torch.equal(first["image"], other["image"]) and not torch.equal(first["mask"], other["mask"])
    for sample in (first, other):
        image, mask = sample["image"], sample["mask"]
        assert image.shape == (3, 224, 224) and mask.shape == (224, 224) and mask.dtype == torch.bool
        brighter = image[:, mask].mean() - image[:, ~mask].mean()
        assert 0.95 < brighter < 1.05                                   # the object is where the mask is
        rows, columns = mask.any(1).nonzero()[:, 0], mask.any(0).nonzero()[:, 0]
        for line in [*mask[rows], *mask.T[columns]]:                   # each row and column: one run of pixels
            inside = line.nonzero()[:, 0]
            assert inside[-1] - inside[0] + 1 == len(inside)
        height, width = len(rows), len(columns)                         # an ellipse's area: pi a b
        assert abs(int(mask.sum()) / (math.pi * height * width / 4) - 1) < 0.03


def test_its_methods_and_tests_run_through_the_bench(tmp_path):
    script = _bench_scale()
    result = run_benchmark(BenchConfig(
        models={"tiny": make_vit()}, methods=script.SINGLE_PASS, metrics=script.METRICS,
        dataset=script.GeneratedSegmentation(2, pixels=32, classes=10), batch_size=2, output_dir=tmp_path,
        progress=False, gallery=0, sanity=None, target="predicted", device="cpu"))
    assert result.errors == []
    for method in script.SINGLE_PASS:
        scores = result.scores["tiny"][method]
        assert set(scores["segmentation"]) == {"pixel_accuracy", "miou", "map"}
        assert set(scores["perturbation"]) == {"positive_auc", "negative_auc"}
        assert set(result.timings["tiny"][method]) == {"maps", "segmentation", "perturbation"}
