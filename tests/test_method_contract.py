"""The contract every registered image method keeps on every registered image model family: one example of each
family, the first it declares (:func:`zoo.enrolled`, from the families' catalogue), so a new family is covered as
soon as it declares an example; methods are enrolled from the registry likewise.

Shape (patch grid or image size), finite values, a batch equal to its images one at a time,
class-specific exactly as registered (class-agnostic methods give the same map for every class on
every model; class-specific ones change with the class where the readout is a class token — with a
pooled readout, methods that keep each token's self-contribution, TokenTM above all, are dominated by
class-agnostic terms on these random models, see docs/decisions/readouts.md), the model left as it was
(also when an injected error stops the method mid-way), and for randomised methods: the same
seed gives the same map, another seed another map, and the caller's random state is untouched.
A method a family has no reading for is refused in one line with UnsupportedModelError, the model left as it was
(which methods each family refuses, and why, is the support matrix's: tests/test_support.py); where only a method's
default options are refused (hierarchical Swin: docs/decisions/families.md), the contract runs the options that
have a reading. A model whose output is an embedding is explained with its dimensions taken for classes.

Each family costs about 20 s here, so the contract enrols one example per family rather than all of them (the
support matrix runs every example), and runs the methods that read only the model's output on three of them
(:data:`OUTPUT_FAMILIES`).
"""
from __future__ import annotations

import pytest
import torch

from vitexplain import adapter_for, available_methods, explain, get_method
from vitexplain.instrumentation import UnsupportedModelError, family_of

from quick import method_options
from test_instrumentation import _assert_same, _snapshot
from zoo import enrolled, randomise

#: one example per image family
FAMILIES = {label: example for label, (family, example) in enrolled().items() if family.modality == "image"}
#: the families a method that reads only the model's output (``reads="output"``: the pixel methods, through Captum or
#: not) keeps the contract on: nothing of a family reaches such a method but its forward, so a plain class-token ViT,
#: a hierarchical model with softmax modules (Captum's DeepLIFT hooks ``nn.Softmax``) and an image-text model whose
#: output is an embedding stand for the others; the support matrix (tests/test_support.py) runs them on every example
OUTPUT_FAMILIES = ("ViT (class token)", "Swin (shifted windows, merging)", "transformers CLIP (image–text)")
#: options that have a reading where a method's defaults are refused (on hierarchical models)
FALLBACK = {"tis": {"input_space": True}, "gradtoken": {"aggregation": "rollout"}}


def contract_inputs(model: torch.nn.Module, example_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ...]:
    """Two images of the example's size, and for each the model's two highest-scoring classes."""
    x = torch.randn(2, *example_inputs.shape[1:], generator=torch.Generator().manual_seed(2))
    first, second = adapter_for(model, classes=True).logits(x).topk(2, dim=-1).indices.unbind(-1)
    return x, first, second


@pytest.fixture(scope="module")
def family(request):
    example = FAMILIES[request.param]
    torch.manual_seed(0)
    model = randomise(example.make())
    return (model, *contract_inputs(model, example.inputs()))


def _centred(maps):
    return maps - maps.mean((1, 2), keepdim=True)


def _maps_unless_refused(model, x, method, first, options) -> torch.Tensor | None:
    """``method``'s maps on ``model``, or None where it is refused: in one line, the model left as it was."""
    before = _snapshot(model)
    try:
        return explain(model, x, method, first, classes=True, **options)
    except UnsupportedModelError as refusal:
        assert str(refusal) and "\n" not in str(refusal)
        _assert_same(before, _snapshot(model))
        return None


def keeps_the_contract(method, model, x, first, second) -> None:
    """``method`` on ``model`` (images ``x``, classes ``first`` and ``second`` per image) keeps the contract, or is
    refused."""
    spec = get_method(method)
    options = method_options(method)
    before = _snapshot(model)
    maps = _maps_unless_refused(model, x, method, first, options)
    if maps is None and method in FALLBACK:
        options = {**options, **FALLBACK[method]}
        maps = _maps_unless_refused(model, x, method, first, options)
    if maps is None:
        return
    size = tuple(x.shape[-2:]) if spec.resolution == "pixel" else adapter_for(model).grid_size(x)
    assert maps.shape == (2, *size) and maps.dtype == torch.float32 and maps.isfinite().all()
    alone = torch.cat([explain(model, x[i:i + 1], method, first[i:i + 1], classes=True, **options) for i in range(2)])
    torch.testing.assert_close(maps, alone, rtol=1e-4, atol=1e-5)
    other = explain(model, x, method, second, classes=True, **options)
    if not spec.class_specific:
        torch.testing.assert_close(other, maps, rtol=1e-5, atol=1e-6)
    elif adapter_for(model).readout == "token":  # the part of the map that ranks tokens changes with the class
        change = (_centred(other) - _centred(maps)).abs().amax((1, 2)) / _centred(maps).abs().amax((1, 2))
        assert (change.nan_to_num(0) > 1e-3).any(), f"{method}: the maps of two classes are the same"
    _assert_same(before, _snapshot(model))
    if spec.randomised:
        state = torch.get_rng_state()
        again = explain(model, x, method, first, classes=True, **options)
        reseeded = explain(model, x, method, first, classes=True, **{**options, "seed": 1})
        assert torch.equal(torch.get_rng_state(), state)
        torch.testing.assert_close(again, maps)
        assert not torch.allclose(reseeded, maps) or spec.name == "constant_baseline"
    if not spec.control:  # an error half-way through the model: raised, and the model restored
        def explode(module, args, output):
            raise RuntimeError("injected")

        handle = family_of(model).block_modules()[0].register_forward_hook(explode)
        try:
            before = _snapshot(model)
            with pytest.raises(RuntimeError, match="injected"):
                explain(model, x, method, first, classes=True, **options)
            _assert_same(before, _snapshot(model))
        finally:
            handle.remove()


@pytest.mark.parametrize("family,method", [
    (label, method) for label in FAMILIES for method in available_methods("image")
    if get_method(method).reads != "output" or label in OUTPUT_FAMILIES], indirect=["family"])
def test_method_contract(family, method):
    keeps_the_contract(method, *family)
