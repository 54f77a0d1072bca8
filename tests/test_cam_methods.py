"""gradcam_pp and scorecam against pytorch-grad-cam (their reference), a written-out Score-CAM for the options it
lacks, batching, the model after an error, zero maps and refusals.

pytorch-grad-cam min-max scales each map and resizes it to the image (``scale_cam_image``, twice) after the ReLU;
``grid_level`` turns that step into the identity, so its output is the ReLU-ed map on the patch grid, which is what
vitexplain returns. Its feature map is ``blocks[layer].norm1`` with the ViT tutorial's ``reshape_transform``.
"""
from __future__ import annotations

import warnings

import pytest
import pytorch_grad_cam.base_cam as base_cam
import torch
import torch.nn.functional as F
import torchvision
from pytorch_grad_cam import GradCAMPlusPlus, ScoreCAM
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

import vitexplain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for

from conftest import FAMILIES, make_vit
from test_instrumentation import _assert_same, _snapshot

TARGETS = torch.tensor([3, 7, 1, 0])
REFERENCES = {"gradcam_pp": GradCAMPlusPlus, "scorecam": ScoreCAM}


@pytest.fixture
def grid_level(monkeypatch):
    monkeypatch.setattr(base_cam, "scale_cam_image", lambda cam, target_size=None: cam)


def pytorch_grad_cam(method, model, images, targets, layer=-1):
    prefix = model.num_prefix_tokens

    def tokens_to_grid(tokens):
        patches = tokens[:, prefix:]
        return patches.reshape(patches.shape[0], 4, 4, patches.shape[-1]).permute(0, 3, 1, 2)

    with REFERENCES[method](model=model, target_layers=[model.blocks[layer].norm1],
                            reshape_transform=tokens_to_grid) as cam:
        cam.batch_size = 64  # Score-CAM's masked images per forward (its default is 16)
        found = cam(input_tensor=images, targets=[ClassifierOutputTarget(int(t)) for t in targets])
    return torch.from_numpy(found)


def correlation(first, second):
    return torch.corrcoef(torch.stack([first.flatten(), second.flatten()]).double())[0, 1].item()


@pytest.mark.parametrize("method,family,layer", [("gradcam_pp", "vit", -1), ("gradcam_pp", "deit_distilled", 0),
                                                 ("gradcam_pp", "layerscale_qkvbias", -1), ("scorecam", "vit", -1),
                                                 ("scorecam", "deit_distilled", 1)])
def test_equals_pytorch_grad_cam_on_the_grid(method, family, layer, images, grid_level):
    """Not bitwise: pytorch-grad-cam sums in numpy (its own order) and forwards each image's masked copies apart,
    through the model's own (fused) attention; measured max |diff| <= 4.3e-7 on maps up to 1.8."""
    model, count = make_vit(**FAMILIES[family]), 4 if method == "gradcam_pp" else 2  # Score-CAM: 48 forwards each
    theirs = pytorch_grad_cam(method, model, images[:count], TARGETS[:count], layer)
    ours = vitexplain.explain(model, images[:count], method, TARGETS[:count], layer=layer)
    assert ours.shape == theirs.shape == (count, 4, 4) and (theirs > 0).any(1).any(1).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    assert correlation(ours, theirs) >= 0.9999


def written_out_scorecam(model, image, score, *, layer=-1, channel_weights="softmax"):
    """One image: its ``norm1`` patch tokens [16, C], each channel repeated over its 8×8 patch pixels (nearest
    upsampling) and min-max normalised, every masked copy scored by ``score(outputs) -> [C]`` (one forward of
    all C copies), the weights, the ReLU."""
    kept = []
    handle = model.blocks[layer].norm1.register_forward_hook(lambda module, args, output: kept.append(output))
    with torch.no_grad():
        model(image)
        handle.remove()
        tokens = kept[0][0, model.num_prefix_tokens:]
        masks = tokens.T.reshape(-1, 4, 4).repeat_interleave(8, 1).repeat_interleave(8, 2)
        low, high = masks.amin((1, 2), keepdim=True), masks.amax((1, 2), keepdim=True)
        scores = score(model(image * ((masks - low) / (high - low + 1e-8))[:, None]))
        weights = scores.softmax(0) if channel_weights == "softmax" else scores
        return (tokens @ weights).clamp(min=0).reshape(1, 4, 4)


@pytest.mark.parametrize("options", [{"score": "probability", "channel_weights": "score"},
                                     {"score": "logit", "channel_weights": "softmax", "layer": 0}])
def test_scorecam_with_nearest_masks_equals_a_written_out_computation(options, tiny_vit, images):
    found = vitexplain.explain(tiny_vit, images[:1], "scorecam", 5, upsampling="nearest", **options)
    score = options.pop("score")
    expected = written_out_scorecam(tiny_vit, images[:1], lambda outputs: (
        outputs if score == "logit" else outputs.softmax(-1))[:, 5], **options)
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["gradcam_pp", "scorecam"])
def test_a_batch_equals_one_image_at_a_time(method, tiny_vit, images):
    batched = vitexplain.explain(tiny_vit, images, method, TARGETS)
    single = torch.cat([vitexplain.explain(tiny_vit, images[i:i + 1], method, TARGETS[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-7)
    if method == "scorecam":  # 5 masked images per forward: pieces of a channel's images and of an image's channels
        torch.testing.assert_close(vitexplain.explain(tiny_vit, images, method, TARGETS, batch_size=5), batched,
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["gradcam_pp", "scorecam"])
def test_the_model_is_left_as_it_was_after_an_error(method, images):
    model, images, targets = make_vit(init_values=0.5).train(), images[:2], TARGETS[:2]
    before, expected = _snapshot(model), vitexplain.explain(model, images, method, targets)
    calls = []

    def explode(module, args, output):  # scorecam: in a masked forward; gradcam_pp: in its only one
        calls.append(None)
        if len(calls) == (4 if method == "scorecam" else 1):
            raise RuntimeError("injected")

    handle = model.blocks[1].mlp.register_forward_hook(explode)
    with pytest.raises(RuntimeError, match="injected"):
        vitexplain.explain(model, images, method, targets, **({"batch_size": 16} if method == "scorecam" else {}))
    handle.remove()
    _assert_same(before, _snapshot(model))
    torch.testing.assert_close(vitexplain.explain(model, images, method, targets), expected, rtol=0, atol=0)


def _zero_map_notices(model, images, method):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = vitexplain.explain(model, images, method)
    return maps, [str(w.message) for w in caught if "all-zero map" in str(w.message)]


@pytest.mark.parametrize("method,reason", [
    ("gradcam_pp", "Grad-CAM++'s ReLU removed every token's relevance: the weighted features were negative on every "
                   "patch"),
    ("scorecam", "Score-CAM's ReLU removed every token's relevance: the score-weighted features were negative on "
                 "every patch")])
def test_features_negative_everywhere_give_zero_maps_and_the_reason(method, reason, images):
    """The last block's norm1 made -1 everywhere (weight 0, bias -1): Score-CAM's weights are a softmax, so its sum
    is -1; Grad-CAM++'s α = g² / (2g² - 16 g³ + ε) > 0 where g > 0 while g < 2/16, so its weights are >= 0."""
    model, images = make_vit(), images[:2]
    maps, notices = _zero_map_notices(model, images, method)
    assert notices == [] and (maps.flatten(1) > 0).any(1).all()
    with torch.no_grad():
        model.blocks[-1].norm1.weight.zero_()
        model.blocks[-1].norm1.bias.fill_(-1)
    record = adapter_for(model).record(images, fields=("attn_input",), blocks=(2,), grads={"attn_input": (2,)})
    assert record.blocks[2].grads["attn_input"].max() < 2 / 16
    maps, notices = _zero_map_notices(model, images, method)
    assert (maps == 0).all() and notices == [f"{method} returned an all-zero map for 2 of 2 images: {reason}"]


@pytest.mark.parametrize("method", ["gradcam_pp", "scorecam"])
def test_a_model_known_by_its_outputs_only_is_refused_in_one_line(method, images):
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    with pytest.raises(UnsupportedModelError, match=rf"^method '{method}' reads tokens; ResNet has none") as refusal:
        vitexplain.explain(resnet, images, method)
    assert "\n" not in str(refusal.value)


@pytest.mark.parametrize("method,options,message", [
    ("gradcam_pp", {"layer": 3}, "layer"), ("scorecam", {"layer": -4}, "layer"),
    ("scorecam", {"batch_size": 0}, "batch_size"), ("scorecam", {"channel_weights": "exp"}, "channel_weights"),
    ("scorecam", {"upsampling": "bicubic"}, "upsampling"), ("scorecam", {"score": "margin"}, "score")])
def test_bad_options_are_refused_by_name(method, options, message, tiny_vit, images):
    with pytest.raises(ValueError, match=message):
        vitexplain.explain(tiny_vit, images, method, **options)


def test_scorecam_explains_a_direction_with_its_cosine_scores(images):
    """A model without a classifier: each masked copy's score is its output's cosine to the direction, softmaxed
    over the channels as the logits would be."""
    model, direction = make_vit(num_classes=0), torch.randn(48, generator=torch.Generator().manual_seed(4))
    found = vitexplain.explain(model, images[:1], "scorecam", direction, upsampling="nearest")
    expected = written_out_scorecam(model, images[:1], lambda outputs: F.cosine_similarity(outputs, direction[None]))
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-6)
