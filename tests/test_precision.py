"""Maps in the precisions users run: explanations compute in float32 whatever the caller set up, the forwards
that only score inputs keep the caller's precision, and every flag and weight comes back as it was — on the shipped
models for every method, and on one example of every registered family (:func:`zoo.enrolled`) for a recording
method and an LRP one."""
from __future__ import annotations

import copy
import textwrap
import warnings

import pytest
import torch

import vitexplain
from vitexplain import api
from vitexplain.datasets.base import collate, get_dataset
from vitexplain.instrumentation.precision import (
    MatmulFlags,
    caller_precision,
    float32_scope,
    precision_mode,
    precision_modes,
)
from vitexplain.models import load_model
from vitexplain.registry import get_method

from cli import run_python_many
from conftest import make_vit
from quick import method_options
from zoo import enrolled, randomise

#: fewer samples than the defaults, so every method runs in seconds (the masks and samples are the same in
#: every precision: only the arithmetic differs); a method not named takes the suite's small settings (tests/quick.py)
QUICK = {"tis": {"n_masks": 32}, "rise": {"n_masks": 64}, "vitcx": {"batch_size": 64},
         "integrated_gradients": {"n_steps": 8}, "smoothgrad": {"n_samples": 4}, "tam": {"n_steps": 4},
         "bt_token": {"n_steps": 4}, "bt_head": {"n_steps": 4}, "occlusion": {"window": 32, "stride": 16}}
METHODS = [m for m in vitexplain.available_methods("image") if m != "constant_baseline"]


def pearson(maps: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """r of each map with its reference, in float64."""
    a, b = maps.flatten(1).double(), reference.flatten(1).double()
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


@pytest.fixture(scope="module")
def canvases():
    dataset = get_dataset("digits", split="test", n=3)
    return collate([dataset[i] for i in range(3)])["images"]


@pytest.fixture(scope="module", params=["digits_vit", "digits_deit"])
def shipped(request):
    return load_model(request.param, device="cpu")[0]


@pytest.mark.parametrize("method", METHODS)
def test_maps_hold_under_cpu_autocast_and_low_precision_weights(shipped, canvases, method, monkeypatch):
    """Autocast: the float32 map. bfloat16 weights: the float32 map of those weights (the rounding of the weights
    is a different model; where it was measured to move a method's maps, the method warns with the figure)."""
    monkeypatch.setattr(api, "_WARNED", set())
    options = QUICK.get(method, method_options(method))
    reference = vitexplain.explain(shipped, canvases, method, **options)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = vitexplain.explain(shipped, canvases, method, **options)
    low = copy.deepcopy(shipped).to(torch.bfloat16)
    rounded = vitexplain.explain(copy.deepcopy(low).float(), canvases, method, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        weights = vitexplain.explain(low, canvases, method, **options)
    for maps in (autocast, weights):
        assert maps.dtype == torch.float32 and torch.isfinite(maps).all()
    assert pearson(autocast, reference).min() >= 0.99
    assert pearson(weights, rounded).min() >= 0.99
    caveat = get_method(method).precision_caveats.get("bfloat16 weights")
    said = [str(w.message) for w in caught if str(w.message).startswith(f"{method} in bfloat16 weights")]
    assert len(said) == (caveat is not None) and (caveat is None or f"r = {caveat:.3f}" in said[0])


def _maps_or_refusal(model, inputs, method):
    try:
        return vitexplain.explain(model, inputs, method, 0, classes=True)
    except (vitexplain.UnsupportedModelError, ValueError) as refusal:  # no LRP here, or a text model
        return str(refusal)


def keeps_its_precision(model, inputs):
    """GAE (a recording) and AttnLRP (relevance) on ``model``: under CPU autocast, the float32 maps; with bfloat16
    weights, the float32 maps of those weights, and the weights left in bfloat16 (or refused the same way)."""
    for method in ("gae", "attnlrp"):
        reference = _maps_or_refusal(model, inputs, method)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = _maps_or_refusal(model, inputs, method)
        low = copy.deepcopy(model).to(torch.bfloat16)
        rounded = _maps_or_refusal(copy.deepcopy(low).float(), inputs, method)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the caveat of a method measured to move (tested above)
            weights = _maps_or_refusal(low, inputs, method)
        assert {parameter.dtype for parameter in low.parameters()} == {torch.bfloat16}
        if isinstance(reference, str):
            assert autocast == weights == rounded == reference
            continue
        assert autocast.dtype == weights.dtype == torch.float32
        torch.testing.assert_close(autocast, reference)
        torch.testing.assert_close(weights, rounded)


@pytest.mark.parametrize("label", list(enrolled()))
def test_every_family_explains_in_float32_whatever_the_callers_precision(label):
    example = enrolled()[label][1]
    torch.manual_seed(0)
    keeps_its_precision(randomise(example.make()), example.inputs())


def test_the_model_comes_back_as_it_was_also_after_an_error(canvases):
    model = make_vit(img_size=112).to(torch.bfloat16)
    before = {name: (t.dtype, t.data_ptr()) for name, t in model.state_dict(keep_vars=True).items()}
    flags = MatmulFlags.read()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ValueError, match="start_layer"):
            vitexplain.explain(model, canvases, "rollout", start_layer=99)
        vitexplain.explain(model, canvases, "gae")
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert {name: (t.dtype, t.data_ptr()) for name, t in model.state_dict(keep_vars=True).items()} == before
    assert MatmulFlags.read() == flags


def test_recordings_and_relevance_are_float32_while_scoring_forwards_keep_the_callers_precision(canvases):
    model = make_vit(img_size=112)
    adapter = vitexplain.adapter_for(model)
    with torch.autocast("cpu", dtype=torch.bfloat16), adapter.call(canvases, reads_target=False) as call:
        record = call.record(call.inputs, fields=("attn", "residual"), grads=("attn",))
        assert {block.attn.dtype for block in record.blocks} == {torch.float32}
        assert {block.grads["attn"].dtype for block in record.blocks} == {torch.float32}
        assert not torch.is_autocast_enabled("cpu")
        with caller_precision(call.scope):
            assert torch.is_autocast_enabled("cpu")
            assert model.head(torch.ones(1, model.embed_dim)).dtype == torch.bfloat16
        scored = call.logits(call.inputs)  # float32 numbers of a bfloat16 forward, in the call's caller precision
    plain = model(canvases)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(canvases).float()
    assert scored.dtype == torch.float32
    assert torch.equal(scored, autocast) and not torch.equal(scored, plain)


def test_a_sampling_method_runs_its_forwards_in_the_callers_precision(canvases):
    """RISE's map moves (a little) under autocast: its masked forwards ran in bfloat16, as the caller asked."""
    model = make_vit(img_size=112)
    reference = vitexplain.explain(model, canvases, "rise", n_masks=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = vitexplain.explain(model, canvases, "rise", n_masks=16)
    assert not torch.equal(autocast, reference)
    assert pearson(autocast, reference).min() > 0.99


def test_precision_modes_name_what_the_caller_runs():
    model = torch.nn.Linear(2, 2)
    assert precision_modes(model) == []
    with precision_mode("bfloat16", "cpu"):
        assert precision_modes(model.to(torch.float16)) == ["float16 weights", "cpu autocast bfloat16"]
        with float32_scope(model) as scope:  # inside a scope, given it: still the caller's
            assert precision_modes(model, scope) == ["float16 weights", "cpu autocast bfloat16"]
            assert precision_modes(model) == []  # what runs now: float32
    with precision_mode("tf32", "cpu"):
        assert precision_modes(model.float()) == ["tf32"]
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        with precision_mode("fp8", "cpu"):
            pass


def test_a_caveat_warns_once_naming_the_mode_and_the_figure(monkeypatch, canvases):
    spec = get_method("gae")
    monkeypatch.setitem(spec.precision_caveats, "bfloat16 weights", 0.97)
    monkeypatch.setattr(api, "_WARNED", set())
    model = make_vit(img_size=112).to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vitexplain.explain(model, canvases, "gae")
        vitexplain.explain(model, canvases, "gae")
        vitexplain.explain(model.float(), canvases, "gae")
    messages = [str(w.message) for w in caught if "gae in" in str(w.message)]
    assert messages == ["gae in bfloat16 weights: its maps were measured at r = 0.970 to the float32 model's (worst "
                        "of 64 digits test canvases); see docs/decisions/precision.md"]


FLAG_CHECK = textwrap.dedent('''
    import torch
    from vitexplain.instrumentation.precision import MatmulFlags, float32_scope, precision_mode
    b = torch.backends
    READS = [lambda: b.cuda.matmul.allow_tf32, lambda: b.cudnn.allow_tf32, torch.get_float32_matmul_precision]
    if hasattr(b, "fp32_precision"):
        READS += [lambda: b.fp32_precision, lambda: b.cuda.matmul.fp32_precision, lambda: b.cudnn.conv.fp32_precision,
                  lambda: b.cudnn.rnn.fp32_precision, lambda: b.mkldnn.matmul.fp32_precision,
                  lambda: b.mkldnn.conv.fp32_precision]
    def read():
        found = []
        for getter in READS:
            try:
                found.append(getter())
            except RuntimeError:
                found.append("refused")
        return found
    setup = SETUP
    exec(setup)
    before = read()
    with float32_scope():
        assert MatmulFlags.read().full_precision, (setup, MatmulFlags.read())
        x = torch.randn(64, 64, dtype=torch.float64)
        assert torch.allclose((x.float() @ x.float()).double(), x @ x, rtol=1e-5, atol=1e-4)
    assert read() == before, (setup, before, read())
    with precision_mode("tf32", "cpu"):
        assert not MatmulFlags.read().full_precision
    assert read() == before, (setup, before, read())
    print("ok")
''')
SETUPS = ["pass", "torch.set_float32_matmul_precision('high')", "torch.set_float32_matmul_precision('medium')",
          "b.cuda.matmul.allow_tf32 = True", "b.cudnn.allow_tf32 = False"]
if hasattr(torch.backends, "fp32_precision"):
    SETUPS += ["b.cuda.matmul.fp32_precision = 'tf32'", "b.fp32_precision = 'tf32'",
               "b.cudnn.conv.fp32_precision = 'ieee'", "b.mkldnn.matmul.fp32_precision = 'bf16'"]


def test_every_way_of_setting_tf32_comes_back_exactly():
    """Each way a user sets TF32 (legacy switches, torch >= 2.9's per-backend ones, mixtures torch refuses to
    read back through the legacy getters) is switched off inside a scope and comes back exactly, each in a fresh
    process (the switches are process-wide)."""
    done = run_python_many(*(["-c", FLAG_CHECK.replace("SETUP", repr(setup))] for setup in SETUPS), timeout=300)
    for setup, process in zip(SETUPS, done):
        assert process.returncode == 0 and process.stdout.strip() == "ok", (setup, process.stderr[-2000:])
