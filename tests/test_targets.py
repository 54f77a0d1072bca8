"""Explaining more than a class logit: embedding directions (headless models) and score functions."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitexplain import adapter_for, available_methods, explain, get_method

from reference import manual_forward
from zoo import build, images


def _written_out_gae(model, x, score_of):
    logits, attentions, _ = manual_forward(model, x)
    score_of(logits).sum().backward()
    rows = []
    for image in range(x.shape[0]):
        relevance = torch.eye(attentions[0].shape[-1])
        for a in attentions:
            cam = (a.grad[image] * a[image]).clamp(min=0).mean(0).detach()
            relevance = relevance + cam @ relevance
        rows.append(relevance[0, 1:].reshape(4, 4))
    return torch.stack(rows)


@pytest.mark.parametrize("per_image", [False, True])
def test_an_embedding_direction_explains_the_cosine_similarity_of_a_headless_model(per_image):
    model, x = build("vit", num_classes=0), images(2)
    direction = torch.randn(2, 48, generator=torch.Generator().manual_seed(4))
    direction = direction if per_image else direction[0]
    expected = _written_out_gae(model, x, lambda out: F.cosine_similarity(out, direction.expand(2, -1), dim=1))
    torch.testing.assert_close(explain(model, x, "gae", direction), expected, rtol=1e-4, atol=1e-6)


def test_a_score_function_is_differentiated_as_given():
    model, x = build("vit"), images(2)

    def margin(out):
        return out[:, 3] - out[:, 5]

    expected = _written_out_gae(model, x, margin)
    torch.testing.assert_close(explain(model, x, "gae", margin), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method, options",
                         [("rise", {"n_masks": 16, "score": "logit"}), ("tis", {"n_masks": 8, "score": "logit"}),
                                             ("smoothgrad", {"n_samples": 3}), ("integrated_gradients", {"n_steps": 4}),
                                             ("vitcx", {"score": "logit"})])
def test_sampling_methods_score_a_function_like_the_class_it_computes(method, options):
    """A score function returning one class's logit gives the map of that class scored by its logit."""
    model, x = build("vit"), images(2)
    by_class = explain(model, x, method, 6, **options)
    by_function = explain(model, x, method, lambda out: out[:, 6], **options)
    torch.testing.assert_close(by_function, by_class, rtol=1e-4, atol=1e-6)


def test_integrated_gradients_of_a_direction_equal_captum_on_the_cosine_similarity():
    from captum.attr import IntegratedGradients

    model, x = build("vit", num_classes=0), images(2)
    direction = torch.randn(48, generator=torch.Generator().manual_seed(5))

    def cosine(inputs):
        return F.cosine_similarity(model(inputs), direction.expand(inputs.shape[0], -1), dim=1)

    expected = IntegratedGradients(cosine).attribute(x, baselines=torch.zeros_like(x), n_steps=5).sum(1)
    found = explain(model, x, "integrated_gradients", direction, n_steps=5)
    torch.testing.assert_close(found, expected.detach(), rtol=1e-4, atol=1e-6)


def test_methods_that_explain_classes_only_say_so():
    model, x = build("vit", num_classes=0), images(1)
    only_classes = [name for name in available_methods("image") if not get_method(name).score_targets]
    assert set(only_classes) == {"lrp", "partial_lrp", "conservative_lrp", "abs_lrp", "attnlrp", "cp_lrp",
                                 "pa_lrp", "transformer_attribution"}
    for method in only_classes:
        with pytest.raises(ValueError, match="explains classes only"):
            explain(model, x, method, torch.ones(48))
    with pytest.raises(ValueError, match="no classifier head"):
        explain(model, x, "gae")
    with pytest.raises(ValueError,
                       match=r"no classifier head \(its output is an embedding\), so it has no classes to explain"):
        explain(model, x, "gae", 3)
    with pytest.raises(ValueError, match=r"embedding direction must be \[D\] or \[B, D\] with D = 48"):
        explain(model, x, "gae", torch.ones(47))
    with pytest.raises(ValueError, match="one value per row"):
        explain(build("vit"), x, "gae", lambda out: out)


def test_a_class_target_of_a_headless_model_is_refused_for_its_reason_wherever_it_comes_in():
    model, x = build("vit", num_classes=0), images(1)
    adapter = adapter_for(model)
    for refused in (lambda: explain(model, x, "gae"), lambda: explain(model, x, "degraded", target=2),
                    lambda: adapter.record(x, fields=()), lambda: adapter.target(x, None)):
        with pytest.raises(ValueError, match=r"no classifier head \(its output is an embedding\), so it has no"):
            refused()
    assert explain(model, x, "constant_baseline").shape == (1, 4, 4)  # the controls read no target
