"""Every registered protocol through the bench's contract (EvalBatch in, per-image values out), on a tiny ViT."""
import inspect

import pytest
import torch

import vitexplain
from vitexplain.instrumentation.modifying import modifier
from vitexplain.metrics import EvalBatch, available_metrics, get_metric

from conftest import make_vit
from quick import metric_options

#: every built-in protocol an image batch can serve (the text one reads words), found in the registry
PROTOCOLS = [name for name in available_metrics()
             if get_metric(name).compute.__module__.startswith("vitexplain.metrics")
             and not {"word_index", "rationale_spans"} & set(get_metric(name).requires)]


def make_batch(model, method, rows=slice(None)):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, 32, 32, generator=g)[rows]
    labels = torch.tensor([1, 4, 7, 2])[rows]
    masks = (torch.rand(4, 32, 32, generator=g) > 0.5)[rows]
    second_masks = (torch.rand(4, 32, 32, generator=g) > 0.7)[rows] & ~masks
    boxes = [torch.tensor([[2.0, 3.0, 20.0, 18.5]]), torch.tensor([[0.0, 0.0, 31.0, 31.0]]),
             torch.tensor([[5.0, 5.0, 9.0, 9.0], [20.0, 1.0, 30.0, 12.0]]), torch.zeros(0, 4)][rows]

    def explain(imgs, targets):
        return vitexplain.explain(model, imgs, method, targets)

    return EvalBatch(images=images, maps=explain(images, labels), targets=labels, labels=labels, explain=explain,
                     logits=vitexplain.adapter_for(model).logits, features=vitexplain.adapter_for(model).features,
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                     modified=modifier(model),
                     ids=[f"img{i}" for i in range(4)][rows],
                     truth={"masks": masks, "boxes": boxes, "second": {"targets": torch.tensor([3, 3, 0, 9])[rows],
                                                                        "masks": second_masks, "boxes": None}})


@pytest.fixture(scope="module")
def model():
    return make_vit(depth=2)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_per_image_values_reduce_the_same_whatever_the_batching(model, name):
    metric = get_metric(name)
    options = {**metric.options, **metric_options(name)}
    whole = metric.compute(make_batch(model, "gae"), **options)
    for value in whole.values():
        assert value.shape[0] == 4 and value.dim() <= 2
    halves = [metric.compute(make_batch(model, "gae", rows), **options) for rows in (slice(0, 1), slice(1, 4))]
    joined = {key: torch.cat([h[key] for h in halves]) for key in whole}
    reported = metric.reduce(whole)
    assert reported == pytest.approx(metric.reduce(joined), nan_ok=True)
    assert set(metric.higher_is_better) <= set(reported)
    assert all(isinstance(v, (int, float)) for v in reported.values())


def test_class_agnostic_method_has_class_sensitivity_one_half(model):
    metric = get_metric("class_sensitivity")
    reported = metric.reduce(metric.compute(make_batch(model, "rollout")))
    assert reported["class_sensitivity"] == pytest.approx(0.5)


def test_unknown_option_is_refused(model):
    with pytest.raises(TypeError, match="n_step"):
        get_metric("insertion_deletion").compute(make_batch(model, "rollout"), n_step=3)


def test_eval_batch_names_the_image_with_a_nan_map():
    with pytest.raises(ValueError, match="img1"):
        EvalBatch(images=torch.zeros(2, 3, 4, 4), maps=torch.tensor([[[0.0]], [[float("nan")]]]),
                  targets=torch.zeros(2), labels=torch.zeros(2), explain=None, logits=None, ids=["img0", "img1"])


@pytest.mark.parametrize("name", available_metrics())
def test_a_protocol_gets_the_batch_and_its_options_only(name):
    """No model object: what a protocol needs of the model comes in the batch (logits, explain, mean / std)."""
    parameters = list(inspect.signature(get_metric(name).compute).parameters.values())
    assert [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY] == ["batch"]


def test_pixel_removal_goes_through_the_batch_forward(model):
    calls = []
    batch = make_batch(model, "gae")
    forward = batch.logits
    batch.logits = lambda images: calls.append(images.shape[0]) or forward(images)
    get_metric("aopc").compute(batch, n_steps=3, batch_size=5)
    assert sum(calls) == 4 * 3                                   # every perturbed image, through the batch's forward
