"""Segmentation test (Chefer et al.'s ImageNet-Segmentation protocol; TokenTM / GradToken Table 1)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

from vitexplain.metrics import get_metric
from vitexplain.metrics.segmentation import THRESHOLD_GRID, average_precision, reduce_segmentation, segmentation
from vitexplain.options import InvalidOption

HAND_MAP = torch.tensor([[[0.0, 1.0], [3.0, 4.0]]])       # normalised: 0, .25, .75, 1; mean .5


def test_hand_computed_example():
    mask = torch.tensor([[[False, True], [False, True]]])
    values = segmentation(HAND_MAP, mask)
    # foreground = pixels 2, 3; truth = pixels 1, 3
    assert values["correct"].tolist() == [2] and values["labeled"].tolist() == [4]
    assert values["intersection_foreground"].tolist() == [1] and values["union_foreground"].tolist() == [3]
    assert values["intersection_background"].tolist() == [1] and values["union_background"].tolist() == [3]
    # pooled channels: score 1 -> 2 TP; .75 -> 2 FP; .25 -> 2 TP (P = 4/6); 0 -> 2 FP
    assert values["ap"].item() == pytest.approx(0.5 * 1 + 0.5 * 4 / 6)
    reported = reduce_segmentation(values)
    assert reported["pixel_accuracy"] == pytest.approx(50.0)
    assert reported["miou"] == pytest.approx(100 / 3)
    assert reported["map"] == pytest.approx(100 * 5 / 6)


def test_all_foreground_mask():
    values = segmentation(HAND_MAP, torch.ones(1, 2, 2, dtype=torch.bool))
    assert values["correct"].tolist() == [2]
    assert values["intersection_foreground"].tolist() == [2] and values["union_foreground"].tolist() == [4]
    assert values["intersection_background"].tolist() == [0] and values["union_background"].tolist() == [2]
    assert values["ap"].item() == pytest.approx(0.5)           # every threshold has precision 1/2
    assert reduce_segmentation(values)["miou"] == pytest.approx(25.0)


def test_ignored_pixels_leave_every_count_and_the_ap():
    mask = torch.tensor([[[False, True], [False, True]]])
    ignore = torch.tensor([[[False, False], [True, False]]])          # pixel 2: predicted fg, truly bg
    values = segmentation(HAND_MAP, mask, ignore=ignore)
    assert values["correct"].tolist() == [2] and values["labeled"].tolist() == [3]
    assert values["intersection_foreground"].tolist() == [1] and values["union_foreground"].tolist() == [2]
    assert values["intersection_background"].tolist() == [1] and values["union_background"].tolist() == [2]
    kept = [0, 1, 3]
    relevance = torch.tensor([0.0, 0.25, 0.75, 1.0])[kept]
    truth = mask.flatten()[kept]
    scores = torch.cat([1 - relevance, relevance])
    expected = average_precision_score(torch.cat([~truth, truth]).numpy(), scores.numpy())
    assert values["ap"].item() == pytest.approx(expected)


def test_constant_map_is_all_background_and_ap_one_half():
    mask = torch.tensor([[[True, False, False], [True, True, False]]])
    for threshold in ("mean", "best", "best_per_metric"):
        values = segmentation(torch.full((1, 2, 3), 2.0), mask, threshold=threshold)
        assert (values["correct"] == 3).all()                  # the 3 background pixels
        assert (values["intersection_foreground"] == 0).all()
        assert values["ap"].item() == pytest.approx(0.5)       # both channels score 0 (Chefer's NaN -> 0)


def test_average_precision_matches_sklearn_with_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (6, 40), generator=g).float() / 4      # many ties
    labels = torch.rand(6, 40, generator=g) > 0.6
    expected = [average_precision_score(lab.numpy(), sc.numpy()) for sc, lab in zip(scores, labels)]
    assert average_precision(scores, labels).tolist() == pytest.approx(expected)


def _chefer_reference(maps, masks, thresholds):
    """Plain per-image loop of Chefer et al.'s evaluation, with numpy and scikit-learn."""
    correct, labeled = np.zeros(len(thresholds)), 0
    inter, union = np.zeros((len(thresholds), 2)), np.zeros((len(thresholds), 2))
    aps = []
    for raw, mask in zip(maps, masks):
        up = F.interpolate(raw[None, None], size=mask.shape, mode="bilinear", align_corners=False)[0, 0].numpy()
        res = (up - up.min()) / (up.max() - up.min())
        truth = mask.numpy().astype(int)
        for t, cut in enumerate(thresholds):
            pred = (res > (res.mean() if cut is None else cut)).astype(int)
            correct[t] += (pred == truth).sum()
            for c in (0, 1):
                inter[t, c] += ((pred == c) & (truth == c)).sum()
                union[t, c] += ((pred == c) | (truth == c)).sum()
        labeled += truth.size
        scores = np.concatenate([(1 - res).ravel(), res.ravel()])
        aps.append(average_precision_score(np.concatenate([(truth == 0).ravel(), (truth == 1).ravel()]), scores))
    eps = np.spacing(1)
    return 100 * correct / (eps + labeled), 100 * (inter / (eps + union)).mean(1), 100 * np.mean(aps)


def _random_case(seed):
    g = torch.Generator().manual_seed(seed)
    maps = torch.rand(5, 4, 4, generator=g)
    masks = F.interpolate(torch.rand(5, 1, 4, 4, generator=g), size=(16, 16), mode="bilinear")[:, 0] > 0.5
    return maps, masks


def test_mean_threshold_matches_reference_loop():
    maps, masks = _random_case(1)
    accuracy, miou, map_ = _chefer_reference(maps, masks, [None])
    reported = reduce_segmentation(segmentation(maps, masks, threshold="mean"))
    assert reported == pytest.approx({"pixel_accuracy": accuracy[0], "miou": miou[0], "map": map_})


def test_best_threshold_is_one_per_method_the_one_of_the_highest_miou():
    maps, masks = _random_case(2)
    accuracy, miou, map_ = _chefer_reference(maps, masks, list(THRESHOLD_GRID))
    chosen = int(miou.argmax())
    assert int(accuracy.argmax()) != chosen               # the case tells one threshold from two
    values = segmentation(maps, masks, threshold="best")
    reported = reduce_segmentation(values)
    assert reported == reduce_segmentation(values, threshold="best")
    assert reported["pixel_accuracy"] == pytest.approx(accuracy[chosen])
    assert reported["miou"] == pytest.approx(miou.max())
    assert reported["map"] == pytest.approx(map_)
    assert reported["pixel_accuracy_threshold"] == reported["miou_threshold"] == THRESHOLD_GRID[chosen]


def test_best_per_metric_threshold_picks_the_dataset_best_of_each_metric():
    maps, masks = _random_case(2)
    accuracy, miou, map_ = _chefer_reference(maps, masks, list(THRESHOLD_GRID))
    reported = reduce_segmentation(segmentation(maps, masks, threshold="best_per_metric"), threshold="best_per_metric")
    assert reported["pixel_accuracy"] == pytest.approx(accuracy.max())
    assert reported["miou"] == pytest.approx(miou.max())
    assert reported["map"] == pytest.approx(map_)
    assert reported["pixel_accuracy_threshold"] == THRESHOLD_GRID[int(accuracy.argmax())]
    assert reported["miou_threshold"] == THRESHOLD_GRID[int(miou.argmax())]


def test_the_registered_metric_reports_with_the_threshold_it_computed_with():
    from vitexplain.metrics import EvalBatch, get_metric

    maps, masks = _random_case(2)
    batch = EvalBatch(images=torch.zeros(5, 3, 16, 16), maps=maps, targets=torch.zeros(5, dtype=torch.long),
                      labels=torch.zeros(5, dtype=torch.long), explain=None, logits=None, ids=list("abcde"),
                      truth={"masks": masks})
    metric = get_metric("segmentation")
    for threshold in ("best", "best_per_metric", "mean"):
        values = metric.compute(batch, threshold=threshold)
        expected = reduce_segmentation(values, threshold=threshold)
        assert metric.report(values, {"threshold": threshold}) == expected
    per_metric = metric.report(metric.compute(batch, threshold="best_per_metric"), {"threshold": "best_per_metric"})
    assert per_metric["pixel_accuracy_threshold"] != per_metric["miou_threshold"]


def test_per_image_values_do_not_depend_on_batching():
    maps, masks = _random_case(3)
    whole = segmentation(maps, masks)
    parts = [segmentation(maps[i:i + 1], masks[i:i + 1]) for i in range(5)]
    joined = {k: torch.cat([p[k] for p in parts]) for k in whole}
    assert reduce_segmentation(joined) == pytest.approx(reduce_segmentation(whole))


def test_errors():
    masks = torch.ones(2, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="image 1"):
        segmentation(torch.tensor([[[0.0]], [[float("nan")]]]), masks)
    metric = get_metric("segmentation")
    message = (r"^option threshold of metric 'segmentation' must be one of 'mean', 'best', 'best_per_metric', "
               r"got 'otsu'$")
    with pytest.raises(InvalidOption, match=message):
        metric.compute(None, threshold="otsu")
    with pytest.raises(InvalidOption, match=message):                   # reduce takes it too: checked as well
        metric.report({}, {"threshold": "otsu"})
    with pytest.raises(ValueError, match="3 maps for 2 images"):
        segmentation(torch.rand(3, 2, 2), masks)


def test_registered_metric_reads_the_batch_ignore_mask():
    from vitexplain.metrics import EvalBatch, get_metric

    maps = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    masks = torch.tensor([[[False, True], [False, False]]])
    ignore = torch.tensor([[[False, False], [True, False]]])

    def batch(ignored):
        return EvalBatch(images=torch.zeros(1, 3, 2, 2), maps=maps, targets=torch.zeros(1, dtype=torch.long),
                         labels=torch.zeros(1, dtype=torch.long), explain=None, logits=None, ids=["a"],
                         truth={"masks": masks, "ignore": ignored})

    metric = get_metric("segmentation")
    with_ignore = metric.reduce(metric.compute(batch(ignore)))
    without = metric.reduce(metric.compute(batch(None)))
    # the one wrong pixel (predicted foreground at (1, 0)) is the ignored one
    assert with_ignore["pixel_accuracy"] == pytest.approx(100.0)
    assert without["pixel_accuracy"] == pytest.approx(75.0)
