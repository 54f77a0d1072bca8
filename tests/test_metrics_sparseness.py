"""Sparseness: Gini index of the map as in oliviaguest/gini and the TIS code (TIS supplementary)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitexplain.metrics import get_metric
from vitexplain.metrics.sparseness import gini_sparseness
from vitexplain.options import InvalidOption


def gini_reference(values, always_shift):
    """oliviaguest/gini, written out as a loop; ``always_shift`` = the TIS code's ``shift=True``."""
    x = sorted(float(v) for v in values)
    low = x[0]
    if always_shift or low < 0:
        x = [v - low for v in x]
    x = [v + 1e-7 for v in x]
    n = len(x)
    return sum((2 * i - n - 1) * v for i, v in enumerate(x, start=1)) / (n * sum(x))


def test_hand_computed_values():
    one_hot = torch.tensor([[[0.0, 0.0], [0.0, 1.0]]])
    assert gini_sparseness(one_hot).item() == pytest.approx(3 / 4, abs=1e-6)      # (n - 1) / n
    assert gini_sparseness(torch.full((1, 3, 3), 2.5)).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("shift", ["always", "negative"])
def test_matches_reference_loop(shift):
    g = torch.Generator().manual_seed(0)
    maps = torch.cat([torch.rand(2, 4, 4, generator=g) + 0.5, torch.randn(2, 4, 4, generator=g)])
    expected = [gini_reference(m.flatten().tolist(), shift == "always") for m in maps]
    assert gini_sparseness(maps, shift=shift).tolist() == pytest.approx(expected)


def test_positive_maps_differ_between_shifts_and_negative_ones_do_not():
    positive = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    assert gini_sparseness(positive, shift="always").item() > gini_sparseness(positive, shift="negative").item()
    signed = positive - 2.5
    assert gini_sparseness(signed, shift="always").item() == gini_sparseness(signed, shift="negative").item()


def test_upsampled_to_the_image_before_the_index():
    token_map = torch.tensor([[[0.0, 1.0], [2.0, 5.0]]])
    up = F.interpolate(token_map[:, None], size=(8, 8), mode="bilinear", align_corners=False)[0, 0]
    expected = gini_reference(up.flatten().tolist(), True)
    assert gini_sparseness(token_map, (8, 8)).item() == pytest.approx(expected)
    assert gini_sparseness(token_map, (8, 8)).item() != pytest.approx(gini_sparseness(token_map).item())


def test_errors():
    with pytest.raises(ValueError, match="image 1"):
        gini_sparseness(torch.tensor([[[0.0]], [[np.nan]]]))
    with pytest.raises(InvalidOption, match=r"^option shift of metric 'sparseness' must be one of 'always', "
                                            r"'negative', got 'sometimes'$"):
        get_metric("sparseness").compute(None, shift="sometimes")
