"""Class sensitivity: each class's map on its own object rather than on the other (GradToken Fig. 8 as a number)."""
import pytest
import torch

from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics.class_sensitivity import class_sensitivity

MASK_A = torch.tensor([[[True, True], [False, False]]])
MASK_B = torch.tensor([[[False, False], [False, True]]])


def test_hand_computed_shares():
    map_a = torch.tensor([[[4.0, 2.0], [0.0, 1.0]]])        # normalised 1, .5, 0, .25: on A 1.5, on B .25
    map_b = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])        # on A 1, on B 1
    values = class_sensitivity(map_a, map_b, MASK_A, MASK_B)
    assert values["first_share"].item() == pytest.approx(1.5 / 1.75)
    assert values["second_share"].item() == pytest.approx(0.5)
    assert values["class_sensitivity"].item() == pytest.approx((1.5 / 1.75 + 0.5) / 2)


def test_class_agnostic_maps_score_one_half_and_perfect_maps_one():
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(4, 3, 3, generator=g)
    masks_a = torch.rand(4, 6, 6, generator=g) > 0.5
    masks_b = ~masks_a & (torch.rand(4, 6, 6, generator=g) > 0.3)
    same = class_sensitivity(maps, maps, masks_a, masks_b)["class_sensitivity"]
    assert torch.allclose(same, torch.full((4,), 0.5, dtype=same.dtype))
    perfect = class_sensitivity(masks_a.float(), masks_b.float(), masks_a, masks_b)["class_sensitivity"]
    assert torch.allclose(perfect, torch.ones(4, dtype=perfect.dtype))


def test_constant_map_and_invariance_to_positive_affine_changes():
    flat = class_sensitivity(torch.full((1, 2, 2), 3.0), torch.full((1, 2, 2), 3.0), MASK_A, MASK_B)
    assert flat["first_share"].item() == flat["second_share"].item() == 0.5
    map_a, map_b = torch.rand(1, 2, 2), torch.rand(1, 2, 2)
    plain = class_sensitivity(map_a, map_b, MASK_A, MASK_B)["class_sensitivity"]
    changed = class_sensitivity(3 * map_a - 7, 0.5 * map_b + 1, MASK_A, MASK_B)["class_sensitivity"]
    assert torch.allclose(plain, changed)


def test_registered_metric_explains_the_second_class():
    calls = []

    def explain(images, targets):
        calls.append(targets.clone())
        return torch.tensor([[[0.0, 0.0], [0.0, 1.0]]]).expand(len(targets), 2, 2)   # all on object B

    batch = EvalBatch(images=torch.zeros(1, 3, 2, 2), maps=torch.tensor([[[1.0, 1.0], [0.0, 0.0]]]),
                      targets=torch.tensor([3]), labels=torch.tensor([3]), explain=explain, logits=None, ids=["a"],
                      truth={"masks": MASK_A, "second": {"targets": torch.tensor([5]), "masks": MASK_B, "boxes": None}})
    metric = get_metric("class_sensitivity")
    values = metric.compute(batch, **metric.options)
    assert [c.tolist() for c in calls] == [[5]]
    assert metric.reduce(values) == {"class_sensitivity": 1.0, "first_share": 1.0, "second_share": 1.0}


def test_errors():
    with pytest.raises(ValueError, match="second object of image 0"):
        class_sensitivity(torch.rand(1, 2, 2), torch.full((1, 2, 2), float("nan")), MASK_A, MASK_B)
    with pytest.raises(ValueError, match="second_masks"):
        class_sensitivity(torch.rand(1, 2, 2), torch.rand(1, 2, 2), MASK_A, MASK_B[:, :1])
