"""LATEC's view of a benchmark (vitexplain.bench.ranks): mean ranks per kind of protocol against a plain computation,
their paired bootstrap interval, and the reports of a real run that asks for them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.config import SHIPPED_CONFIGS, read_config
from vitexplain.bench.ranks import Ranked, mean_ranks
from vitexplain.bench.uncertainty import Sample
from vitexplain.uncertainty import TOO_FEW, Means, bootstrap

from conftest import make_vit
from test_bench_fakes import RandomImages


def _number(label: str, higher: bool, per_image: dict[str, list[float]], indices=None, mean_only=False) -> Ranked:
    """A number reported as the mean of per-image values, with each method's bootstrap as the bench makes it; LATEC
    ranks their median (``mean_only``: a number that is not such a mean, ranked as reported)."""
    report = Means(value="value")
    samples, scores = {}, {}
    for method, values in per_image.items():
        found = {"value": torch.tensor(values, dtype=torch.float64)}
        rows = list(range(len(values))) if indices is None else indices[method]
        samples[method] = Sample(rows, found, bootstrap(found, report, seed=0))
        scores[method] = float(np.mean(values))
    values = None if mean_only else {m: torch.tensor(v, dtype=torch.float64) for m, v in per_image.items()}
    return Ranked(label, "value", higher, scores, samples, values, seed=0)


def _plain_rank(scores: dict[str, float], higher: bool) -> dict[str, float]:
    """1 = best; tied methods share the mean of the ranks they span."""
    ranks = {}
    for method, score in scores.items():
        better = sum((other > score) if higher else (other < score) for other in scores.values())
        equal = sum(other == score for other in scores.values())
        ranks[method] = better + (equal + 1) / 2
    return ranks


def test_mean_ranks_are_the_mean_over_numbers_of_the_ranks_of_each_methods_median():
    rng = np.random.default_rng(0)
    numbers = [_number(f"m{k}", higher, {m: list(rng.normal(size=12) + shift) for m, shift in
                                         zip("abcd", rng.normal(size=4))})
               for k, higher in enumerate([True, False, True])]
    numbers.append(_number("tie", True, {"a": [1.0] * 12, "b": [1.0] * 12, "c": [0.0] * 12, "d": [2.0] * 12}))
    numbers.append(_number("mean", True, {m: list(rng.normal(size=12)) for m in "abcd"}, mean_only=True))
    found = mean_ranks(numbers, controls=set())
    medians = [{m: n.scores[m] if n.per_image is None else float(np.median(n.per_image[m])) for m in "abcd"}
               for n in numbers]
    plain = {m: np.mean([_plain_rank(score, n.higher)[m] for score, n in zip(medians, numbers)]) for m in "abcd"}
    assert found["methods"].keys() == plain.keys()
    for method, (mean, low, high) in found["methods"].items():
        assert mean == pytest.approx(plain[method])
        assert 1 <= low <= high <= 4
    assert list(found["methods"]) == sorted(plain, key=plain.get)     # best first
    assert found["numbers"] == ["m0/value", "m1/value", "m2/value", "tie/value", "mean/value"]
    assert found["interval"] is True


def test_the_median_not_the_mean_decides_as_latec_ranks():
    """One outlier image makes a's mean the higher, b's median is the higher: LATEC's rank follows the median."""
    found = mean_ranks([_number("x", True, {"a": [0.0] * 11 + [100.0], "b": [1.0] * 12})], controls=set())
    assert found["methods"]["b"][0] == 1.0 and found["methods"]["a"][0] == 2.0


def test_a_method_best_on_every_image_of_every_number_has_rank_one_without_doubt():
    numbers = [_number(label, higher, {"best": [10.0 * sign + k for k in range(12)],
                                       "worst": [-10.0 * sign + k for k in range(12)]})
               for label, higher, sign in (("x", True, 1), ("y", False, -1))]
    found = mean_ranks(numbers, controls=set())
    assert found["methods"]["best"] == [1.0, 1.0, 1.0] and found["methods"]["worst"] == [2.0, 2.0, 2.0]


def test_controls_and_methods_missing_a_number_are_left_out():
    numbers = [_number("x", True, {"a": [1.0] * 12, "b": [2.0] * 12, "random_baseline": [3.0] * 12}),
               _number("y", True, {"a": [1.0] * 12, "random_baseline": [3.0] * 12})]
    found = mean_ranks(numbers, controls={"random_baseline"})
    assert list(found["methods"]) == ["a"] and found["left_out"] == ["b"]


def test_without_paired_images_the_mean_rank_stands_alone():
    few = mean_ranks([_number("x", True, {"a": [1.0, 2.0], "b": [0.0, 1.0]})], controls=set())
    assert few["interval"] == TOO_FEW and np.isnan(few["methods"]["a"][1]) and few["methods"]["a"][0] == 1.0
    apart = _number("x", True, {"a": [float(k) for k in range(12)], "b": [float(k) for k in range(12)]},
                    indices={"a": list(range(12)), "b": list(range(1, 13))})
    assert mean_ranks([apart], controls=set())["interval"] == TOO_FEW


def test_a_run_with_ranks_reports_latecs_view_per_kind_of_protocol(tmp_path):
    def config(ranks: bool) -> BenchConfig:
        return BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["rollout", "gae", "random_baseline"],
                           metrics=["sparseness", {"name": "insertion_deletion", "options": {"n_steps": 2}}],
                           dataset=RandomImages(10), batch_size=10, output_dir=tmp_path / "out", progress=False,
                           device="cpu", gallery=0, ranks=ranks)

    result = run_benchmark(config(True))
    ranks = result.ranks["tiny"]
    assert set(ranks) == {"complexity", "faithfulness"}
    directions = result.higher_is_better["insertion_deletion"]
    assert ranks["faithfulness"]["numbers"] == [f"insertion_deletion/{n}" for n in directions]
    assert set(ranks["complexity"]["methods"]) == {"rollout", "gae"}          # the control is not ranked
    scores = result.scores["tiny"]
    plain = {m: np.mean([_plain_rank({k: scores[k]["insertion_deletion"][n] for k in ("rollout", "gae")},
                                     higher)[m] for n, higher in directions.items()])
             for m in ("rollout", "gae")}
    assert {m: found[0] for m, found in ranks["faithfulness"]["methods"].items()} == pytest.approx(plain)
    assert "LATEC's view" in result.text() and "LATEC's view" in result.markdown()
    without = run_benchmark(config(False))                    # from the cache: the same scores, no ranks
    assert without.ranks == {} and "LATEC" not in without.text() and without.scores == result.scores


def test_a_shipped_config_is_found_by_its_name_and_an_unknown_name_lists_them():
    assert read_config("default") == read_config(SHIPPED_CONFIGS["default"])
    with pytest.raises(ValueError, match="shipped config: default"):
        read_config("no-such-config")


def test_the_ranks_flag_and_a_shipped_config_name_reach_the_config():
    from vitexplain.cli import bench as bench_cli
    from vitexplain.cli.main import build_parser

    parse = build_parser().parse_args
    assert bench_cli.config_from_args(parse(["bench", "--ranks"])).ranks is True
    assert bench_cli.config_from_args(parse(["bench"])).ranks is False
    latec = bench_cli.config_from_args(parse(["bench", "--config", "latec", "--limit", "2"]))
    assert latec.ranks is True and latec.limit == 2 and "lime" in {entry.name for entry in latec.methods}
