"""Pointing game with the TIS exclusion of images whose boxes cover half of the image (TIS Table 3), on boxes or
masks, with Zhang et al.'s tolerance; the bench refuses it once, before any work, where no image has either."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitexplain
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.runner import _provided
from vitexplain.datasets import get_dataset
from vitexplain.metrics import get_metric
from vitexplain.metrics.base import Metric, describe_need
from vitexplain.metrics.pointing_game import pointing_game, reduce_pointing_game
from vitexplain.models import data_config

from conftest import make_vit
from test_bench_fakes import RandomImages


def peak_at(row, col, size=4):
    m = torch.zeros(size, size)
    m[row, col] = 1.0
    return m


def test_hand_computed_hits_misses_and_exclusions():
    maps = torch.stack([peak_at(1, 1), peak_at(2, 2), peak_at(0, 3), peak_at(3, 0), peak_at(2, 2), peak_at(0, 0)])
    boxes = [
        torch.tensor([[0.9, 0.9, 2.7, 2.2]]),                          # truncated to rows 0-1, cols 0-1: hit
        torch.tensor([[0.9, 0.9, 2.7, 2.2]]),                          # peak (2, 2) is outside: miss
        torch.tensor([[0.0, 0.0, 4.0, 2.0]]),                          # covers 8 / 16 = 50 %: excluded
        torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]]),    # union 7 / 16, peak (3, 0) outside: miss
        torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]]),    # peak (2, 2) in the second box: hit
        torch.zeros(0, 4),                                             # no box: kept, miss
    ]
    values = pointing_game(maps, boxes, (4, 4))
    assert values["hit"].tolist() == [1, 0, 1, 0, 1, 0]
    assert values["excluded"].tolist() == [0, 0, 1, 0, 0, 0]
    assert reduce_pointing_game(values) == {"accuracy": pytest.approx(2 / 5), "included": 5, "excluded": 1}


def test_ties_point_at_the_first_maximum_and_map_is_upsampled():
    box = [torch.tensor([[0.0, 0.0, 1.0, 1.0]])]                      # only pixel (0, 0)
    assert pointing_game(torch.ones(1, 4, 4), box, (4, 4))["hit"].tolist() == [1]
    token_map = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]])               # top-right token of a 2 x 2 grid
    right = [torch.tensor([[4.0, 0.0, 8.0, 4.0]])]
    assert pointing_game(token_map, right, (8, 8))["hit"].tolist() == [1]


def test_matches_reference_loop():
    g = torch.Generator().manual_seed(2)
    maps = torch.rand(8, 3, 3, generator=g)
    boxes = []
    for _ in range(8):
        k = int(torch.randint(1, 3, (1,), generator=g))
        corner = torch.rand(k, 2, generator=g) * 8 - 1                # some start left of / above the image
        boxes.append(torch.cat([corner, corner + torch.rand(k, 2, generator=g) * 8 + 1], 1))
    values = pointing_game(maps, boxes, (12, 12), max_coverage=0.3)
    for i in range(8):                                                 # the TIS code's painting, per image
        painted = torch.zeros(12, 12)
        for x0, y0, x1, y1 in boxes[i].tolist():
            painted[int(y0):int(y1), int(x0):int(x1)] = 1
        up = F.interpolate(maps[i][None, None], size=(12, 12), mode="bilinear", align_corners=False)[0, 0]
        assert values["excluded"][i].item() == float(painted.mean() >= 0.3)
        assert values["hit"][i].item() == painted.flatten()[up.flatten().argmax()].item()
    kept = values["excluded"] == 0
    assert 0 < values["hit"][kept].sum() < kept.sum() < 8              # the case mixes hits, misses, exclusions


def test_errors():
    with pytest.raises(ValueError, match="image 1"):
        pointing_game(torch.tensor([[[0.0]], [[float("nan")]]]), [torch.zeros(0, 4)] * 2, (4, 4))
    with pytest.raises(ValueError, match="3 maps for 2 images"):
        pointing_game(torch.rand(3, 2, 2), [torch.zeros(0, 4)] * 2, (4, 4))


# ----------------------------------------------------------------------------- masks, tolerance, the bench


def plain_hit(saliency, region, tolerance):
    """The pointing game of one image written out: the first maximum of the bilinearly upsampled map, a hit when
    a region pixel lies on it or at distance < tolerance (Zhang et al.; TorchRay's disc)."""
    height, width = region.shape
    up = F.interpolate(saliency[None, None], size=(height, width), mode="bilinear", align_corners=False)[0, 0]
    peak = int(up.flatten().argmax())
    row, col = divmod(peak, width)
    for i in range(height):
        for j in range(width):
            if region[i, j] and ((i, j) == (row, col) or (i - row) ** 2 + (j - col) ** 2 < tolerance ** 2):
                return 1.0
    return 0.0


def test_masks_alone_hit_miss_and_tolerance_by_hand():
    mask = torch.zeros(1, 8, 8, dtype=torch.bool)
    mask[0, 5, 4] = True                                               # one foreground pixel
    peak = torch.zeros(1, 8, 8)
    peak[0, 5, 2] = 1.0                                                # two pixels left of it
    assert pointing_game(peak, masks=mask)["hit"].tolist() == [0]
    assert pointing_game(peak, masks=mask, tolerance=2)["hit"].tolist() == [0]    # distance 2 is not < 2
    assert pointing_game(peak, masks=mask, tolerance=2.01)["hit"].tolist() == [1]
    on = torch.zeros(1, 8, 8)
    on[0, 5, 4] = 1.0
    assert pointing_game(on, masks=mask, tolerance=0.5)["hit"].tolist() == [1]    # on the mask: a hit at any tolerance
    box = [torch.tensor([[4.0, 5.0, 5.0, 6.0]])]                       # the same pixel as a box: the same answers
    assert [pointing_game(peak, box, (8, 8), tolerance=t)["hit"].item() for t in (0, 2, 2.01)] == [0, 0, 1]
    half = torch.zeros(1, 8, 8, dtype=torch.bool)
    half[0, :4] = True                                                 # 50 % of the image: excluded, as a box would be
    assert pointing_game(on, masks=half)["excluded"].tolist() == [1]
    assert pointing_game(on, masks=torch.zeros(1, 8, 8, dtype=torch.bool))["excluded"].tolist() == [0]  # empty: kept


def test_masks_and_boxes_match_the_plain_computation_with_and_without_tolerance():
    g = torch.Generator().manual_seed(5)
    maps = torch.rand(10, 3, 3, generator=g)
    masks = torch.rand(10, 12, 12, generator=g) > 0.85                 # scattered foreground pixels
    boxes = []
    for _ in range(10):
        corner = torch.rand(1, 2, generator=g) * 9
        boxes.append(torch.cat([corner, corner + 1 + torch.rand(1, 2, generator=g) * 3], 1))
    hits = {}
    for tolerance in (0.0, 1.5, 3.0):
        on_masks = pointing_game(maps, masks=masks, tolerance=tolerance)
        on_boxes = pointing_game(maps, boxes, (12, 12), tolerance=tolerance)
        for i in range(10):
            painted = torch.zeros(12, 12, dtype=torch.bool)
            for x0, y0, x1, y1 in boxes[i].tolist():
                painted[int(y0):int(y1), int(x0):int(x1)] = True
            assert on_masks["hit"][i].item() == plain_hit(maps[i], masks[i], tolerance)
            assert on_boxes["hit"][i].item() == plain_hit(maps[i], painted, tolerance)
            assert on_masks["excluded"][i].item() == float(masks[i].float().mean() >= 0.5)
        hits[tolerance] = on_masks["hit"].sum().item() + on_boxes["hit"].sum().item()
    assert hits[0.0] < hits[1.5] < hits[3.0]                           # the tolerance really widened the regions


def test_evaluate_runs_on_masks_and_prefers_boxes_when_both():
    model = make_vit(depth=1)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    maps = torch.zeros(4, 4, 4)
    maps[:, 0, 0] = 1.0                                                # every map points at the top-left corner
    masks = torch.zeros(4, 32, 32, dtype=torch.bool)
    masks[:2, :8, :8] = True                                           # images 0, 1: the object is there
    masks[2:, 20:, 20:] = True
    boxes = [torch.tensor([[20.0, 20.0, 32.0, 32.0]])] * 2 + [torch.tensor([[0.0, 0.0, 8.0, 8.0]])] * 2
    on_masks = vitexplain.evaluate(model, images, maps, "pointing_game", truth={"masks": masks})
    assert on_masks.values["hit"].tolist() == [1, 1, 0, 0] and on_masks.numbers["accuracy"] == 0.5
    both = vitexplain.evaluate(model, images, maps, "pointing_game", truth={"masks": masks, "boxes": boxes})
    assert both.values["hit"].tolist() == [0, 0, 1, 1]                 # the boxes, not the masks
    with pytest.raises(ValueError, match="metric 'pointing_game' needs boxes or masks, which these images do not"):
        vitexplain.evaluate(model, images, maps, "pointing_game")
    with pytest.raises(ValueError, match=r"masks must be \[B, H, W\] at the image's size \(32, 32\), got \(4, 16"):
        pointing_game(maps, None, (32, 32), masks=masks[:, :16, :16])


def test_requires_boxes_or_masks_and_says_so():
    metric = get_metric("pointing_game")
    assert metric.requires == (("boxes", "masks"),)
    assert describe_need(metric.requires[0]) == "boxes or masks"
    with pytest.raises(ValueError, match="requires must list names, or tuples of names"):
        Metric("bad", lambda batch: {}, lambda values: {}, requires=(("boxes", 3),))
    with pytest.raises(ValueError, match="either boxes or masks"):
        pointing_game(torch.rand(1, 2, 2), [torch.zeros(0, 4)], (4, 4), masks=torch.zeros(1, 4, 4, dtype=torch.bool))


def _images(root, corners):
    """32 x 32 PNG images, each a bright square (``corners``) on grey."""
    (root / "images").mkdir(parents=True)
    for number, (x0, y0, x1, y1) in enumerate(corners):
        pixels = np.full((32, 32, 3), 90, np.uint8)
        pixels[y0:y1, x0:x1] = 250
        Image.fromarray(pixels).save(root / "images" / f"im{number}.png")


def test_a_folder_with_masks_and_no_boxes_runs_the_pointing_game_in_the_bench(tmp_path):
    model = make_vit(depth=2)
    model.pretrained_cfg = {"crop_pct": 1.0}                          # preprocessing keeps the 32 x 32 pixels in place
    _images(tmp_path, [(2, 2, 12, 12), (16, 4, 30, 20), (0, 0, 32, 20), (10, 18, 26, 30)])
    plain = get_dataset("folder", images=tmp_path / "images", preprocess=data_config(model))
    (tmp_path / "masks").mkdir()
    for index in range(4):                                             # masks placed where rollout points
        up = F.interpolate(vitexplain.explain(model, plain[index]["image"][None], "rollout")[None], size=(32, 32),
                           mode="bilinear", align_corners=False)[0, 0]
        row, col = divmod(int(up.flatten().argmax()), 32)
        mask = np.zeros((32, 32), np.uint8)
        if index == 0:
            mask[max(row - 1, 0):row + 2, max(col - 1, 0):col + 2] = 255          # on the maximum: a hit
        elif index == 1:
            near = row + 4 if row < 16 else row - 4
            mask[near, col] = 255                                                  # 4 pixels away: a hit at 6 only
        elif index == 2:
            mask[:] = 255                                                          # the whole image: excluded
        else:
            mask[0 if row >= 16 else 31, 0 if col >= 16 else 31] = 255             # the far corner: a miss
        Image.fromarray(mask).save(tmp_path / "masks" / f"im{index}.png")
    options = {"images": str(tmp_path / "images"), "masks": str(tmp_path / "masks")}
    tolerant = {"name": "pointing_game", "label": "pg-tol", "options": {"tolerance": 6}}
    config = BenchConfig(models={"tiny": model}, methods=["rollout"], dataset={"name": "folder", "options": options},
                         metrics=["pointing_game", tolerant], batch_size=3, output_dir=tmp_path / "out",
                         progress=False, device="cpu", gallery=0)
    result = run_benchmark(config)
    assert result.errors == []
    data = get_dataset("folder", **options, preprocess=data_config(model))
    assert data.provides == ("masks",)
    for label, tolerance, accuracy in (("pointing_game", 0.0, 1 / 3), ("pg-tol", 6.0, 2 / 3)):
        hits = []
        for index in range(len(data)):
            sample = data[index]
            if sample["mask"].float().mean() < 0.5:
                saliency = vitexplain.explain(model, sample["image"][None], "rollout")[0]
                hits.append(plain_hit(saliency, sample["mask"], tolerance))
        scores = result.scores["tiny"]["rollout"][label]
        assert (scores["included"], scores["excluded"]) == (len(hits), len(data) - len(hits)) == (3, 1)
        assert scores["accuracy"] == pytest.approx(sum(hits) / len(hits)) == pytest.approx(accuracy)


def test_a_protocol_no_image_can_serve_is_refused_once_before_any_method_runs(tmp_path, monkeypatch):
    log = tmp_path / "explained.log"
    monkeypatch.setenv("BENCH_METHOD_LOG", str(log))               # bench_picky writes every batch it explains
    config = BenchConfig(models={"a": make_vit(depth=1), "b": make_vit(seed=1, depth=1)},
                         methods=["bench_picky", {"name": "bench_picky", "label": "picky-1",
                                                  "options": {"start_layer": 1}}],
                         metrics=["pointing_game", "bench_needs_masks"], dataset=RandomImages(5), batch_size=2,
                         output_dir=tmp_path / "out", progress=False, device="cpu", gallery=0)
    result = run_benchmark(config)
    assert not log.exists()                                            # no map was computed
    assert not list((tmp_path / "out").rglob("*.safetensors"))         # nothing cached: no maps, no values
    assert [(e["model"], e["method"], e["metric"], e["error"]) for e in result.errors] == [
        ("", "", "bench_needs_masks", "metric 'bench_needs_masks' needs masks, which dataset RandomImages does not "
                                      "provide"),
        ("", "", "pointing_game", "metric 'pointing_game' needs boxes or masks, which dataset RandomImages does not "
                                  "provide")]
    assert all(e["images"] == [f"#{i}" for i in range(5)] for e in result.errors)
    assert "| every model | every method | pointing_game | 5 |" in (tmp_path / "out" / "results.md").read_text()
    # a Dataset object that declares nothing: what its first sample carries
    pointing = [get_metric("pointing_game")]
    assert _provided(RandomImages(3, masks=True), pointing, config) == ("masks",)
    assert _provided(RandomImages(3), pointing, config) == ()
    assert _provided(RandomImages(3, broken=[0]), pointing, config) is None    # unreadable: decided image by image
