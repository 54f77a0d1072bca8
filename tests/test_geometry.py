"""The one token geometry: its maps and readout rows against plain indexing, and recordings and LRP
relevance of the same batch holding the same geometry."""
from __future__ import annotations

import pytest
import torch

from vitexplain.instrumentation import Readout, TokenGeometry, adapter_for, lrp

from zoo import build, images


def test_patch_map_drops_the_prefix_and_reads_row_major():
    geometry = TokenGeometry((2, 3), 2, 0, Readout("token", torch.zeros(1, 8)))
    values = torch.arange(16.0).reshape(2, 8)
    expected = torch.tensor([[[2.0, 3, 4], [5, 6, 7]], [[10, 11, 12], [13, 14, 15]]])
    assert torch.equal(geometry.patch_map(values), expected)
    assert torch.equal(geometry.patch_grid(values[:, 2:]), expected)


def test_a_later_stage_is_shared_among_the_merged_tokens():
    geometry = TokenGeometry((4, 4), 0, None, Readout("avg", torch.full((1, 4), 0.25)), stages=((4, 4), (2, 2)))
    got = geometry.patch_map(torch.tensor([[1.0, 2, 3, 4]]))
    expected = torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 1, 1], [0.75, 0.75, 1, 1]])
    assert torch.equal(got[0], expected)
    assert geometry.grid_of(4) == (2, 2) and geometry.grid_of(16) == (4, 4)


def test_text_maps_are_zero_at_the_prefix_and_padding():
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    geometry = TokenGeometry((4,), 1, 0, Readout("token", torch.zeros(2, 4)), token_mask=mask)
    got = geometry.patch_map(torch.ones(2, 4) * 5)
    assert torch.equal(got, torch.tensor([[0.0, 5, 5, 0], [0, 5, 5, 5]]))


def test_readout_rows_are_the_class_row_or_the_mean_of_the_patch_rows():
    matrix = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))  # [B, H, N, N], one prefix token
    token = TokenGeometry((1, 5), 1, 0, Readout("token", torch.eye(6)[:1].expand(2, 6)))
    assert torch.equal(token.readout_rows(matrix), matrix[:, :, 0])
    torch.testing.assert_close(token.readout_row(matrix[:, 0]), matrix[:, 0, 0, 1:].reshape(2, 1, 5))
    weights = torch.tensor([0.0, 0.2, 0.2, 0.2, 0.2, 0.2]).expand(2, 6)
    pooled = TokenGeometry((1, 5), 1, None, Readout("avg", weights))
    torch.testing.assert_close(pooled.readout_rows(matrix), matrix[:, :, 1:].mean(2))
    torch.testing.assert_close(pooled.readout_row(matrix[:, 1]), matrix[:, 1, 1:, 1:].mean(1).reshape(2, 1, 5))


@pytest.mark.parametrize("name", ["vit_reg_avg", "swin"])
def test_recording_and_relevance_hold_the_same_geometry(name):
    model, x = build(name), images(2, seed=3)
    adapter = adapter_for(model)
    recorded = adapter.record(x, fields=("attn",)).geometry
    found = lrp.relevance(adapter, x, rules="chefer", at=("attn",), blocks=(-1,)).geometry
    assert (found.grid, found.num_prefix_tokens, found.class_token_index, found.stages) == (
        recorded.grid, recorded.num_prefix_tokens, recorded.class_token_index, recorded.stages)
    assert found.readout.kind == recorded.readout.kind
    torch.testing.assert_close(found.readout.weights, recorded.readout.weights)
    assert [None if layout is None else (layout.grid, layout.shift) for layout in found.layouts] == [
        None if layout is None else (layout.grid, layout.shift) for layout in recorded.layouts]
    assert len(recorded.layouts) == len(found.layouts) == adapter.num_blocks
    windowed = name == "swin"  # every block windowed, over more than one stage; else none
    assert all((layout is not None) == windowed for layout in recorded.layouts)
    assert (len(recorded.stages) > 1) == windowed
