"""Seeded draws do not depend on the device they are used on.

Every registered method and metric that takes a ``seed`` draws its random numbers on the CPU, from
a generator of its own made by :func:`vitexplain.seeding.seeded_draw`, and leaves the caller's
random state as it was; so one seed gives one map on any device.

CI has no GPU: there the images are on the CPU, and a generator made on the images' device would
pass a check of the generator's device. So these tests check where the draws come from: every
generator is made by ``seeded_draw`` (with no device but the CPU), and every random call runs inside
it with an explicit CPU generator and gives a CPU tensor. The maps themselves are compared across
devices by ``benchmarks/gpu_check.py --parts seeds`` on a machine with a GPU.
"""
from __future__ import annotations

import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import vitexplain
from vitexplain import available_methods, get_method
from vitexplain.methods._captum import with_captum_draws
from vitexplain.metrics import available_metrics, get_metric
from vitexplain.seeding import seeded_draw

from conftest import make_vit
from quick import method_options, metric_options
from test_metrics_contract import make_batch

#: options under which a protocol draws random numbers at all (its small settings: tests/quick.py)
DRAWING = {"insertion_deletion": dict(baseline="random")}
SEEDED_METHODS = [name for name in available_methods("image") if get_method(name).randomised]
SEEDED_METRICS = [name for name in available_metrics() if "seed" in get_metric(name).options]
#: the functions and tensor methods that draw random numbers
RANDOM_CALLS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                "bernoulli", "multinomial", "poisson", "binomial", "uniform_", "normal_", "random_", "exponential_",
                "cauchy_", "log_normal_", "geometric_", "bernoulli_"}


def called_from(frame, function) -> bool:
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False


class RandomCalls(TorchFunctionMode):
    """Records every random call: its name, its generator's device (None: the global generator), the
    device of what it drew, and whether it ran inside ``seeded_draw``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if getattr(func, "__name__", None) in RANDOM_CALLS:
            generator = kwargs.get("generator")
            self.calls.append({"call": func.__name__, "generator": generator and generator.device.type,
                               "drawn_on": result.device.type,
                               "in_seeded_draw": called_from(sys._getframe(1), seeded_draw),
                               "in_captum_draws": called_from(sys._getframe(1), with_captum_draws)})
        return result


@pytest.fixture
def recorded(monkeypatch):
    """(random calls, generators made) while the test runs: a generator is recorded with the device it was
    asked for and whether ``seeded_draw`` made it."""
    made = []
    plain = torch.Generator

    def recording_generator(*args, **kwargs):
        device = kwargs.get("device", args[0] if args else "cpu")
        made.append({"device": torch.device(device).type,
                     "by_seeded_draw": sys._getframe(1).f_code is seeded_draw.__code__})
        return plain(*args, **kwargs)

    monkeypatch.setattr(torch, "Generator", recording_generator)
    states = global_rng_states()
    with RandomCalls() as mode:
        yield mode.calls, made
    for before, after in zip(states, global_rng_states()):
        assert torch.equal(before, after), "the global random state changed"


def global_rng_states() -> list[torch.Tensor]:
    return [torch.get_rng_state()] + (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])


def assert_drawn_on_the_cpu_by_seeded_draw(calls: list[dict], made: list[dict], what: str) -> None:
    assert calls, f"{what} takes a seed but drew nothing"
    for call in calls:       # Captum draws from the global CPU generator, which with_captum_draws seeds and restores
        seeded = {"generator": None, "in_captum_draws": True} if call["in_captum_draws"] else \
            {"generator": "cpu", "in_seeded_draw": True}
        assert call == {**call, **seeded, "drawn_on": "cpu"}, \
            f"{what}: a random call not drawn on the CPU by seeded_draw: {call}"
    for generator in made:
        assert generator == {"device": "cpu", "by_seeded_draw": True}, \
            f"{what}: a generator made elsewhere: {generator}"


@pytest.fixture(scope="module")
def model():
    return make_vit(depth=2)


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def batch(model):
    """A batch explained by a method that draws nothing, made before anything is recorded."""
    return make_batch(model, "gae")


def test_the_registries_have_seeded_methods_and_metrics():
    assert {"random_baseline", "rise", "smoothgrad", "tis", "vitcx"} <= set(SEEDED_METHODS)
    assert {"insertion_deletion", "max_sensitivity"} <= set(SEEDED_METRICS)


@pytest.mark.parametrize("method", SEEDED_METHODS)
def test_seeded_method_draws_on_the_cpu_through_seeded_draw(model, images, recorded, method):
    vitexplain.explain(model, images, method, seed=3, **method_options(method))
    assert_drawn_on_the_cpu_by_seeded_draw(*recorded, method)


@pytest.mark.parametrize("name", SEEDED_METRICS)
def test_seeded_metric_draws_on_the_cpu_through_seeded_draw(batch, recorded, name):
    metric = get_metric(name)
    metric.compute(batch, **{**metric.options, **metric_options(name), **DRAWING.get(name, {}), "seed": 3})
    assert_drawn_on_the_cpu_by_seeded_draw(*recorded, name)


@pytest.mark.parametrize("name", SEEDED_METRICS)
def test_seeded_metric_same_seed_same_values_other_seed_other_values(batch, name):
    """(The methods' counterpart is in test_method_contract.py.)"""
    metric = get_metric(name)
    options = {**metric.options, **metric_options(name), **DRAWING.get(name, {})}
    first, again, other = (metric.compute(batch, **{**options, "seed": seed}) for seed in (3, 3, 4))
    assert all(_identical(first[key], again[key]) for key in first)
    assert any(not _identical(first[key], other[key]) for key in first)


def _identical(one: torch.Tensor, other: torch.Tensor) -> bool:
    """Equal values, NaN where the other is NaN (model randomisation's seed floor of a deterministic method)."""
    return one.shape == other.shape and bool(((one == other) | (one.isnan() & other.isnan())).all())


def test_a_generator_made_on_the_images_device_is_caught(recorded):
    """The regression these tests are for, caught on CPU-only CI, where the images' device is the CPU."""
    images = torch.zeros(1, 3, 4, 4)
    torch.rand(2, generator=torch.Generator(device=images.device).manual_seed(0))
    calls, made = recorded
    assert calls == [{"call": "rand", "generator": "cpu", "drawn_on": "cpu", "in_seeded_draw": False,
                      "in_captum_draws": False}]
    assert made == [{"device": "cpu", "by_seeded_draw": False}]
    with pytest.raises(AssertionError, match="not drawn on the CPU by seeded_draw"):
        assert_drawn_on_the_cpu_by_seeded_draw(calls, made, "a regression")


def test_seeded_draw_moves_what_it_drew_and_keeps_the_cpu_numbers():
    grids, shifts = seeded_draw(5, lambda generator: (torch.rand(3, 2, generator=generator),
                                                     torch.randint(0, 4, (3,), generator=generator)), "meta")
    assert grids.device.type == shifts.device.type == "meta" and shifts.dtype == torch.int64
    generator = torch.Generator().manual_seed(5)
    assert torch.equal(seeded_draw(5, lambda g: torch.rand(3, 2, generator=g)), torch.rand(3, 2, generator=generator))
