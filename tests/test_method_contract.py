"""The contract every registered image method keeps, on every family description and readout.

Shape (patch grid or image size), finite values, a batch equal to its images one at a time,
class-specific exactly as registered (class-agnostic methods give the same map for every class on
every model; class-specific ones change with the class where the readout is a class token — with a
pooled readout, methods that keep each token's self-contribution, TokenTM above all, are dominated by
class-agnostic terms on these random models, see docs/decisions/readouts.md), the model left as it was
(also when an injected error stops the method mid-way), and for randomised methods: the same
seed gives the same map, another seed another map, and the caller's random state is untouched.
Methods a family has no reading for are refused with UnsupportedModelError (hierarchical Swin:
docs/decisions/families.md); where only their default options are refused, the contract runs the options
that have one.
"""
from __future__ import annotations

import pytest
import torch

from vitexplain import available_methods, explain, get_method
from vitexplain.instrumentation import UnsupportedModelError

from test_instrumentation import _assert_same, _snapshot
from zoo import SIZE, ZOO, build, images

#: one model per family description and per readout kind
FAMILIES = ["vit", "vit_map", "vit_reg_avg", "eva02", "vit_rope_mixed", "beit_shared", "srelpos", "naflexvit", "swin",
            "swinv2", "swinv2_cr"]
#: small settings of the sampling methods, to keep the suite fast
QUICK = {"tis": {"n_masks": 8}, "rise": {"n_masks": 12, "batch_size": 16}, "integrated_gradients": {"n_steps": 4},
         "smoothgrad": {"n_samples": 3}, "tam": {"n_steps": 3}, "bt_token": {"n_steps": 3}, "bt_head": {"n_steps": 3}}
#: options that have a reading on a hierarchical model, where the defaults are refused
HIERARCHICAL = {"tis": {"input_space": True}, "gradtoken": {"aggregation": "rollout"}}
#: (model, method) refused whatever the options: TokenTM and BT-T need per-head outputs, which a
#: res-post-norm block (Swin V2, SwinV2-CR) has not; CLIP Surgery's v-v path attends over the whole sequence,
#: which windowed attention (every Swin) has not
REFUSED = ({(name, method) for name in ("swinv2", "swinv2_cr") for method in ("tokentm", "bt_token")}
           | {(name, "clip_surgery") for name in ("swin", "swinv2", "swinv2_cr")})


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model, x = build(request.param), images(3, seed=2)
    with torch.no_grad():
        first, second = model(x).topk(2, dim=-1).indices.unbind(-1)  # classes with a real share of the output
    return request.param, model, x, first, second


def _centred(maps):
    return maps - maps.mean((1, 2), keepdim=True)


@pytest.mark.parametrize("method", available_methods("image"))
def test_method_contract(family, method):
    name, model, x, first, second = family
    spec = get_method(method)
    options = {**QUICK.get(method, {}), **(HIERARCHICAL.get(method, {}) if name.startswith("swin") else {})}
    before = _snapshot(model)
    if (name, method) in REFUSED:
        with pytest.raises(UnsupportedModelError, match=r"\w+ \w+"):
            explain(model, x, method, first, **options)
        _assert_same(before, _snapshot(model))
        return
    maps = explain(model, x, method, first, **options)
    size = (SIZE["img_size"],) * 2 if spec.resolution == "pixel" else (4, 4)
    assert maps.shape == (3, *size) and maps.dtype == torch.float32 and maps.isfinite().all()
    alone = torch.cat([explain(model, x[i:i + 1], method, first[i:i + 1], **options) for i in range(3)])
    torch.testing.assert_close(maps, alone, rtol=1e-4, atol=1e-5)
    other = explain(model, x, method, second, **options)
    if not spec.class_specific:
        torch.testing.assert_close(other, maps, rtol=1e-5, atol=1e-6)
    elif ZOO[name][2] == "token":  # the part of the map that ranks tokens changes with the class
        change = (_centred(other) - _centred(maps)).abs().amax((1, 2)) / _centred(maps).abs().amax((1, 2))
        assert (change.nan_to_num(0) > 1e-3).any(), f"{method} on {name}: the maps of two classes are the same"
    _assert_same(before, _snapshot(model))
    if spec.randomised:
        state = torch.get_rng_state()
        again = explain(model, x, method, first, **options)
        reseeded = explain(model, x, method, first, **{**options, "seed": 1})
        assert torch.equal(torch.get_rng_state(), state)
        torch.testing.assert_close(again, maps)
        assert not torch.allclose(reseeded, maps) or spec.name == "constant_baseline"
    if not spec.control:  # an error half-way through the model: raised, and the model restored
        def explode(module, args, output):
            raise RuntimeError("injected")

        handle = next(module for module_name, module in model.named_modules()
                      if module_name.endswith("mlp.fc2")).register_forward_hook(explode)
        try:
            before = _snapshot(model)
            with pytest.raises(RuntimeError, match="injected"):
                explain(model, x, method, first, **options)
            _assert_same(before, _snapshot(model))
        finally:
            handle.remove()
