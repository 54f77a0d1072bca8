"""``record(reduce=)``: each block's attention handed to a reducer as the backward passes it, and nothing more kept.

The reducer sees what a plain recording keeps (the attention, its gradients, the block's other fields,
the readout), on every family, windowed blocks and a detached attention input included; the forward
keeps no N×N matrix for the backward, and each block's attention and gradients are gone before the next
block's reduction runs.
"""
from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from vitexplain.instrumentation import adapter_for

from conftest import make_vit
from zoo import ZOO, build, images

ATTENTION = ("attn_logits", "attn")


def _handed(record, block):
    """Everything a reducer can read of a block, copied out of the view it is given."""
    return {"fields": {name: getattr(block, name) for name in ("attn_logits", "attn", "v", "residual")},
            "grads": dict(block.grads), "readout_rows": record.geometry.readout_rows(block.mixing(block.attn.mean(1)))}


def _assert_close(found, expected):
    """Equal up to float rounding (the reduced recording's forward runs the fused attention)."""
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())


def _assert_handed_as_kept(plain, reduced):
    assert reduced.geometry.readout.kind == plain.geometry.readout.kind
    for kept, block in zip(plain.blocks, reduced.blocks):
        handed = block.reduced
        for name, value in handed["fields"].items():
            _assert_close(value, getattr(kept, name))
        assert handed["grads"].keys() == kept.grads.keys() - {"q"}
        for name, gradient in handed["grads"].items():
            _assert_close(gradient, kept.grads[name])
            assert gradient.abs().sum() > 0
        _assert_close(handed["readout_rows"], plain.geometry.readout_rows(kept.mixing(kept.attn.mean(1))))
        assert block.attn is block.attn_logits is None and set(block.grads) <= {"q"}  # the attention is not kept


@pytest.mark.parametrize("name", list(ZOO))
def test_reducers_see_what_a_plain_recording_keeps_in_every_family(name):
    model, batch = build(name), images(2)
    adapter = adapter_for(model)
    asked = dict(fields=ATTENTION + ("v", "residual"), grads=ATTENTION)
    _assert_handed_as_kept(adapter.record(batch, **asked), adapter.record(batch, **asked, reduce=_handed))


@pytest.mark.parametrize("name", ["vit", "swin"])
@pytest.mark.parametrize("grads", [("attn",), ("attn_logits", "q")])
def test_a_detached_attention_input_still_hands_every_attention_over(name, grads):
    """AG-CAM's recording: nothing below an attention needs a gradient, the anchor carries the backward there
    (with q's gradient asked, the detached input takes one again)."""
    model, batch = build(name), images(2)
    adapter = adapter_for(model)
    asked = dict(fields=ATTENTION + ("v", "residual"), grads=grads, stop_gradient=("attn_input",))
    plain, reduced = adapter.record(batch, **asked), adapter.record(batch, **asked, reduce=_handed)
    _assert_handed_as_kept(plain, reduced)
    for kept, block in zip(plain.blocks, reduced.blocks):
        assert block.grads.keys() == kept.grads.keys() - set(ATTENTION)
        if "q" in grads:
            _assert_close(block.grads["q"], kept.grads["q"])


def test_only_the_blocks_asking_for_the_attention_reduce_it_and_the_rest_is_kept():
    adapter, batch = adapter_for(make_vit(depth=3)), images(2)
    record = adapter.record(batch, fields={"attn": (1,), "mlp_branch": None}, grads={"residual": (0, 2)},
                            reduce=lambda record, block: block.attn.sum())
    assert [block.reduced is not None for block in record.blocks] == [False, True, False]
    plain = adapter.record(batch, fields={"attn": (1,), "mlp_branch": None}, grads={"residual": (0, 2)})
    _assert_close(record.blocks[1].reduced, plain.blocks[1].attn.sum())
    for kept, block in zip(plain.blocks, record.blocks):
        _assert_close(block.mlp_branch, kept.mlp_branch)
        assert block.grads.keys() == kept.grads.keys()
        for name, gradient in block.grads.items():
            _assert_close(gradient, kept.grads[name])


def _saved_in_the_forward(adapter, batch, **asked):
    """Shapes of the tensors autograd saves while the forward runs (a score function marks its end)."""
    saved, forward = [], [True]

    def score(logits, classes):
        forward[0] = False
        return logits.gather(1, classes[:, None])[:, 0]

    def pack(tensor):
        if forward[0]:
            saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        adapter.record(batch, grads=("attn",), score=score, **asked)
    return saved


def test_the_forward_keeps_no_attention_matrix_and_each_block_is_freed_before_the_next():
    model, batch = make_vit(depth=4), images(2)
    adapter, tokens = adapter_for(model), 17
    square = lambda shapes: [shape for shape in shapes if shape[-2:] == (tokens, tokens)]  # noqa: E731
    assert len(square(_saved_in_the_forward(adapter, batch, fields=("attn",)))) >= 4  # what the check would catch
    assert square(_saved_in_the_forward(adapter, batch, fields=("attn",), reduce=lambda record, block: None)) == []

    handed = []  # weak references to the storages of every block's attention and gradient handed over so far

    def reduce(record, block):
        assert all(reference.expired() for reference in handed), "an earlier block's attention is still held"
        handed.extend(StorageWeakRef(t.untyped_storage()) for t in (block.attn, block.grads["attn"]))
        return block.attn.shape

    record = adapter.record(batch, fields=("attn",), grads=("attn",), reduce=reduce)
    assert len(handed) == 8 and all(block.reduced == (2, 3, tokens, tokens) for block in record.blocks)


@pytest.mark.parametrize("name", ["vit", "vit_map", "swin"])
def test_the_readout_row_folded_last_block_first_is_the_readout_row_of_the_product(name):
    """GAE's fold (``ReadoutFold``) against ``readout_map`` of every block's factor kept, on a class token, an
    attention-pooling readout and a hierarchical model (patch merges between the stages)."""
    from vitexplain.methods._products import ReadoutFold, readout_map

    adapter = adapter_for(build(name))
    record = adapter.record(images(2), fields=("attn",), grads=("attn",),
                            reduce=lambda record, block: block.mixing((block.grads["attn"] * block.attn).mean(1)))
    layers = [block.reduced for block in record.blocks]
    fold = ReadoutFold(range(len(layers)))
    with pytest.raises(RuntimeError, match="folded down to block"):
        fold.map(record.geometry)
    for index in reversed(range(len(layers))):
        fold(record.geometry, index, layers[index])
    torch.testing.assert_close(fold.map(record.geometry), readout_map(record.geometry, layers), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=f"block 0 came when block {len(layers) - 1} was due"):
        ReadoutFold(range(len(layers)))(record.geometry, 0, layers[0])


@pytest.mark.parametrize("name", ["vit", "swin"])
def test_lrp_relevance_reduces_each_blocks_attention_as_the_backward_passes_it(name):
    """``relevance(reduce=)`` (transformer attribution): each block's attention relevance and plain gradient are
    handed over last block first, are those ``relevance`` keeps without a reduction, and are freed before the next
    block's are handed over."""
    from vitexplain.instrumentation import lrp

    adapter, batch = adapter_for(build(name).double()), images(2).double()
    kept = lrp.relevance(adapter, batch, None, "chefer", at=("attn",), gradients=True)
    order, handed = [], []

    def reduce(geometry, block, attn_relevance, attn_gradient):
        assert all(reference.expired() for reference in handed), "an earlier block's attention is still held"
        handed.extend(StorageWeakRef(t.untyped_storage()) for t in (attn_relevance, attn_gradient))
        order.append(block)
        torch.testing.assert_close(attn_relevance, kept.attn[block], rtol=0, atol=0)
        torch.testing.assert_close(attn_gradient, kept.attn_grads[block], rtol=0, atol=0)
        return block

    reduced = lrp.relevance(adapter, batch, None, "chefer", at=("attn",), gradients=True, reduce=reduce)
    blocks = adapter.num_blocks
    assert order == list(reversed(range(blocks))) and reduced.reduced == list(range(blocks))
    assert reduced.attn == [None] * blocks and reduced.attn_grads is None
    assert kept.attn[0].abs().sum() > 0 and kept.attn_grads[0].abs().sum() > 0


@pytest.mark.parametrize("name", ["vit", "swin"])
def test_the_plain_gradient_is_taken_without_the_rules(name, monkeypatch):
    """With ``gradients=True`` the plain backward reads the blocks' plain graphs: no rule's surrogate (|W| |x|
    products, gradient tricks) and none of the rules' products or adds is formed while the phase is plain, and
    the forward and relevance's backward form exactly those of a relevance alone."""
    from vitexplain.instrumentation import lrp
    from vitexplain.instrumentation.lrp.rules import core, modules

    formed = {True: 0, False: 0}

    def counted(original):
        def count(*args, **kwargs):
            phase = core._PHASE.get()
            formed[phase is not None and phase.plain] += 1
            return original(*args, **kwargs)
        return count

    for owner, attribute in ((modules, "_magnitudes"), (core, "_rule_gradient"), (modules, "_rule_gradient"),
                             (core._Product, "apply"), (core._NormalisedAdd, "apply")):
        monkeypatch.setattr(owner, attribute, counted(getattr(owner, attribute)))
    adapter, batch = adapter_for(build(name).double()), images(2).double()
    lrp.relevance(adapter, batch, None, "chefer", at=("attn",))
    alone = formed[False]
    formed[False] = 0
    lrp.relevance(adapter, batch, None, "chefer", at=("attn",), gradients=True)
    assert alone > 0 and formed == {True: 0, False: alone}


def test_a_recomputed_blocks_forward_forms_no_surrogate_and_its_backward_one_per_linear(monkeypatch):
    """The forward of a block computed again in the backward keeps only its output, so it runs plainly: no block's
    Linear forms its |W| |x| there (the head's, whose graph is kept, does); the backward forms each once."""
    from vitexplain.instrumentation import lrp
    from vitexplain.instrumentation.lrp.rules import modules

    model = build("vit").double()
    adapter, formed = adapter_for(model), []
    in_blocks = {id(module) for module in model.blocks.modules() if isinstance(module, torch.nn.Linear)}
    original = modules._magnitudes

    def magnitudes(module, *args, **kwargs):
        formed.append(id(module) in in_blocks)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(modules, "_magnitudes", magnitudes)
    with lrp.lrp_rules(adapter, "chefer"):
        logits = adapter.forward(images(2).double())
        assert formed and not any(formed)
        formed.clear()
        torch.autograd.grad(logits[:, 3].sum(), [adapter.model.pos_embed], allow_unused=True)
    assert len(formed) == sum(formed) == len(in_blocks)


@pytest.mark.parametrize("gradients", [False, True])
def test_each_block_is_computed_once_in_the_forward_and_once_for_the_relevance(gradients, monkeypatch):
    """The plain backward of ``gradients=True`` runs through the plain graph the forward kept, so each block is
    computed twice (the forward, the relevance's backward), with or without the plain gradient."""
    from vitexplain.instrumentation import blocks, lrp

    counted = []
    original = blocks.block_forward

    def block_forward(parts, x, *args, **kwargs):
        counted.append(kwargs["index"])
        return original(parts, x, *args, **kwargs)

    monkeypatch.setattr(blocks, "block_forward", block_forward)
    adapter = adapter_for(make_vit(depth=3).double())
    lrp.relevance(adapter, images(2).double(), None, "chefer", at=("attn",), gradients=gradients)
    assert sorted(counted) == [0, 0, 1, 1, 2, 2]


def test_the_plain_backward_frees_the_graph_the_forward_kept_for_it(monkeypatch):
    """The forward keeps each block's plain graph for the plain backward, its attention fused (no N×N matrix
    saved), and the plain backward frees it as it passes: none of those graphs is alive when the relevance's
    backward starts."""
    from vitexplain.instrumentation import blocks, lrp
    from vitexplain.instrumentation.lrp import propagation

    tokens, square, mixed, alive = 17, [], [], []
    original_computed, original_plain = blocks._computed, propagation._plain_gradients

    def computed(ctx, x, plain=False, fused=False):
        found = original_computed(ctx, x, plain, fused)
        if fused:  # the forward's graph kept for the plain backward: its attention's output A·v
            mixed.append(StorageWeakRef(found[2]["mixed"].untyped_storage()))
        return found

    def plain_gradients(*args):
        forward = (len(square), sum(not reference.expired() for reference in mixed))
        original_plain(*args)
        alive.append((*forward, sum(not reference.expired() for reference in mixed)))

    def pack(tensor):
        if tensor.shape[-2:] == (tokens, tokens):
            square.append(tensor.shape)
        return tensor.detach()  # the tensor itself would tie an output to its own node, never freed

    monkeypatch.setattr(blocks, "_computed", computed)
    monkeypatch.setattr(propagation, "_plain_gradients", plain_gradients)
    adapter = adapter_for(make_vit(depth=4))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        lrp.relevance(adapter, images(2), None, "chefer", at=("attn",), gradients=True,
                      reduce=lambda *args: None)
    assert alive == [(0, 4, 0)]  # no N×N matrix saved by the forward; four graphs kept for the plain backward, freed
    assert square  # the relevance's backward does save them (what the check would catch)


@pytest.mark.parametrize("name", ["vit", "vit_map", "swin"])
def test_the_attention_read_from_the_kept_graph_is_the_recomputed_one(name):
    """``recompute=False``: the attention's relevance and plain gradient read from the probabilities the forward
    kept equal those read as the backward computes each block again, and so do transformer attribution's maps."""
    from vitexplain import explain
    from vitexplain.instrumentation import lrp

    model, batch = build(name).double(), images(2).double()
    adapter = adapter_for(model)
    again = lrp.relevance(adapter, batch, None, "chefer", at=("attn",), gradients=True)
    kept = lrp.relevance(adapter, batch, None, "chefer", at=("attn",), gradients=True, recompute=False)
    for found, expected in [*zip(kept.attn, again.attn), *zip(kept.attn_grads, again.attn_grads)]:
        torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12 * expected.abs().max().item())
        assert expected.abs().sum() > 0
    maps = explain(model, batch, "transformer_attribution", recompute=False)
    torch.testing.assert_close(maps, explain(model, batch, "transformer_attribution"), rtol=1e-10, atol=1e-14)
    alone = [lrp.relevance(adapter, batch, None, "lrp", at=("attn",), blocks=(-1,), recompute=recompute).attn[-1]
             for recompute in (False, True)]  # the relevance alone (partial LRP's), no plain gradient
    torch.testing.assert_close(*alone, rtol=1e-10, atol=1e-12 * alone[1].abs().max().item())


def test_a_plain_backward_through_the_rules_graph_takes_no_product_for_the_surrogates():
    """Within ``both_gradients`` the plain phase's gradient reaches a rule's value alone: the |W| |x| surrogate of an
    αβ Linear gets none, and no matrix product is spent on it (one product: the input's gradient through W)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from vitexplain.instrumentation.lrp import rules as r

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func._overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm)
            return func(*args, **(kwargs or {}))

    linear, x = torch.nn.Linear(6, 5), torch.randn(3, 6, requires_grad=True)
    with r.both_gradients() as phase:
        out = r.AlphaBeta._forward(linear, x)
        phase.plain = True
        with Products() as plain:
            gradient, = torch.autograd.grad(out.sum(), x, retain_graph=True)
        phase.plain = False
        with Products() as rules:
            torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(gradient, torch.ones(3, 5) @ linear.weight)
    assert plain.count == 1 and rules.count == 2
