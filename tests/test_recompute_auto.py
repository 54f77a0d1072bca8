"""``recompute="auto"`` (issue 34): every LRP method with the switch keeps its rules' graphs when the estimated peak
fits the memory budget and computes each block again otherwise, logs the choice, and returns bitwise the same maps
on either path (docs/decisions/performance.md, "recompute='auto'")."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from vitexplain import adapter_for, explain
from vitexplain.instrumentation.lrp import memory
from vitexplain.options import InvalidOption, parse_option
from vitexplain.registry import METHODS

from conftest import make_vit
from test_lrp import images_like, randomise_biases

#: every method with the switch, with the options that reach each of its code paths
SWITCHED = [("transformer_attribution", {}), ("transformer_attribution", {"start_layer": 1}), ("abs_lrp", {}),
            ("lrp", {}), ("conservative_lrp", {}), ("attnlrp", {}), ("attnlrp", {"at": "patches"}), ("cp_lrp", {}),
            ("pa_lrp", {})]


@pytest.fixture(scope="module")
def model():
    return randomise_biases(make_vit(depth=2)).double()


def test_every_method_with_the_switch_defaults_to_auto():
    switched = {name for name in METHODS.names() if "recompute" in METHODS.get(name).options}
    assert switched == {name for name, _ in SWITCHED}
    assert all(METHODS.get(name).options["recompute"] == "auto" for name in switched)


@pytest.mark.parametrize("method, options", SWITCHED)
def test_auto_takes_the_path_the_budget_allows_and_the_maps_are_bitwise_equal(method, options, model, monkeypatch,
                                                                               caplog):
    x = images_like(dtype=torch.float64)
    kept = explain(model, x, method, recompute=False, **options)
    again = explain(model, x, method, recompute=True, **options)
    assert torch.equal(kept, again) and kept.abs().sum() > 0
    for budget, recomputes in (("1K", True), ("1T", False)):
        monkeypatch.setenv(memory.BUDGET_VARIABLE, budget)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="vitexplain"), memory.collecting() as made:
            auto = explain(model, x, method, **options)
        decision = memory.last_decision()
        assert made == [decision] * len(made) and made  # abs_lrp's two passes decide alike
        assert (decision.method, decision.asked, decision.recompute) == (method, "auto", recomputes)
        assert decision.budget == memory.parse_bytes(budget) and decision.source == memory.BUDGET_VARIABLE
        assert 0 < decision.estimate
        logged = [record.getMessage() for record in caplog.records if record.name == "vitexplain"]
        path = "computes each block again" if recomputes else "keeps the rules' graphs"
        assert any(method in line and "auto" in line and path in line for line in logged), logged
        assert torch.equal(auto, kept)


@pytest.mark.parametrize("method", sorted({name for name, _ in SWITCHED}))
def test_in_float32_auto_is_the_path_it_chose_bitwise(method, monkeypatch):
    """In float32 too, every map is bitwise equal on both paths, but transformer attribution's: its recomputed path's
    forward keeps the plain graph through PyTorch's fused attention (docs/decisions/performance.md), whose rounding
    differs from the written-out attention's by ~1e-7 of the map's largest value."""
    model, x = randomise_biases(make_vit(depth=2)), images_like()
    paths = {recompute: explain(model, x, method, recompute=recompute) for recompute in (False, True)}
    for budget, recomputes in (("0", True), ("1T", False)):
        monkeypatch.setenv(memory.BUDGET_VARIABLE, budget)
        assert torch.equal(explain(model, x, method), paths[recomputes])
    if method == "transformer_attribution":
        assert (paths[False] - paths[True]).abs().max() <= 1e-6 * paths[False].abs().max()
    else:
        assert torch.equal(paths[False], paths[True])


@pytest.mark.parametrize("method, module", [("transformer_attribution", "transformer_attribution"),
                                            ("abs_lrp", "abs_lrp"), ("lrp", "lrp"),
                                            ("conservative_lrp", "conservative_lrp"), ("attnlrp", "_attention_aware"),
                                            ("cp_lrp", "_attention_aware")])
def test_the_path_decided_is_the_path_run(method, module, monkeypatch):
    """The decision reaches every relevance pass the method runs."""
    import importlib

    found = importlib.import_module(f"vitexplain.methods.{module}")
    passed = []
    original = found.relevance

    def spy(*args, recompute, **kwargs):
        passed.append(recompute)
        return original(*args, recompute=recompute, **kwargs)

    monkeypatch.setattr(found, "relevance", spy)
    for budget, recomputes in (("0", True), ("1T", False)):
        monkeypatch.setenv(memory.BUDGET_VARIABLE, budget)
        passed.clear()
        explain(make_vit(depth=2), images_like(), method)
        assert passed and all(value is recomputes for value in passed)


def test_the_estimate_grows_with_batch_tokens_blocks_and_precision():
    def estimate(model, batch=1, **options):
        return memory.kept_graph_bytes(adapter_for(model), images_like(batch=batch), "lrp", **options)

    small = estimate(make_vit(depth=2))
    assert estimate(make_vit(depth=2), batch=2) == pytest.approx(2 * small, abs=2)
    assert estimate(make_vit(depth=2), blocks=1) == pytest.approx(small / 2, abs=2)
    assert estimate(make_vit(depth=4)) == pytest.approx(2 * small, abs=2)
    assert estimate(make_vit(depth=2).double()) == pytest.approx(2 * small, abs=2)
    assert estimate(make_vit(depth=2).half()) == small  # float16 weights are seen in float32 by the rules
    larger = make_vit(depth=2, img_size=64)
    assert memory.kept_graph_bytes(adapter_for(larger), torch.zeros(1, 3, 64, 64), "lrp") > 4 * small


@pytest.mark.parametrize("text, expected", [("1024", 1024), ("512M", 512 * 2 ** 20), ("2G", 2 * 2 ** 30),
                                            ("1.5g", int(1.5 * 2 ** 30)), ("3 GiB", 3 * 2 ** 30), ("64kb", 65536),
                                            ("1T", 2 ** 40), (" 0 ", 0)])
def test_the_budget_parses_bytes_with_suffixes(text, expected):
    assert memory.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1G", "2X", "1e9", "G"])
def test_a_bad_budget_is_refused_in_one_line(text, monkeypatch):
    monkeypatch.setenv(memory.BUDGET_VARIABLE, text)
    with pytest.raises(ValueError) as error:
        memory.memory_budget("cpu")
    message = str(error.value)
    assert "\n" not in message and memory.BUDGET_VARIABLE in message and repr(text) in message
    with pytest.raises(ValueError, match=memory.BUDGET_VARIABLE):
        explain(make_vit(depth=2), images_like(), "lrp")


def test_the_cpu_budget_is_a_share_of_the_available_memory(monkeypatch):
    monkeypatch.delenv(memory.BUDGET_VARIABLE, raising=False)
    monkeypatch.setattr(memory, "_available_ram", lambda: 10 * 2 ** 30)
    assert memory.memory_budget("cpu") == (int(memory.MARGIN * 10 * 2 ** 30), "available RAM")
    monkeypatch.setattr(memory, "_available_ram", lambda: None)
    assert memory.memory_budget("cpu") == (None, "unknown")
    decided = memory.choose_recompute("lrp", "auto", adapter_for(make_vit(depth=2)), images_like())
    assert decided is True and memory.last_decision().source == "unknown"


def test_the_available_ram_is_read(monkeypatch):
    monkeypatch.delenv(memory.BUDGET_VARIABLE, raising=False)
    budget, source = memory.memory_budget("cpu")
    assert source == "available RAM" and budget > 0


def test_on_cuda_the_budget_is_a_share_of_the_free_memory(monkeypatch):
    """No GPU needed: ``torch.cuda.mem_get_info`` and the allocator's figures stubbed."""
    monkeypatch.delenv(memory.BUDGET_VARIABLE, raising=False)
    free = 6 * 2 ** 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2 ** 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * 2 ** 30)
    assert memory.memory_budget("cuda") == (int(memory.MARGIN * (free + 2 ** 30)), "cuda free memory")
    assert memory.memory_budget(torch.device("cuda", 0))[1] == "cuda free memory"
    monkeypatch.setenv(memory.BUDGET_VARIABLE, "1M")  # the variable wins on CUDA too
    assert memory.memory_budget("cuda") == (2 ** 20, memory.BUDGET_VARIABLE)


def test_explicit_values_are_taken_as_given_and_others_refused(monkeypatch):
    monkeypatch.setenv(memory.BUDGET_VARIABLE, "0")
    adapter, x = adapter_for(make_vit(depth=2)), images_like()
    assert memory.choose_recompute("lrp", False, adapter, x) is False
    assert memory.last_decision() == memory.Decision("lrp", False, False)
    assert memory.choose_recompute("lrp", True, adapter, x) is True
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        memory.choose_recompute("lrp", "sometimes", adapter, x)
    with pytest.raises(InvalidOption, match="True or False or one of 'auto'"):
        explain(make_vit(depth=2), x, "lrp", recompute="sometimes")


@pytest.mark.parametrize("text, value", [("recompute=auto", "auto"), ("recompute=true", True),
                                         ("recompute=False", False)])
def test_the_option_parses_from_the_command_line(text, value):
    for name in ("lrp", "transformer_attribution", "attnlrp", "abs_lrp"):
        assert parse_option(f"method {name!r}", METHODS.get(name).fn, text) == ("recompute", value)
    with pytest.raises(InvalidOption):
        parse_option("method 'lrp'", METHODS.get("lrp").fn, "recompute=maybe")


def test_the_passes_counted_at_the_default_are_the_kept_path():
    assert METHODS.get("lrp").passes() == 4 and METHODS.get("lrp").passes({"recompute": True}) == 5
    assert METHODS.get("abs_lrp").passes() == 8 and METHODS.get("abs_lrp").passes({"recompute": True}) == 10


@pytest.mark.parametrize("budget, path", [("1K", "recomputed"), ("1T", "kept")])
def test_the_bench_records_the_path_its_maps_took(budget, path, tmp_path, monkeypatch):
    from vitexplain.bench import BenchConfig, run_benchmark

    from test_bench_fakes import RandomImages

    monkeypatch.setenv(memory.BUDGET_VARIABLE, budget)
    config = BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["transformer_attribution", "rollout"],
                         metrics=["sparseness"], dataset=RandomImages(5), batch_size=2, output_dir=tmp_path / "out",
                         progress=False, device="cpu", sanity=None, gallery=0)
    result = run_benchmark(config)
    recorded = result.memory["tiny"]
    assert list(recorded) == ["transformer_attribution"]             # rollout has no switch
    assert list(recorded["transformer_attribution"]) == [path]
    assert recorded["transformer_attribution"][path]["batches"] == 3   # 5 images in batches of 2
    assert "transformer_attribution: recompute='auto'" in recorded["transformer_attribution"][path]["last"]
    stored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert stored["memory"]["tiny"] == recorded
