"""Options that count pixels, written for one image size (a config's ``pixels_at``) and scaled to each model's."""
from __future__ import annotations

import pytest

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.config import SHIPPED_CONFIGS
from vitexplain.metrics import get_metric
from vitexplain.options import scale_pixels
from vitexplain.registry import get_method

from conftest import make_vit
from test_bench_fakes import RandomImages

OCCLUSION = get_method("occlusion").fn


def test_lengths_scale_with_the_side_areas_with_its_square_and_other_options_stay():
    options = {"window": 50, "baseline": 0.5}                       # stride left at its default, 25
    scaled, changes = scale_pixels(OCCLUSION, options, 0.5)
    assert scaled == {"window": 25, "stride": 12, "baseline": 0.5}  # 12.5 rounds to the even 12
    assert changes == ["window 50 → 25", "stride 25 → 12"]
    assert options == {"window": 50, "baseline": 0.5}               # the caller's mapping is left as it was
    subset = get_metric("faithfulness_correlation").compute
    ratio = 384 / 224
    assert scale_pixels(subset, {"subset_size": 224}, ratio)[0]["subset_size"] == round(224 * ratio * ratio)
    assert scale_pixels(OCCLUSION, {"window": 3, "stride": 1}, 0.1)[0] == {"window": 1, "stride": 1}  # never 0
    naopc = get_metric("naopc").compute
    assert scale_pixels(naopc, {}, 0.5) == ({}, [])                  # None (the token grid) stays None
    assert scale_pixels(OCCLUSION, {}, 1.0) == ({}, [])


def test_a_config_at_224_px_gives_a_112_px_model_the_options_written_for_112_px():
    common = {"models": {"tiny": make_vit(depth=1)}, "dataset": RandomImages(2), "seed": 3}
    at_224 = BenchConfig(methods=["occlusion", {"name": "lime", "options": {"patch_size": 32}}],
                         metrics=["faithfulness_estimate", "sparseness"], pixels_at=224, **common)
    written = BenchConfig(methods=[{"name": "occlusion", "label": "occlusion", "options": {"window": 25, "stride": 12}},
                                   {"name": "lime", "label": "lime(patch_size=32)", "options": {"patch_size": 16}}],
                          metrics=[{"name": "faithfulness_estimate", "options": {"patch_size": 8}}, "sparseness"],
                          **common)
    found, plain = at_224.bind_for((112, 112)), written.bind_for((112, 112))
    for kind in ("methods", "metrics"):
        assert ({label: bound.options for label, bound in getattr(found, kind).items()}
                == {label: bound.options for label, bound in getattr(plain, kind).items()})
    assert found.methods["lime(patch_size=32)"].options["seed"] == 3    # the run's seed still reaches lime
    assert plain.scalings == [] and found.scalings[1:] == ["occlusion: window 50 → 25, stride 25 → 12",
                                                           "lime(patch_size=32): patch_size 32 → 16",
                                                           "faithfulness_estimate: patch_size 16 → 8"]
    assert at_224.bind_for((224, 224)).methods["occlusion"].options == {}    # at its own size nothing changes
    assert at_224.bind_for((448, 448)).metrics["faithfulness_estimate"].options["patch_size"] == 32


def test_pixels_at_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="pixels_at must be a positive integer, got 0"):
        BenchConfig(models={"tiny": make_vit(depth=1)}, methods=["occlusion"], metrics=["sparseness"],
                    dataset=RandomImages(2), pixels_at=0)


def test_a_run_scores_with_the_scaled_options_and_its_report_says_what_became_of_them(tmp_path):
    def run(folder: str, window: dict, patch: dict, **config):
        return run_benchmark(BenchConfig(
            models={"tiny": make_vit(depth=1)}, dataset=RandomImages(2), batch_size=2, device="cpu", progress=False,
            gallery=0, output_dir=tmp_path / folder, methods=[{"name": "occlusion", "label": "occ", "options": window}],
            metrics=[{"name": "faithfulness_estimate", "label": "fe", "options": patch}], **config))

    scaled = run("scaled", {}, {}, pixels_at=224)
    written = run("written", {"window": 7, "stride": 4}, {"patch_size": 2})     # 50, 25 and 16 px x 32 / 224
    assert scaled.scores == written.scores and scaled.errors == written.errors == []
    note = ("tiny: options that count pixels, written for 224 px images, scaled to the model's 32 × 32 px; "
            "occ: window 50 → 7, stride 25 → 4; fe: patch_size 16 → 2.")
    assert scaled.notes == [note] and written.notes == []
    assert note in (tmp_path / "scaled" / "results.md").read_text()


def test_latecs_config_writes_latecs_pixel_sizes():
    latec = BenchConfig.from_yaml(SHIPPED_CONFIGS["latec"])
    assert latec.pixels_at == 224
    at_224 = latec.bind_for((224, 224))
    occlusion = at_224.methods["occlusion"].effective
    assert (occlusion["window"], occlusion["stride"]) == (50, 25)      # LATEC's configs/explain_method/image.yaml
    assert at_224.metrics["faithfulness_correlation"].options["subset_size"] == 224
    assert at_224.metrics["monotonicity_correlation"].options["patch_size"] == 56   # its 3,136 pixels per feature
    assert at_224.metrics["region_perturbation"].options["patch_size"] == 14
