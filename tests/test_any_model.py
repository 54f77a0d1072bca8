"""Models no family instruments, and models handed over in other forms than a bare family model.

The methods that read only the outputs (RISE, Integrated Gradients, SmoothGrad, the controls) on a ResNet
and a ConvNeXt, equal to written-out computations; the others refused with what they read; compiled and
``nn.Sequential``-wrapped ViTs; projection heads; inference mode; gradient checkpointing; the library's own
input checks and refusals; the model left exactly as it was throughout."""
from __future__ import annotations

import pytest
import timm
import torch
import torchvision
from torch import nn

from vitexplain import available_methods, explain, get_method
from vitexplain.instrumentation import UnsupportedModelError, adapter_for, family_of, served_families
from vitexplain.instrumentation.families.base import projection_head
from vitexplain.methods.rise import grid_masks, random_grids
from vitexplain.methods.smoothgrad import noise_samples

from quick import method_options
from test_instrumentation import _assert_same, _snapshot
from zoo import SIZE, build, images

OUTPUT_ONLY = [name for name in available_methods("image") if get_method(name).reads == "output"]


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10).eval()


def _state(model: nn.Module) -> dict:
    """What an explanation could leave behind, BatchNorm statistics and checkpointing flags included."""
    return {**_snapshot(model), "buffers": [b.clone() for b in model.buffers()],
            "checkpointing": [getattr(m, "grad_checkpointing", None) for m in model.modules()]}


def _assert_state(before: dict, after: dict) -> None:
    _assert_same(before, after)
    assert before["checkpointing"] == after["checkpointing"]
    assert all(torch.equal(a, b) for a, b in zip(before["buffers"], after["buffers"]))


def test_the_methods_that_read_outputs_are_those_that_need_nothing_inside():
    assert set(OUTPUT_ONLY) == {"rise", "integrated_gradients", "smoothgrad", "random_baseline", "constant_baseline",
                                "saliency", "input_x_gradient", "guided_backprop", "deeplift", "deeplift_shap",
                                "expected_gradients", "occlusion", "lime", "kernel_shap", "captum"}


def test_rise_on_a_resnet_equals_a_plain_loop_over_its_masks():
    model, x = _resnet(), images(2)
    n_masks, p1 = 6, 0.5
    grids, shifts = random_grids(n_masks, 7, p1, (32, 32), seed=3, device=torch.device("cpu"))
    masks = grid_masks(grids, shifts, (32, 32))
    with torch.no_grad():
        predicted = model(x).argmax(-1)
        expected = torch.zeros(2, 32, 32)
        for image in range(2):
            for mask in masks:
                probability = model((x[image] * mask)[None]).softmax(-1)[0, predicted[image]]
                expected[image] += probability * mask
    found = explain(model, x, "rise", n_masks=n_masks, p1=p1, seed=3, batch_size=7)
    torch.testing.assert_close(found, expected / (n_masks * p1), rtol=1e-5, atol=1e-6)


def test_integrated_gradients_on_a_convnext_equal_captums():
    from captum.attr import IntegratedGradients

    torch.manual_seed(0)
    model, x = timm.create_model("convnext_atto", pretrained=False, num_classes=10).eval(), images(2)
    target = torch.tensor([3, 7])
    expected = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=target, n_steps=5).sum(1)
    found = explain(model, x, "integrated_gradients", target, n_steps=5)
    torch.testing.assert_close(found, expected.detach(), rtol=1e-4, atol=1e-6)


def test_smoothgrad_on_a_resnet_equals_the_written_out_average_of_noisy_gradients():
    model, x = _resnet(), images(2)
    noise = noise_samples(3, (3, 32, 32), seed=5, device=torch.device("cpu"))
    expected = torch.zeros(2, 3, 32, 32)
    for image in range(2):
        for sample in noise:
            noisy = (x[image] + 0.5 * sample)[None].requires_grad_(True)
            model(noisy)[0, 4].backward()
            expected[image] += noisy.grad[0].abs()
    found = explain(model, x, "smoothgrad", 4, n_samples=3, stdev=0.5, seed=5, batch_size=4)
    torch.testing.assert_close(found, expected.sum(1) / 3, rtol=1e-4, atol=1e-6)


def test_every_other_method_is_refused_naming_what_it_reads_and_the_model_is_left_as_it_was():
    model, x = _resnet().train(), images(2)
    before = _state(model)
    for method in available_methods("image"):
        spec = get_method(method)
        if method in ("deeplift", "deeplift_shap"):   # Captum refuses a ResNet block's ReLU called twice
            with pytest.raises(UnsupportedModelError, match=r"calls ReLU\(inplace=True\) more than once"):
                explain(model, x, method, **method_options(method))
        elif spec.reads == "output":
            maps = explain(model, x, method, **method_options(method))
            assert maps.shape == (2, 32, 32) and maps.isfinite().all()  # the controls' grid is the pixels
        else:
            with pytest.raises(UnsupportedModelError, match=rf"^method '{method}' reads {spec.reads}; ResNet has none "
                                                             r"that vitexplain can reach \(it instruments timm "):
                explain(model, x, method)
    with pytest.raises(UnsupportedModelError, match=r"^record reads the model's blocks; ResNet has none "):
        adapter_for(model).record(x, fields=(), grads=["input"])
    _assert_state(before, _state(model))  # once: a change any call left would still show


@pytest.mark.parametrize("method", ["rise", "integrated_gradients", "smoothgrad"])
def test_a_resnet_is_restored_when_an_error_stops_the_method(method):
    model, x = _resnet().train(), images(2)

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model.layer4.register_forward_hook(explode)
    before = _state(model)
    with pytest.raises(RuntimeError, match="injected"):
        explain(model, x, method, **method_options(method))
    _assert_state(before, _state(model))
    handle.remove()


def test_a_transformers_output_object_is_read_by_its_logits_and_other_outputs_are_refused():
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model, x = ResNetForImageClassification(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                         num_labels=5)).eval(), images(2)
    with torch.no_grad():
        predicted = model(x).logits.argmax(-1)
    torch.testing.assert_close(explain(model, x, "rise", n_masks=6), explain(model, x, "rise", predicted, n_masks=6))
    with pytest.raises(UnsupportedModelError, match=r"^Conv2d returns shape \(2, 3, 32, 32\) for 2 images; vitexplain "
                                                    r"explains a model returning scores \[B, K\]"):
        explain(nn.Conv2d(3, 3, 3, padding=1), x, "rise", n_masks=2)


# -- other forms of a model a family describes -----------------------------------------------------
@pytest.mark.parametrize("method", ["gae", "lrp", "rise", "integrated_gradients", "tis"])
def test_a_compiled_model_is_explained_through_its_original_module(method):
    model, x = build("vit"), images(2)
    compiled = torch.compile(model)
    before = _state(model)
    torch.testing.assert_close(explain(compiled, x, method, **method_options(method)),
                               explain(model, x, method, **method_options(method)), rtol=0, atol=0)
    _assert_state(before, _state(model))
    assert adapter_for(compiled).model is model


def test_a_sequential_runs_its_preprocessing_first_and_explains_the_vit_inside():
    """Token maps are those of the preprocessed images; gradients reach the images before preprocessing; LRP,
    which has no rule for the preprocessing, refuses it by name; a module after the ViT makes it a model known
    by its outputs only."""
    from captum.attr import IntegratedGradients

    vit, x = build("vit"), images(2).sigmoid()
    normalise = torchvision.transforms.Normalize((0.5, 0.4, 0.3), (0.2, 0.3, 0.25))
    wrapped = nn.Sequential(normalise, vit)
    before = _state(wrapped)
    torch.testing.assert_close(explain(wrapped, x, "gae", 3), explain(vit, normalise(x), "gae", 3), rtol=0, atol=0)
    expected = IntegratedGradients(wrapped).attribute(x, baselines=torch.zeros_like(x), target=3, n_steps=4).sum(1)
    torch.testing.assert_close(explain(wrapped, x, "integrated_gradients", 3, n_steps=4), expected.detach(),
                               rtol=1e-4, atol=1e-6)
    with pytest.raises(UnsupportedModelError, match=r"its module 0 \(Normalize\) has no LRP rule"):
        explain(wrapped, x, "lrp")
    resized = nn.Sequential(torchvision.transforms.Resize((32, 32), antialias=True), torch.compile(wrapped))
    assert explain(resized, torch.rand(2, 3, 48, 48), "gae").shape == (2, 4, 4)
    with pytest.raises(ValueError, match="takes 32x32 images, got 40x40"):
        explain(wrapped, torch.rand(2, 3, 40, 40), "gae")
    with pytest.raises(UnsupportedModelError, match="^method 'gae' reads attention; Sequential has none"):
        explain(nn.Sequential(vit, nn.Softmax(-1)), x, "gae")
    _assert_state(before, _state(wrapped))


# -- class heads --------------------------------------------------------------------------------------
def _tower(name: str, **arguments) -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3,
                             **arguments).eval()


@pytest.mark.parametrize("name, projection", [
    ("vit_base_patch16_clip_224.openai", True), ("vit_base_patch16_clip_224.laion2b", True),
    ("vit_large_patch14_clip_224.dfn2b", True), ("vit_pe_core_base_patch16_224.fb", True),
    ("eva02_base_patch16_clip_224.merged2b", True), ("convnext_base.clip_laion2b", True),
    ("resnet50_clip.openai", True),
    ("vit_base_patch16_clip_224.openai_ft_in1k", False), ("vit_base_patch16_clip_224.laion2b_ft_in12k", False),
    ("vit_base_patch16_224.augreg_in21k", False), ("mvitv2_base_cls.fb_inw21k", False),
    ("vit_base_patch16_224.bamboo", False),
    ("vit_base_patch16_siglip_224.webli", False),
])
def test_a_projection_head_is_told_from_a_class_head_by_the_pretrained_config(name, projection):
    """On timm's own configurations (without building the models): image-text towers with their projection as
    head are projections, towers fine-tuned on a label set and classifiers of unusual label sets are not."""
    config = timm.models.get_pretrained_cfg(name).to_dict()
    model = nn.Module()
    model.pretrained_cfg, model.num_classes = config, config["num_classes"]
    assert (projection_head(model) is not None) == projection
    model.num_classes = 10  # a head the user built for their own classes
    assert projection_head(model) is None


def test_a_clip_tower_refuses_classes_unless_told_and_explains_directions():
    tower, x = _tower("vit_base_patch16_clip_224.openai"), images(2)
    assert tower.num_classes == 512
    for method, target in [("gae", None), ("gae", 3), ("lrp", None), ("rise", None)]:
        with pytest.raises(ValueError, match=r"^its head projects to the 512-d image-text embedding of "
                                             r"vit_base_patch16_clip_224\.openai .* "
                                             r"give target= an embedding direction"):
            explain(tower, x, method, target)
    with torch.no_grad():
        coordinate = tower(x).argmax(-1)
    torch.testing.assert_close(explain(tower, x, "gae", classes=True),
                               explain(tower, x, "gae", coordinate, classes=True))
    direction = torch.randn(512, generator=torch.Generator().manual_seed(1))
    assert explain(tower, x, "gae", direction).shape == (2, 4, 4)
    assert explain(tower, x, "random_baseline").shape == (2, 4, 4)  # a control reads no target
    assert explain(_tower("vit_base_patch16_clip_224.openai", num_classes=10), x, "gae").shape == (2, 4, 4)
    with pytest.raises(ValueError,
                       match=r"^the caller said its outputs are not classes \(classes=False\), so it has no "
                                         r"classes to explain"):
        explain(build("vit"), x, "gae", classes=False)
    assert explain(build("vit"), x, "gae", direction[:10], classes=False).shape == (2, 4, 4)


def test_a_float_scalar_target_is_refused_as_a_class_that_is_not_an_integer():
    for method in ("gae", "lrp"):
        with pytest.raises(TypeError, match=r"target must hold integer class indices, got dtype torch\.float32"):
            explain(build("vit"), images(2), method, torch.tensor(3.0))


# -- inference mode, gradient checkpointing -------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_maps() -> dict:
    """Every image method's maps of the tiny ViT, in an ordinary call (the reference of the two tests below)."""
    model, x = build("vit"), images(2)
    return {method: explain(model, x, method, **method_options(method)) for method in available_methods("image")}


def test_inside_inference_mode_every_method_gives_the_maps_it_gives_outside(plain_maps):
    model, x, outside = build("vit"), images(2), plain_maps
    with torch.inference_mode():
        inputs, predicted = x.clone(), model(x).argmax(-1)
        for method in available_methods("image"):
            torch.testing.assert_close(explain(model, inputs, method, **method_options(method)), outside[method])
        torch.testing.assert_close(explain(model, inputs, "gae", predicted), outside["gae"])
        with pytest.raises(RuntimeError,
                           match=r"weights were made under torch\.inference_mode\(\).*outside inference mode"):
            explain(build("vit"), inputs, "rise", n_masks=2)


@pytest.mark.parametrize("name", ["vit", "swinv2"])
def test_gradient_checkpointing_is_switched_off_for_the_call_and_on_again_after(name, plain_maps):
    """timm keeps the flag on the model (ViT) or on each stage (Swin); every method on the ViT, on the Swin a
    gradient method and LRP (which raised CheckpointError)."""
    model, x = build(name), images(2)
    if name == "vit":
        methods, plain = available_methods("image"), plain_maps
    else:
        methods = ["gae", "lrp"]
        plain = {method: explain(model, x, method) for method in methods}
    model.set_grad_checkpointing(True)
    before = _state(model)
    for method in methods:
        torch.testing.assert_close(explain(model, x, method, **method_options(method)), plain[method])
        _assert_state(before, _state(model))


# -- the library's own input checks and refusals ---------------------------------------------------------
@pytest.mark.parametrize("name, arguments, shape, message", [
    ("vit", {}, (2, 1, 32, 32), r"takes 3-channel images, got 1 channel\(s\)"),
    ("vit", {}, (2, 4, 32, 32), r"takes 3-channel images, got 4 channel\(s\)"),
    ("swin", {}, (2, 4, 32, 32), r"takes 3-channel images, got 4 channel\(s\)"),
    ("vit", {"dynamic_img_size": True}, (2, 3, 33, 40), r"8x8 patches, which do not tile a 33x40 image"),
    ("vit", {}, (2, 3, 33, 33), r"takes 32x32 images, got 33x33"),
])
def test_channels_and_sizes_are_checked_before_the_model_sees_them(name, arguments, shape, message):
    with pytest.raises(ValueError, match=message):
        explain(build(name, **arguments), torch.randn(shape), "gae")


@pytest.mark.parametrize("channels", [1, 4])
def test_a_model_known_by_its_outputs_that_fails_on_the_channels_is_told_so(channels):
    """Its channels are not known before it runs; its failure is then put in the library's words, naming the
    convolution that says what it takes (an unrelated failure stays the model's: the restoring test above)."""
    torch.manual_seed(0)
    convnext = timm.create_model("convnext_atto", pretrained=False, num_classes=10).eval()
    for model, first in [(_resnet(), "conv1"), (nn.Sequential(nn.Identity(), convnext), r"1\.stem\.0")]:
        with pytest.raises(ValueError, match=rf"^this model takes 3-channel images \(its first convolution, {first}, "
                                             rf"does\), got {channels} channel\(s\) in shape "
                                             rf"\(2, {channels}, 32, 32\)"):
            explain(model, torch.randn(2, channels, 32, 32), "rise", n_masks=2)


def test_a_model_with_padding_patches_takes_any_size():
    model = build("vit", dynamic_img_size=True, dynamic_img_pad=True)
    assert explain(model, torch.randn(1, 3, 33, 40), "gae").shape == (1, 5, 5)


@pytest.mark.parametrize("architecture, arguments, reason", [
    ("vit_base_patch16_224", {"global_pool": "prr"},
     "its head pools with global_pool='prr', which vitexplain does not describe"),
    ("vit_small_patch16_18x2_224", {}, "block 0 is a ParallelThingsBlock"),
])
def test_a_refusal_is_one_line_with_the_one_reason_then_the_families_served(architecture, arguments, reason):
    torch.manual_seed(0)
    model = timm.create_model(architecture, pretrained=False, **{**SIZE, **arguments})
    for refusal in (lambda: family_of(model), lambda: explain(model, images(1), "gae")):
        with pytest.raises(UnsupportedModelError) as raised:
            refusal()
        message = str(raised.value)
        assert "\n" not in message and message.count("VisionTransformer:") == 1 and "is not a timm" not in message
        assert f"vitexplain cannot instrument this VisionTransformer: {reason}" in message
        served = [family.name for family in served_families()]
        assert served[0] == "timm VisionTransformer" and message.endswith("; it instruments " + ", ".join(served))
    assert explain(model, images(1), "rise", n_masks=2).shape == (1, 32, 32)  # its outputs still explain it


@pytest.mark.parametrize("name, arguments, cause", [
    ("swinv2", {}, r"in block \d+ of this SwinTransformerV2 its blocks normalise the attention branch after the heads "
                   r"are summed \(res-post-norm\)$"),
    ("vit", {"scale_attn_norm": True}, r"in block \d+ of this VisionTransformer its attention normalises the heads' "
                                       r"output \(LayerNorm\) before projecting it$"),
])
def test_tokentm_and_bt_token_name_the_one_cause_that_applies(name, arguments, cause):
    model = build(name, **arguments)
    for method in ("tokentm", "bt_token"):
        with pytest.raises(UnsupportedModelError, match=f"^{method} reads each head's share of the attention branch, "
                                                        f"but {cause}"):
            explain(model, images(1), method, **method_options(method))
