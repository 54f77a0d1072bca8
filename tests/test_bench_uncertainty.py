"""Every number with its uncertainty: intervals checked against a bootstrap written here in plain numpy on the
per-image values the cache holds; best and tied from paired intervals; protocols summarised per kind."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.tables import TOO_FEW_TO_COMPARE, Estimate, column_decimals, format_estimate
from vitexplain.bench.uncertainty import Sample, leaders
from vitexplain.metrics import Metric, available_metrics, get_metric
from vitexplain.metrics.base import GROUPS
from vitexplain.uncertainty import MIN_IMAGES, TOO_FEW, bootstrap, has_interval, interval

from conftest import make_vit
from test_bench_fakes import RandomImages

SEED = 5
IMAGES = MIN_IMAGES          # the fewest images that get an interval
STEPS = 4
METRICS = ["segmentation", {"name": "perturbation", "options": {"n_steps": STEPS}}, "bench_stats"]


def stored_values(out: Path, method: str, metric: str) -> dict[str, np.ndarray]:
    """A method's per-image values of one metric as the cache holds them, rows in dataset order (the order of the
    images' ids, ``img000`` ...: rows are stored under ``id#digest``)."""
    folder = next(out.glob(f"cache/*/*/target-predicted/{method}-*/metrics/{metric}-*"))
    indices, parts = [], {}
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "np") as handle:
            indices += [key.split("#")[0] for key in json.loads(handle.metadata()["keys"])]
            for key in handle.keys():
                parts.setdefault(key, []).append(handle.get_tensor(key).astype(np.float64))
    order = np.argsort(indices)
    return {key: np.concatenate(chunks)[order] for key, chunks in parts.items()}


def numpy_bootstrap(values: dict[str, np.ndarray], statistic, seed: int, resamples: int = 1000) -> np.ndarray:
    """The statistic on resamples of the images, drawn one after the other by numpy's default_rng(seed)."""
    generator = np.random.default_rng(seed)
    count = len(next(iter(values.values())))
    found = []
    for _ in range(resamples):
        rows = generator.integers(0, count, count)
        found.append(statistic({key: value[rows] for key, value in values.items()}))
    return np.array(found)


def miou(v):          # accumulated counts: a ratio of sums over the images, not a mean of per-image values
    return 100 * (v["intersection_background"].sum() / v["union_background"].sum()
                  + v["intersection_foreground"].sum() / v["union_foreground"].sum()) / 2


def positive_auc(v):  # the area under the mean curve (Chefer et al.'s trapezoid rule over the steps)
    curve = v["positive"].mean(0)
    return 100 * np.trapezoid(curve, dx=1 / curve.size)


def probability(v):
    return v["probability"].mean()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("uncertainty") / "out"
    config = BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["gae", "rollout", "random_baseline"],
                         metrics=METRICS, dataset=RandomImages(IMAGES, masks=True), batch_size=4, output_dir=out,
                         progress=False, device="cpu", gallery=0, seed=SEED)
    result = run_benchmark(config)
    assert not result.errors
    return config, result


@pytest.mark.parametrize("metric, number, statistic", [("segmentation", "miou", miou),
                                                       ("perturbation", "positive_auc", positive_auc),
                                                       ("bench_stats", "probability", probability)])
def test_intervals_are_a_bootstrap_of_the_stored_per_image_values(bench, metric, number, statistic):
    config, result = bench
    for method in ("gae", "rollout", "random_baseline"):
        values = stored_values(config.output_dir, method, metric)
        reported = result.scores["tiny"][method][metric][number]
        assert statistic(values) == pytest.approx(reported, rel=1e-6)   # float32 reductions
        expected = np.percentile(numpy_bootstrap(values, statistic, SEED), [2.5, 97.5])
        assert result.intervals["tiny"][method][metric][number] == pytest.approx(expected, rel=1e-6, abs=1e-9)
        assert expected[1] > expected[0]                                   # the images differ: a real interval
        replicates = {seed: numpy_bootstrap(values, statistic, seed, 50) for seed in (SEED, SEED + 1)}
        assert not np.allclose(replicates[SEED], replicates[SEED + 1])     # the seed matters: it is the run's
        assert result.images["tiny"][method][metric] == IMAGES


def test_reports_carry_every_interval_and_a_rerun_in_other_batches_gives_the_same(bench):
    config, result = bench
    out = config.output_dir
    saved = json.loads((out / "results.json").read_text())
    assert saved["intervals"] == json.loads(json.dumps(result.intervals))
    assert saved["settings"]["bootstrap"]["seed"] == SEED
    rows = list(csv.DictReader((out / "results.csv").open()))
    for row in rows:
        low, high = result.intervals["tiny"][row["method"]][row["metric"]][row["number"]]
        assert (float(row["low"]), float(row["high"]), int(row["images"])) == (low, high, IMAGES)
    table = result.table("tiny")
    column = table.numbers.index("miou")
    decimals = column_decimals([row[column] for row in table.values])
    shown = format_estimate(Estimate(result.scores["tiny"]["gae"]["segmentation"]["miou"],
                                     *result.intervals["tiny"]["gae"]["segmentation"]["miou"], IMAGES), decimals)
    assert shown in (out / "results.md").read_text() and shown in (out / "report.html").read_text()
    assert shown in result.text() and shown == table.cells(column)[0]
    again = run_benchmark(BenchConfig(**{**vars(config), "batch_size": 2}))     # all cached: reduced again
    assert again.intervals == result.intervals and again.leaders == result.leaders


def test_one_format_per_column_from_its_median_interval():
    assert format_estimate(Estimate(0.87412, 0.81234, 0.92101, 20)) == "0.87 [0.81, 0.92] (20)"
    assert format_estimate(Estimate(68.43, 65.21, 71.02, 20)) == "68.4 [65.2, 71.0] (20)"
    assert format_estimate(Estimate(-0.0031, -0.0102, 0.0033, 8)) == "-0.003 [-0.010, 0.003] (8)"   # width 0.0135
    column = [Estimate(0.95, 0.91, 0.99, 20), Estimate(1.0, 1.0, 1.0, 20), None, Estimate(1.984e-17, -1e-9, 2e-9, 20)]
    assert column_decimals(column) == 3                     # the median width (0.08 and 3e-9): 0.04
    assert column_decimals([Estimate(0.5, 0.3, 0.7, 20)]) == 2   # width 0.4: 0.40
    column[3] = Estimate(1.984e-17, -0.004, 0.021, 20)
    decimals = column_decimals(column)
    assert decimals == 3
    assert [format_estimate(e, decimals) for e in column if e] == [
        "0.950 [0.910, 0.990] (20)", "1.000 [1.000, 1.000] (20)",
        "0.000 [-0.004, 0.021] (20)"]   # no "1", no "1.984e-17"
    assert format_estimate(Estimate(-0.0, 0.0, -0.0, 2)) == "0.00 [0.00, 0.00] (2)"            # no width, no sign on 0
    assert column_decimals([Estimate(123.4, 123.4, 123.4, 2)]) == 0


def _sample(values: np.ndarray, seed: int) -> Sample:
    found = {"score": torch.from_numpy(values)}
    return Sample(list(range(len(values))), found, bootstrap(found, _mean, seed))


def _mean(values):
    return {"score": values["score"].mean()}


def test_best_needs_a_paired_interval_that_excludes_zero_and_the_rest_are_tied():
    generator = np.random.default_rng(0)
    base = generator.normal(0.5, 0.2, 12)
    noise = generator.normal(0, 0.2, 12)
    per_image = {"steady": base + 0.02, "plain": base, "noisy": base + 0.04 + noise - noise.mean(),   # ahead on average
                 "control": base + 0.5}
    samples = {name: _sample(values, SEED) for name, values in per_image.items()}
    scores = {name: values.mean() for name, values in per_image.items()}

    def told_apart(first: str, second: str) -> bool:
        """By hand: the paired 95 % interval of the difference of the means excludes 0."""
        difference = numpy_bootstrap({"a": per_image[first], "b": per_image[second]},
                                     lambda v: v["a"].mean() - v["b"].mean(), SEED)
        low, high = np.percentile(difference, [2.5, 97.5])
        return low > 0 or high < 0

    ahead = max(("steady", "plain", "noisy"), key=scores.get)
    assert ahead == "noisy" and told_apart("steady", "plain") and not told_apart("noisy", "steady")
    unpaired = [np.percentile(samples[name].replicates["score"], [2.5, 97.5]) for name in ("steady", "plain")]
    assert unpaired[0][0] < unpaired[1][1]                   # each on its own, their intervals overlap: pairing decides
    two = leaders({k: samples[k] for k in ("steady", "plain")}, scores, True, set(), "score", _mean, SEED)
    assert two == {"methods": ["steady"], "controls": []}
    three = leaders(samples, scores, True, {"control"}, "score", _mean, SEED)
    assert three["methods"] == ["noisy", "steady"] + (["plain"] if not told_apart("noisy", "plain") else [])
    assert three["controls"] == ["control"]                  # above them all: no leader is better than it
    lower = leaders({k: samples[k] for k in ("steady", "plain")}, scores, False, set(), "score", _mean, SEED)
    assert lower["methods"] == ["plain"]                     # lower is better: plain, clearly


def test_every_protocol_declares_its_kind_and_the_summary_never_mixes_kinds(bench):
    library = [name for name in available_metrics()
               if get_metric(name).compute.__module__.startswith("vitexplain.metrics")]
    undeclared = [name for name in library if get_metric(name).group == "other"]
    assert not undeclared, f"built-in protocols must declare their kind (metrics.base.GROUPS): {undeclared}"
    assert {get_metric(name).group for name in ("aopc", "segmentation", "max_sensitivity", "sparseness",
                                                "class_sensitivity", "smooth_mprt")} == set(GROUPS) - {"other"}
    with pytest.raises(ValueError, match="group must be one of faithfulness, localisation"):
        Metric("bench_ungrouped", lambda batch: {}, lambda values: {}, group="accuracy")
    _, result = bench
    leads = result.summary("tiny")
    assert [(lead.group, lead.metric, lead.number) for lead in leads] == [
        ("localisation", "segmentation", n) for n in ("pixel_accuracy", "miou", "map")] + [
        ("faithfulness", "perturbation", n) for n in ("positive_auc", "negative_auc")] + [
        ("other", "bench_stats", n) for n in ("probability", "auc")]
    text = result.text()
    assert "mean rank" not in text and "mean rank" not in result.markdown()
    for group in ("localisation", "faithfulness"):
        assert f"{group}: rewards {GROUPS[group]}"[:90] in text.replace("\n    ", " ")
    for lead in leads:
        assert lead.images == str(IMAGES) and "random_baseline" not in lead.methods
        table = result.table("tiny")
        column = [j for j, (m, n) in enumerate(zip(table.metrics, table.numbers))
                  if (m, n) == (lead.metric, lead.number)][0]
        marked = [method for method, marks in zip(table.methods, table.marks) if marks[column]]
        assert marked == sorted(lead.methods, key=table.methods.index)       # the table marks what the summary says


@pytest.mark.parametrize("kind", ["mean", "area under the mean curve", "ratio of sums"])
def test_the_bootstrap_takes_means_in_one_indexing_only_where_the_report_is_a_mean(kind):
    """A report that is the mean of its per-image numbers is resampled by indexing (a few calls of the report to
    test it); any other is called once per resample. Both give the replicates of the plain resampling loop."""
    generator = torch.Generator().manual_seed(3)
    values = {"a": torch.rand(12, generator=generator, dtype=torch.float64),
              "b": torch.rand(12, 5, generator=generator, dtype=torch.float64) + 0.5}
    reports = {"mean": lambda v: {"m": v["a"].mean().item()},
               "area under the mean curve": lambda v: {"auc": torch.trapezoid(v["b"].mean(0), dx=0.25).item(),
                                                       "m": v["a"].mean().item()},
               "ratio of sums": lambda v: {"r": (v["a"].sum() / v["b"][:, 0].sum()).item()}}
    calls = []

    def report(v):
        calls.append(1)
        return reports[kind](v)

    found = bootstrap(values, report, seed=SEED)
    plain = {key: numpy_bootstrap({k: v.numpy() for k, v in values.items()},
                                  lambda v: reports[kind]({k: torch.from_numpy(x) for k, x in v.items()})[key], SEED)
             for key in found}
    for key, replicates in found.items():
        np.testing.assert_allclose(replicates, plain[key], rtol=1e-12, atol=1e-15)
    assert (len(calls) < 20) == (kind != "ratio of sums"), len(calls)


def test_too_few_images_get_no_interval_and_no_leaders_in_the_bench_and_in_evaluate_alike(tmp_path):
    """Below MIN_IMAGES no interval anywhere (docs/decisions/metric-trust.md, "How many images an interval needs"):
    one image and MIN_IMAGES - 1 images on the bench and in ``vitexplain.evaluate``, the same rule in both."""
    model = make_vit(depth=2)
    few = MIN_IMAGES - 1
    metrics = [{"name": "bench_stats", "label": "one", "limit": 1},
               {"name": "bench_stats", "label": "few", "limit": few}]
    config = BenchConfig(models={"tiny": model}, methods=["gae", "rollout", "random_baseline"], metrics=metrics,
                         dataset=RandomImages(few), batch_size=few, output_dir=tmp_path / "out", progress=False,
                         device="cpu", gallery=0, seed=SEED)
    result = run_benchmark(config)
    assert not result.errors
    out = tmp_path / "out"
    saved = json.loads((out / "results.json").read_text())
    markdown, page, text = (out / "results.md").read_text(), (out / "report.html").read_text(), result.text()
    for label, count in (("one", 1), ("few", few)):
        for method in ("gae", "rollout", "random_baseline"):
            assert result.images["tiny"][method][label] == count
            for number, value in result.scores["tiny"][method][label].items():
                assert result.intervals["tiny"][method][label][number] == TOO_FEW
                assert saved["intervals"]["tiny"][method][label][number] == TOO_FEW
                shown = format_estimate(Estimate(value, float("nan"), float("nan"), count))
                assert shown.endswith(f"[{TOO_FEW}] ({count})")
        for number in ("probability", "auc"):                   # nobody leads, no trust record: nothing to compare
            assert result.leaders["tiny"][label][number] == {"methods": [], "controls": []}
            assert number not in result.trust.get("tiny", {}).get(label, {})
    leads = result.summary("tiny")
    assert leads and all(lead.leaders() == TOO_FEW_TO_COMPARE for lead in leads)
    assert TOO_FEW_TO_COMPARE in markdown and TOO_FEW in markdown and TOO_FEW in page
    assert TOO_FEW in " ".join(text.split())
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert rows and all(row["low"] == row["high"] == "" for row in rows)
    # What the rule hides: the percentile bootstrap of one image is a zero-width interval.
    values = {"x": torch.tensor([0.25])}
    assert interval(bootstrap(values, lambda v: {"x": v["x"].mean()}, SEED)["x"]) == (0.25, 0.25)
    # vitexplain.evaluate: the same rule, one image and few alike; at MIN_IMAGES an interval.
    images = torch.randn(MIN_IMAGES, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    maps = torch.rand(MIN_IMAGES, 4, 4, generator=torch.Generator().manual_seed(2))
    for count in (1, few):
        scores = vitexplain.evaluate(model, images[:count], maps[:count], "sparseness", targets=0)
        assert all(np.isnan(bound) for bounds in scores.intervals.values() for bound in bounds)
        assert f"[{TOO_FEW}]" in str(scores) and not has_interval(count)
    scores = vitexplain.evaluate(model, images, maps, "sparseness", targets=0)
    low, high = scores.intervals["sparseness"]
    assert low < scores.numbers["sparseness"] < high and TOO_FEW not in str(scores)


def test_a_report_declared_a_mean_is_resampled_as_the_report_itself_would_be():
    """``Means`` skips the probing of :func:`bootstrap`; its replicates equal those of the same report written as a
    plain function (probed), and the report called on each resample, for values of one and of several entries."""
    from vitexplain.uncertainty import Means, resampled_positions

    generator = torch.Generator().manual_seed(0)
    for values in ({"x": torch.rand(30, generator=generator), "y": torch.rand(30, generator=generator)},
                   {"x": torch.rand(30, 4, generator=generator), "y": torch.rand(30, generator=generator)}):
        declared = Means(a="x", b="y")

        def plain(found):
            return {"a": found["x"].to(torch.float64).mean().item(), "b": found["y"].to(torch.float64).mean().item()}

        assert declared(values) == plain(values)
        found, probed = bootstrap(values, declared, SEED), bootstrap(values, plain, SEED)
        assert all(np.array_equal(found[key], probed[key]) for key in ("a", "b"))
        positions = resampled_positions(30, SEED)
        called = [plain({key: value[positions[r]] for key, value in values.items()}) for r in range(50)]
        for key in ("a", "b"):
            np.testing.assert_allclose(found[key][:50], [row[key] for row in called], rtol=1e-12, atol=0)


@pytest.mark.parametrize("count", [14, 70])     # every resample at once; above SMALL_SET, one at a time
def test_a_stacked_report_resamples_as_the_report_called_on_each_resample(count):
    """Sufficiency's report (a :class:`Stacked`: every resample in a few calls), reached through its metric's
    reporter with an option, gives on each resample what its plain arithmetic (one set at a time) gives: the
    plain loop over the resamples with SciPy's standardised Euclidean distances."""
    from scipy.spatial.distance import cdist

    from vitexplain.metrics import get_metric
    from vitexplain.metrics.sufficiency import SMALL_SET
    from vitexplain.uncertainty import Stacked, resampled_positions

    assert (count <= SMALL_SET) == (count == 14)
    generator = torch.Generator().manual_seed(4)
    maps = torch.rand(count, 16, generator=generator)
    maps[5] = maps[4] * 0.9                             # a close pair: neighbours at a low threshold
    values = {"explanation": maps / maps.max(1, keepdim=True).values,
              "prediction": torch.randint(0, 3, (count,), generator=generator).float()}
    metric = get_metric("sufficiency")
    assert isinstance(metric.reduce, Stacked)

    def plain(found, threshold):
        flat = found["explanation"].double().numpy()
        varies = flat.var(0, ddof=1) > 0
        distance = cdist(flat[:, varies], flat[:, varies], "seuclidean") if varies.any() else np.zeros((count, count))
        distance = distance / distance.max() if distance.max() > 0 else distance
        local, covered = [], []
        for i in range(len(flat)):
            near = [j for j in range(len(flat)) if j != i and distance[i, j] <= threshold]
            agree = [j for j in near if found["prediction"][j] == found["prediction"][i]]
            local.append(len(agree) / len(near) if near else 0.0)
            covered.append(float(bool(near)))
        return {"sufficiency": np.mean(local), "covered": np.mean(covered)}

    for threshold in (0.3, 0.6):
        report = metric.reporter({"threshold": threshold})
        found = bootstrap(values, report, SEED)
        positions = resampled_positions(count, SEED)
        for r in range(0, 1000, 97):
            expected = plain({key: value[positions[r]] for key, value in values.items()}, threshold)
            for key in ("sufficiency", "covered"):
                assert found[key][r] == pytest.approx(expected[key], abs=1e-12)
        assert report(values) == pytest.approx(plain(values, threshold), abs=1e-12)
        assert 0 < found["covered"].mean() < 1


@pytest.mark.parametrize("threshold", ["mean", "best", "best_per_metric"])
def test_segmentation_and_the_pointing_game_resample_as_their_plain_arithmetic_on_each_resample(threshold):
    """Their reports are :class:`Stacked` (every resample at once): on each resample they equal the plain NumPy
    arithmetic on that set of images: ratios of summed counts (at the best threshold of the grid), mean AP, and the
    pointing game's hits among the images it keeps, NaN where it keeps none."""
    from vitexplain.metrics import get_metric
    from vitexplain.metrics.segmentation import THRESHOLD_GRID
    from vitexplain.uncertainty import Stacked, resampled_positions

    count, generator = 23, np.random.default_rng(3)
    shape = (count,) if threshold == "mean" else (count, len(THRESHOLD_GRID))
    counts = {name: generator.integers(0, 400, shape).astype(np.float32)
              for name in ("correct", "intersection_background", "intersection_foreground")}
    for union, part in (("labeled", "correct"), ("union_background", "intersection_background"),
                        ("union_foreground", "intersection_foreground")):
        counts[union] = counts[part] + generator.integers(1, 400, shape)
    counts["ap"] = generator.random(count).astype(np.float32)
    segmentation = get_metric("segmentation")
    assert isinstance(segmentation.reduce, Stacked)
    options = {} if threshold == "mean" else {"threshold": threshold}
    report = segmentation.reporter(options)

    def plain(rows):
        total = {name: counts[name][rows].astype(np.float64).sum(0) for name in counts if name != "ap"}
        accuracy = total["correct"] / (np.spacing(1) + total["labeled"])
        miou = (total["intersection_background"] / (np.spacing(1) + total["union_background"])
                + total["intersection_foreground"] / (np.spacing(1) + total["union_foreground"])) / 2
        best = int(np.argmax(miou)) if miou.ndim else None
        best_accuracy = int(np.argmax(accuracy)) if threshold == "best_per_metric" else best
        pick = (lambda array, at: array) if best is None else (lambda array, at: array[at])
        return {"pixel_accuracy": 100 * pick(accuracy, best_accuracy), "miou": 100 * pick(miou, best),
                "map": 100 * counts["ap"][rows].astype(np.float64).mean()}

    values = {name: torch.from_numpy(array) for name, array in counts.items()}
    found, positions = bootstrap(values, report, SEED), resampled_positions(count, SEED).numpy()
    for r in range(0, 1000, 71):
        for key, expected in plain(positions[r]).items():
            assert found[key][r] == pytest.approx(expected, rel=1e-6)
    assert report(values)["miou"] == pytest.approx(plain(np.arange(count))["miou"], rel=1e-6)

    hit, excluded = generator.random(count) > 0.4, generator.random(count) > 0.7
    excluded[:] = True if threshold == "mean" else excluded      # once, every image left out: NaN
    pointing = bootstrap({"hit": torch.from_numpy(hit), "excluded": torch.from_numpy(excluded).long()},
                         get_metric("pointing_game").reporter({}), SEED)
    for r in range(0, 1000, 71):
        kept = ~excluded[positions[r]]
        assert pointing["included"][r] == kept.sum() and pointing["excluded"][r] == count - kept.sum()
        if kept.any():
            assert pointing["accuracy"][r] == pytest.approx(hit[positions[r]][kept].mean(), abs=1e-12)
        else:
            assert np.isnan(pointing["accuracy"][r])
