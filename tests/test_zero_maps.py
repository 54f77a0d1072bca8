"""``explain`` says, in one line per call, when a method returns a map that is zero everywhere (issue 25, item 8)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from vitexplain import explain, register_method
from vitexplain.registry import METHODS

from conftest import make_vit


def _notices(call) -> tuple[torch.Tensor, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = call()
    return maps, [str(w.message) for w in caught if "all-zero map" in str(w.message)]


@pytest.fixture
def zero_on_odd_images():
    """A throwaway method whose maps are zero on the odd images of the batch and 1 elsewhere."""
    @register_method("zero_on_odd_images", class_specific=False, zero_map_reason="it zeroes the odd images")
    def zero_on_odd_images(adapter, images, target=None):
        """Zero on odd images."""
        height, width = adapter.grid_size(images)
        keep = (torch.arange(images.shape[0]) % 2 == 0).float()
        return keep[:, None, None].expand(-1, height, width).clone()

    yield
    METHODS.remove("zero_on_odd_images")


def test_one_notice_per_call_counts_the_images_and_gives_the_methods_reason(zero_on_odd_images):
    model = make_vit()
    maps, notices = _notices(lambda: explain(model, torch.randn(5, 3, 32, 32), "zero_on_odd_images"))
    assert notices == ["zero_on_odd_images returned an all-zero map for 2 of 5 images: it zeroes the odd images"]
    assert (maps.flatten(1) == 0).all(1).tolist() == [False, True, False, True, False]
    _, notices = _notices(lambda: explain(model, torch.randn(1, 3, 32, 32), "zero_on_odd_images"))
    assert notices == []


def test_attn_gradcam_on_a_one_head_model_warns_exactly_for_its_zero_maps():
    """With one head attention Grad-CAM is ReLU(w · A[cls, patches]) with A > 0, so a map is zero exactly where the
    weight w is negative; turning the target's head row round turns w round (the attention does not change), so
    each image's map is zero with one of the two heads and positive with the other."""
    model = make_vit(num_heads=1)
    turned = copy.deepcopy(model)
    with torch.no_grad():
        turned.head.weight[3].neg_()
        turned.head.bias[3].neg_()
    images = torch.randn(6, 3, 32, 32)
    zero_counts = []
    for which in (model, turned):
        maps, notices = _notices(lambda: explain(which, images, "attn_gradcam", target=3))
        zero = (maps.flatten(1) == 0).all(1)
        assert ((maps.flatten(1) > 0).all(1) | zero).all()
        zero_counts.append(int(zero.sum()))
        expected = ([f"attn_gradcam returned an all-zero map for {zero_counts[-1]} of 6 images: its ReLU (as in the "
                     "reference code) removed every token's relevance: the gradient-weighted attention, averaged over "
                     "the heads, was negative on every patch"] if zero_counts[-1] else [])
        assert notices == expected
    assert sum(zero_counts) == 6 and min(zero_counts) > 0


def test_the_bench_mutes_the_notice_and_keeps_the_maps(zero_on_odd_images, tmp_path):
    """It would repeat for every batch and perturbed call; the bench's gallery and report show the maps."""
    from vitexplain.bench import BenchConfig, run_benchmark

    from test_bench_fakes import RandomImages

    config = BenchConfig(models={"tiny": make_vit()}, methods=["zero_on_odd_images"], metrics=["sparseness"],
                         dataset=RandomImages(4), batch_size=4, output_dir=tmp_path, progress=False, device="cpu",
                         gallery=0)
    result, notices = _notices(lambda: run_benchmark(config))
    assert notices == [] and not result.errors and "zero_on_odd_images" in result.scores["tiny"]
    _, notices = _notices(lambda: explain(make_vit(), torch.randn(2, 3, 32, 32), "zero_on_odd_images"))
    assert len(notices) == 1                                     # the filter ends with the run
