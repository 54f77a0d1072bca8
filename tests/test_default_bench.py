"""The default benchmark (`vitexplain bench` without arguments): what it covers, and its wiring end to end."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import vitexplain
from vitexplain.bench import DEFAULT_CONFIG, SHIPPED_CONFIGS, BenchConfig, run_benchmark
from vitexplain.cli import bench as bench_cli
from vitexplain.cli.main import build_parser
from vitexplain.datasets import get_dataset
from vitexplain.datasets.base import collate
from vitexplain.metrics import Metric, available_metrics, get_metric, register_metric
from vitexplain.metrics.base import METRICS
from vitexplain.metrics.perturbation import perturbation_test, reduce_perturbation
from vitexplain.registry import available_methods, get_method

from conftest import make_vit

SHIPPED = ["digits_vit", "digits_deit"]
#: library protocols that do not apply to digits canvases, and why: the default config's exclude_metrics (a new
#: protocol joins the default bench through its `all` unless it is excluded there)
NOT_FOR_DIGITS = {"rationale_f1": "text: rationale words of ERASER Movie Reviews"}


def _library(names, lookup, package: str) -> set[str]:
    """The names registered by the library itself (tests register fakes too)."""
    return {name for name in names if lookup(name).__module__.startswith(package)}


def test_every_method_and_protocol_runs_in_a_shipped_config_and_the_default_leaves_latecs_to_its_own():
    config = BenchConfig.from_yaml(DEFAULT_CONFIG)
    latec = BenchConfig.from_yaml(SHIPPED_CONFIGS["latec"])
    methods = _library(available_methods("image"), lambda n: get_method(n).fn, "vitexplain.methods")
    metrics = _library(available_metrics(), lambda n: get_metric(n).compute, "vitexplain.metrics")
    assert {"random_baseline", "constant_baseline", "tokentm", "gradtoken", "tis"} <= methods
    shipped = [BenchConfig.from_yaml(path) for path in SHIPPED_CONFIGS.values()]
    assert {entry.name for found in shipped for entry in found.methods} >= methods
    ran = {entry.name for found in shipped for entry in found.metrics}
    ran |= {found.sanity.entry.name for found in shipped if found.sanity is not None}   # the sanity key's protocol
    assert ran >= metrics - set(NOT_FOR_DIGITS)
    left_to_latec = set(config.exclude_metrics) - set(NOT_FOR_DIGITS)
    assert set(config.exclude_methods) <= {entry.name for entry in latec.methods}
    assert left_to_latec <= {entry.name for entry in latec.metrics}
    names = [entry.name for entry in config.methods if entry.name in methods]   # (`all` also takes the tests' fakes)
    expected = methods - set(config.exclude_methods)
    assert sorted(set(names)) == sorted(expected) and len(names) == len(expected) + 3  # GradToken twice, 3 degraded:
    variants = {entry.label: entry.options for entry in config.methods if entry.name == "gradtoken"}
    assert variants == {"gradtoken": {}, "gradtoken(transpose=True)": {"transpose": True}}  # printed and our variant
    configured = sorted([entry.name for entry in config.metrics if entry.name in metrics] + [config.sanity.entry.name])
    assert configured == sorted(metrics - set(NOT_FOR_DIGITS) - left_to_latec)
    assert latec.ranks and not config.ranks
    assert [entry.name for entry in config.models] == ["digits_vit"]
    assert config.dataset.name == "digits" and config.sanity is not None and config.gallery > 0
    by_name = {entry.name: entry for entry in config.metrics}
    assert by_name["class_sensitivity"].dataset.options["objects"] == 2
    assert config.dataset.options.get("objects", 1) == 1
    assert all(entry.label == entry.name for entry in config.methods
               if not entry.options.get("transpose") and entry.name != "degraded")  # short
    assert config.highlight == ["tokentm", "gradtoken", "tis"]                  # the seed methods, in colour


def test_the_cli_without_arguments_runs_the_default_and_flags_still_override_it():
    parse = build_parser().parse_args
    plain = bench_cli.config_from_args(parse(["bench"]))
    shipped = BenchConfig.from_yaml(DEFAULT_CONFIG)
    assert [m.label for m in plain.methods] == [m.label for m in shipped.methods]
    assert [m.label for m in plain.metrics] == [m.label for m in shipped.metrics] and plain.limit == shipped.limit
    small = bench_cli.config_from_args(parse(["bench", "--limit", "4", "-o", "elsewhere"]))
    assert small.limit == 4 and str(small.output_dir) == "elsewhere" and len(small.methods) == len(shipped.methods)
    own = {m.label: m.limit for m in shipped.metrics}
    assert max(v for v in own.values() if v) > 4                                      # ROAD's 8 ...
    assert all(small.limit_of(m) == min(own[m.label] or 4, 4) for m in small.metrics)  # ... capped at --limit 4
    both = bench_cli.config_from_args(parse(["bench", "--model", "digits_vit", "--model", "digits_deit"]))
    assert [m.name for m in both.models] == ["digits_vit", "digits_deit"]             # --model alone: the default
    assert [m.label for m in both.methods] == [m.label for m in shipped.methods] and both.sanity == shipped.sanity
    # an option for a protocol or method that only `all` reaches: named on its own, with the option, all else alike
    tuned = bench_cli.config_from_args(parse(["bench", "--metric-option", "saco.n_groups=2",
                                              "--method-option", "vitcx.batch_size=4"]))
    assert sorted(m.label for m in tuned.metrics) == sorted(m.label for m in shipped.metrics)
    assert [m.label for m in tuned.methods if m.label != "vitcx"] == [m.label for m in shipped.methods
                                                                      if m.label != "vitcx"]
    assert {m.label: m.options for m in tuned.metrics if m.name == "saco"} == {"saco": {"n_groups": 2}}
    assert {m.label: m.options for m in tuned.methods if m.name == "vitcx"} == {"vitcx": {"batch_size": 4}}
    with pytest.raises(ValueError, match=r"'irof.n_segments=4' names no metric of this run \(the config's "
                                         r"exclude_metrics leaves it out\)"):
        bench_cli.config_from_args(parse(["bench", "--metric-option", "irof.n_segments=4"]))
    own = bench_cli.config_from_args(parse(["bench", "--model", "x.pt", "--method", "gae", "--metric", "sparseness",
                                            "--dataset", "digits"]))
    assert [m.name for m in own.methods] == ["gae"] and own.sanity is None      # not mixed with the default


def test_perturbation_metrics_get_the_preprocessing_the_bench_used(tmp_path):
    """A model whose timm config says ImageNet mean/std, benchmarked on digits preprocessed with mean = std =
    0.5: the black pixel of the perturbation tests must come from the preprocessing the images went through."""
    model = make_vit(img_size=112, patch_size=16, depth=1)
    model.pretrained_cfg = {"input_size": (3, 112, 112), "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
    preprocess = {"input_size": [3, 112, 112], "mean": [0.5] * 3, "std": [0.5] * 3}
    digits = {"name": "digits", "options": {"n": 4, "preprocess": preprocess}}
    given = []
    register_metric(Metric("bench_normalisation", lambda batch: given.append((batch.mean, batch.std)) or
                           {"n": torch.zeros(len(batch.ids))}, lambda values: {}))
    try:
        config = BenchConfig(models={"tiny": model}, methods=["random_baseline"], dataset=digits,
                             metrics=["perturbation", "bench_normalisation"], batch_size=4, output_dir=tmp_path,
                             progress=False, device="cpu", gallery=0)
        result = run_benchmark(config)
    finally:
        METRICS.remove("bench_normalisation")
    assert given == [((0.5,) * 3, (0.5,) * 3)]
    images = get_dataset("digits", n=4, preprocess=preprocess)
    batch = collate([images[i] for i in range(4)])
    maps = vitexplain.explain(model, batch["images"], "random_baseline")
    expected = reduce_perturbation(perturbation_test(vitexplain.adapter_for(model).logits, batch["images"], maps,
                                                     batch["labels"], pixel_mean=[0.5] * 3, pixel_std=[0.5] * 3))
    assert result.scores["tiny"]["random_baseline"]["perturbation"] == pytest.approx(expected)


def test_the_default_config_end_to_end_on_a_few_images(tmp_path):
    """The shipped default on both shipped models (as `--model` twice runs it), 3 images, a few methods: every
    protocol fills its columns."""
    data = yaml.safe_load(Path(DEFAULT_CONFIG).read_text())
    keep = {"tokentm", "gradtoken", "random_baseline", "constant_baseline"}
    data["methods"] = [m for m in data["methods"] if m != "all" and (m if isinstance(m, str) else m["name"]) in keep]
    data["methods"] += ["random_baseline", "constant_baseline"]           # which the default takes through `all`
    library = _library(available_metrics(), lambda n: get_metric(n).compute, "vitexplain.metrics")
    data["exclude_metrics"] += sorted(set(available_metrics()) - library)  # other tests' fakes, when registered
    data["highlight"] = [label for label in data["highlight"] if label in keep]
    for metric in data["metrics"]:
        if isinstance(metric, dict) and "limit" in metric:
            metric["limit"] = 2
    # the removal curves at two steps and ROAD at one fraction (the suite's time: what is checked is the wiring)
    fewer = {"perturbation": {"n_steps": 2}, "insertion_deletion": {"n_steps": 2}, "srg": {"n_steps": 2},
             "road": {"fractions": [0.5]}}
    entries = [{"name": metric} if isinstance(metric, str) and metric in fewer else metric
               for metric in data["metrics"]]
    data["metrics"] = [{**metric, "options": {**metric.get("options", {}), **fewer[metric["name"]]}}
                       if isinstance(metric, dict) and metric["name"] in fewer else metric for metric in entries]
    data.update(models=SHIPPED, limit=3, gallery=2, sanity={"images": 3}, output_dir=str(tmp_path), progress=False,
                device="cpu")
    result = run_benchmark(BenchConfig.from_dict(data))
    assert result.errors == []
    assert list(result.scores) == SHIPPED
    expected = {"segmentation", "pointing_game", "perturbation", "aopc", "insertion_deletion", "sparseness",
                "max_sensitivity", "class_sensitivity", "road", "saco", "smooth_mprt", "efficient_mprt",
                "numerical_stability", "srg", "relevance_mass_accuracy",
                "relevance_rank_accuracy", "top_k_intersection", "attribution_localisation", "localisation_auc",
                "complexity", "effective_complexity", "sufficiency", "completeness"}
    for model in SHIPPED:
        assert list(result.scores[model]) == ["tokentm", "gradtoken", "gradtoken(transpose=True)", "random_baseline",
                                              "constant_baseline"]
        for method, per_metric in result.scores[model].items():
            assert set(per_metric) == expected
            counts = result.images[model][method]
            assert counts["segmentation"] == 3 and counts["max_sensitivity"] == 2 and counts["class_sensitivity"] == 2
            assert counts["road"] == 2 and counts["saco"] == 3
        flags = {m: found["flagged"] for m, found in result.sanity[model]["methods"].items()}
        assert flags == {"tokentm": False, "gradtoken": False, "gradtoken(transpose=True)": False,
                         "random_baseline": True, "constant_baseline": True}
        assert {"perturbation", "aopc", "insertion_deletion", "road", "saco", "srg"} <= set(result.curves[model]) \
            <= expected
    assert [g.model for g in result.galleries] == SHIPPED and all(len(g.ids) == 2 for g in result.galleries)
    page = (tmp_path / "report.html").read_text()
    assert all(f'id="{model}"' in page for model in SHIPPED) and "cascading randomisation" in page
    assert result.settings["metrics"]["class_sensitivity"]["dataset"]["options"]["objects"] == 2


def test_config_errors_name_the_problem():
    base = dict(models=["m"], methods=["gae"], metrics=["sparseness"], dataset="digits")
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        BenchConfig(**{**base, "metrics": [{"name": "sparseness", "limit": 0}]})
    with pytest.raises(ValueError, match="unknown sanity option.*imgs"):
        BenchConfig(**base, sanity={"imgs": 3})
    with pytest.raises(ValueError, match="sanity names method.*'rise'"):
        BenchConfig(**base, sanity={"methods": ["rise"]})
    with pytest.raises(ValueError, match="the sanity check needs at least 2 images"):
        BenchConfig(**base, sanity={"images": 1})
    with pytest.raises(ValueError, match="unknown sanity option.*threshold"):       # the fixed threshold is gone
        BenchConfig(**base, sanity={"threshold": 0.9})
