"""The control of a stability protocol (docs/decisions/metric-trust.md, "The control of a stability protocol"): the
random map is drawn afresh for every perturbed copy an image is explained on, so max-sensitivity and numerical
stability score it as the least stable map there is and the trust check can tell it from real methods; elsewhere
the random map stays one seeded map."""
from __future__ import annotations

import pytest
import torch

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.tables import UNTRUSTED
from vitexplain.datasets import collate, get_dataset
from vitexplain.evaluation import reexplainer
from vitexplain.metrics.numerical_stability import numerical_stability
from vitexplain.metrics.sensitivity import max_sensitivity
from vitexplain.models import load_model
from vitexplain.registry import get_method, register_method
from vitexplain.uncertainty import MIN_IMAGES

METHODS = ["gae", "rollout", "random_baseline"]
SAMPLES = 3
DATASET = {"name": "digits", "options": {"split": "test", "n": 40}}


@pytest.fixture(scope="module")
def digits():
    model, config = load_model("digits_vit", device="cpu")
    images = collate([get_dataset("digits", n=2, preprocess=config)[i] for i in range(2)])["images"]
    return model, images


def _pearson(first: torch.Tensor, second: torch.Tensor) -> float:
    a, b = first.flatten().double(), second.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_the_random_control_draws_afresh_for_each_copy_and_nothing_else_does(digits):
    model, images = digits
    adapter = vitexplain.adapter_for(model)
    targets = torch.tensor([0, 1])
    again = reexplainer(adapter, get_method("random_baseline").bind({"seed": 7}))
    own = again(images, targets)
    assert torch.equal(own, vitexplain.explain(model, images, "random_baseline", seed=7))   # still the seeded map
    first, second = again(images, targets, copy=1), again(images, targets, copy=2)
    assert torch.equal(first, again(images, targets, copy=1))                               # reproducible
    assert torch.equal(first[0], first[1])                       # shared by the images of a copy, as the method is
    for one, other in ((own, first), (own, second), (first, second)):
        assert not torch.equal(one, other)
        # two independent U[0, 1) maps of 14 x 14 cells: r is about 0 with a spread of 1/14; 0.35 is 5 spreads
        assert abs(_pearson(one[0], other[0])) < 0.35
    assert torch.equal(again(images, targets, seed=3, copy=1), again(images, targets, seed=3, copy=1))
    assert not torch.equal(again(images, targets, seed=3, copy=1), first)                  # a given seed is the base
    for method, options in (("gae", {}), ("rise", {"n_masks": 8, "seed": 2})):            # deterministic, randomised
        method_again = reexplainer(adapter, get_method(method).bind(options))
        assert torch.equal(method_again(images, targets, copy=3), method_again(images, targets))


def test_only_a_seeded_control_can_draw_afresh():
    with pytest.raises(ValueError, match="fresh_per_copy is for a control"):
        register_method("robustness_not_a_control", fresh_per_copy=True)(lambda adapter, images, target=None: images)
    with pytest.raises(ValueError, match="needs a seed option"):
        register_method("robustness_unseeded", control=True, fresh_per_copy=True)(
            lambda adapter, images, target=None: images)


def test_a_plain_callable_is_called_without_a_copy():
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    seen = []

    def plain(x, t):
        seen.append("plain")
        return x[:, 0]

    def aware(x, t, copy=None):
        seen.append(copy)
        return x[:, 0]

    for explain in (plain, aware):
        max_sensitivity(explain, images, images[:, 0], torch.zeros(2), n_samples=2, radius=0.01)
        numerical_stability(explain, lambda change: _Unchanged(), images, images[:, 0], torch.zeros(2))
    assert seen == ["plain"] * 6 + [1, 2, 1, 2, 3, 4]           # max-sensitivity's 2 samples, then the 4 kinds


class _Unchanged:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """digits_vit on the fewest images that get an interval, the two stability protocols, two real methods and the
    random control, through the bench (its re-explanations, its trust check)."""
    config = BenchConfig(models=["digits_vit"], methods=METHODS, dataset=DATASET, limit=MIN_IMAGES,
                         batch_size=MIN_IMAGES, metrics=[{"name": "max_sensitivity", "options": {"n_samples": SAMPLES}},
                                                         "numerical_stability"],
                         output_dir=tmp_path_factory.mktemp("robustness") / "out", progress=False, device="cpu",
                         gallery=0)
    result = run_benchmark(config)
    assert not result.errors
    return config, result


def test_the_stability_protocols_score_the_control_as_the_least_stable_map(bench):
    _, result = bench
    scores = result.scores["digits_vit"]
    # Two independent U[0, 1) maps a, b: E (a - b)^2 = 1/6 and E a^2 = 1/3, so ||a - b|| / ||a|| is about
    # sqrt(1/2) = 0.71 on 196 cells, whatever the image; a map that follows its image changes by far less.
    assert scores["random_baseline"]["max_sensitivity"]["max_sensitivity"] > 0.55
    # ... and their Pearson r is about 0 (spread 1/14), the lowest of four draws at most a little below
    assert abs(scores["random_baseline"]["numerical_stability"]["r_worst"]) < 0.35
    for method in ("gae", "rollout"):
        assert scores[method]["max_sensitivity"]["max_sensitivity"] < 0.5 * scores["random_baseline"][
            "max_sensitivity"]["max_sensitivity"]
        assert scores[method]["numerical_stability"]["r_worst"] > 0.5


def test_the_trust_check_tells_the_control_from_the_methods_and_could_not_without_fresh_draws(bench, digits):
    _, result = bench
    untrusted = {(lead.metric, lead.number) for lead in result.untrusted("digits_vit")}
    assert set(result.trust["digits_vit"]["numerical_stability"]) == {
        "r_bf16_weights", "r_noise_weights", "r_bf16_input", "r_noise_input", "r_worst"}
    for label, numbers in result.trust["digits_vit"].items():
        for number, trust in numbers.items():
            assert trust["best"] in ("gae", "rollout")
            assert trust["random"]["separates"], (label, number, trust["random"])
            assert trust["random"]["advantage"][1] > 0                      # the whole interval above 0
            assert (label, number) not in untrusted
    for lead in result.summary("digits_vit"):
        assert lead.leaders() != UNTRUSTED and lead.trust_text().startswith("separates random: yes")
    assert not any("cannot tell the random control" in line for line in result.verdict_lines("digits_vit"))
    # The control as it was, one seeded map for an image and every copy of it, is perfectly stable: max-sensitivity
    # 0 and r 1 on every image, the best values these numbers have, so no method could ever be told from it.
    model, images = digits
    fixed = vitexplain.explain(model, images, "random_baseline")
    targets = torch.zeros(len(images), dtype=torch.long)
    assert torch.equal(max_sensitivity(lambda x, t: fixed, images, fixed, targets, n_samples=SAMPLES),
                       torch.zeros(len(images)))
    old = numerical_stability(lambda x, t: fixed, lambda change: _Unchanged(), images, fixed, targets)
    assert all(torch.equal(value, torch.ones(len(images), dtype=value.dtype)) for value in old.values())
