import pytest
import torch

import vitexplain
from vitexplain.registry import METHODS, register_method

from conftest import make_vit

ATTENTION_METHODS = ("raw_attention", "rollout", "attn_gradcam", "gae")


def test_registry_lists_the_foundation_methods():
    assert set(ATTENTION_METHODS) <= set(vitexplain.available_methods())


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_batch_equals_one_at_a_time(method, images):
    model = make_vit()
    target = torch.tensor([0, 3, 3, 7])
    batch = vitexplain.explain(model, images, method, target=target)
    single = torch.cat([vitexplain.explain(model, images[i:i + 1], method, target=int(target[i])) for i in range(4)])
    torch.testing.assert_close(batch, single, rtol=1e-5, atol=1e-7)
    assert batch.dtype == torch.float32 and batch.shape == (4, 4, 4)


def test_target_forms_agree(images):
    model = make_vit()
    as_int = vitexplain.explain(model, images, "gae", target=2)
    as_list = vitexplain.explain(model, images, "gae", target=[2, 2, 2, 2])
    as_tensor = vitexplain.explain(model, images, "gae", target=torch.full((4,), 2))
    torch.testing.assert_close(as_int, as_list)
    torch.testing.assert_close(as_int, as_tensor)
    predicted = model(images).argmax(-1)
    torch.testing.assert_close(vitexplain.explain(model, images, "gae"),
                               vitexplain.explain(model, images, "gae", target=predicted))


def test_unknown_method_and_option_list_the_valid_ones(images):
    model = make_vit()
    with pytest.raises(ValueError, match="unknown explanation method 'rolout'.*did you mean 'rollout'.*gae"):
        vitexplain.explain(model, images, "rolout")
    with pytest.raises(TypeError, match="no option 'start'.*discard_ratio, head_fusion, registers, start_layer"):
        vitexplain.explain(model, images, "rollout", start=1)
    with pytest.raises(ValueError, match="head_fusion"):
        vitexplain.explain(model, images, "rollout", head_fusion="median")
    with pytest.raises(ValueError, match="start_layer"):
        vitexplain.explain(model, images, "rollout", start_layer=3)


@pytest.mark.parametrize("bad, error, message", [
    (torch.randn(3, 32, 32), ValueError, r"shape \[B, C, H, W\]"),
    (torch.zeros(2, 3, 32, 32, dtype=torch.uint8), TypeError, "float"),
    (torch.randn(2, 3, 48, 48), ValueError, "takes 32x32 images, got 48x48"),
    (torch.randn(0, 3, 32, 32), ValueError, "empty"),
])
def test_bad_images_get_clear_errors(bad, error, message):
    with pytest.raises(error, match=message):
        vitexplain.explain(make_vit(), bad, "rollout")


def test_bad_targets_get_clear_errors(images):
    model = make_vit()
    with pytest.raises(ValueError, match="3 entries for a batch of 4"):
        vitexplain.explain(model, images, "gae", target=[1, 2, 3])
    with pytest.raises(ValueError, match=r"embedding direction must be \[D\] or \[B, D\] with D = 10"):
        vitexplain.explain(model, images, "gae", target=torch.ones(4))  # floats are a direction, not classes
    with pytest.raises(TypeError, match="integer class indices, not booleans"):
        vitexplain.explain(model, images, "gae", target=torch.ones(4, dtype=torch.bool))


def test_a_method_returning_the_wrong_shape_is_caught(images):
    @register_method("_test_wrong_shape")
    def wrong(adapter, images, target=None):
        return torch.zeros(1, 2)

    try:
        with pytest.raises(RuntimeError, match="returned shape"):
            vitexplain.explain(make_vit(), images, "_test_wrong_shape")
        with pytest.raises(ValueError, match="already registered"):
            register_method("_test_wrong_shape")(wrong)
    finally:
        METHODS.remove("_test_wrong_shape")
