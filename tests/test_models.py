"""Model loading (vitexplain.models): checkpoints, devices, the one data config, text models."""
import argparse
import json

import pytest
import torch

from vitexplain.models import ModelLoadError, data_config, load_model, load_text_model, resolve_device

from conftest import TINY, make_vit


def test_model_loading_errors_say_what_to_do(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # offline: nothing downloads
    with pytest.raises(ModelLoadError, match="offline mode is on.* not .*in the local cache.*pre-fetch it.*"
                                             "--arch vit_base_patch16_224"):
        load_model("vit_base_patch16_224", device="cpu", offline=True)
    with pytest.raises(ModelLoadError, match="unknown timm architecture"):
        load_model("vit_no_such_model_999", device="cpu")
    bogus = tmp_path / "weights.pth"
    torch.save({"head.weight": torch.zeros(3, 3)}, bogus)
    with pytest.raises(ModelLoadError, match="does not fit architecture vit_tiny_patch16_224"):
        load_model(str(bogus), arch="vit_tiny_patch16_224", device="cpu")
    with pytest.raises(ModelLoadError, match="needs its architecture"):
        load_model(str(bogus), device="cpu")


def test_a_checkpoint_that_does_not_fit_lists_keys_and_shapes_with_counts(tmp_path):
    state = make_vit().state_dict()
    expected_missing = ["blocks.0.norm1.weight", "blocks.0.norm1.bias", "blocks.0.attn.qkv.weight",
                        "blocks.0.attn.qkv.bias"]
    for key in expected_missing:
        del state[key]
    state["pos_embed"] = torch.zeros(1, 5, 48)
    state["adapter.weight"] = torch.zeros(2)
    path = tmp_path / "changed.pth"
    torch.save({"model": state}, path)
    (tmp_path / "changed.json").write_text(json.dumps({"arch": "vit_tiny_patch16_224", "model_kwargs": TINY}))
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(path), device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert "4 missing keys (blocks.0.norm1.weight, blocks.0.norm1.bias, blocks.0.attn.qkv.weight, ...)" in message
    assert "1 unexpected key (adapter.weight)" in message
    assert "1 shape mismatch (pos_embed: checkpoint [1, 5, 48], model [1, 17, 48])" in message


@pytest.mark.parametrize("name, content", [("notes.pth", b"hello world\n"), ("notes.safetensors", b"hello world\n"),
                                           ("empty.pt", b"")])
def test_a_file_that_is_no_checkpoint_is_named_as_such(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"{name} is neither a PyTorch checkpoint nor a safetensors file"):
        load_model(str(tmp_path / name), arch="vit_tiny_patch16_224", device="cpu")


def test_a_damaged_checkpoint_keeps_the_reader_message(tmp_path):
    path = tmp_path / "cut.pth"
    torch.save(make_vit().state_dict(), path)
    path.write_bytes(path.read_bytes()[:2000])  # a zip cut short
    with pytest.raises(ModelLoadError, match=r"cannot read checkpoint .*cut\.pth: \w+(Error|Exception): \S"):
        load_model(str(path), arch="vit_tiny_patch16_224", device="cpu")


def test_a_mistyped_model_name_suggests_the_most_alike_names_first(tmp_path):
    with pytest.raises(ModelLoadError, match=r"unknown timm architecture 'vit_tiny_patch16_22' \(similar names: "
                                             r"vit_tiny_patch16_224, "):
        load_model("vit_tiny_patch16_22", device="cpu")
    with pytest.raises(ModelLoadError, match=r"\(similar names: swin_tiny_patch4_window7_224, "):
        load_model("swin_tiny", device="cpu")          # a name cut short: what it begins
    with pytest.raises(ModelLoadError, match=r"\(similar names: digits_vit\b"):
        load_model("digits_vt", device="cpu")          # the shipped models are among the names
    weights = tmp_path / "weights.pth"
    torch.save(make_vit().state_dict(), weights)
    with pytest.raises(ModelLoadError, match=r"unknown timm architecture 'vit_base_patch16_244'; similar names: "
                                             r"vit_base_patch16_224, "):
        load_model(str(weights), arch="vit_base_patch16_244", device="cpu")
    from vitexplain.training.recipe import build_model

    with pytest.raises(ValueError, match=r"unknown timm architecture 'vit_smal_patch16_224'; similar names: "
                                         r"vit_small_patch16_224, "):
        build_model("vit_smal_patch16_224")           # vitexplain train --arch


def test_similar_names_rank_by_likeness_not_by_the_alphabet():
    from vitexplain.options import similar_names

    names = ["alpha_224", "vit_base_patch16_224", "vit_tiny_patch16_224", "vit_tiny_patch16_384", "zeta"]
    assert similar_names("vit_tiny_patch16_22", names)[0] == "vit_tiny_patch16_224"
    assert similar_names("VIT_Tiny_Patch16_384", names, n=1) == ["vit_tiny_patch16_384"]   # case is ignored
    assert similar_names("vit_tiny", names, n=2) == ["vit_tiny_patch16_224", "vit_tiny_patch16_384"]
    assert similar_names("resnet50", names) == []


def _safetensors_header_of_garbage(path):
    """A file that starts like a safetensors file (an 8-byte length, then ``{``) and is not one."""
    path.write_bytes((40).to_bytes(8, "little") + b"{not json at all" + bytes(100))


@pytest.mark.parametrize("damage", ["truncated", "garbage header"])
def test_a_damaged_safetensors_checkpoint_is_named_with_a_fix_that_fits(tmp_path, damage):
    from safetensors.torch import save_file

    path = tmp_path / "weights.safetensors"
    if damage == "truncated":
        save_file(make_vit().state_dict(), str(path))
        path.write_bytes(path.read_bytes()[:3000])
    else:
        _safetensors_header_of_garbage(path)
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(path), arch="vit_tiny_patch16_224", device="cpu")
    message = str(caught.value)
    assert "\n" not in message and f"{path}" in message and "check the name" not in message
    assert "it is not a valid safetensors file (cut short or damaged): download or save it again" in message


def test_a_damaged_safetensors_file_in_a_model_folder_is_named(tmp_path):
    import timm

    folder = tmp_path / "saved"
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY)
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    weights = folder / "model.safetensors"
    load_model(str(folder), device="cpu")              # it loads before the damage
    weights.write_bytes(weights.read_bytes()[:3000])
    with pytest.raises(ModelLoadError) as caught:
        load_model(str(folder), device="cpu")
    message = str(caught.value)
    assert "\n" not in message and "check the name" not in message
    assert message.startswith(f"cannot load model '{folder}': {weights} is not a valid safetensors file (")
    assert message.endswith("cut short or damaged; save the model again (save_pretrained) or copy it again")


def test_a_pickled_object_checkpoint_says_to_save_the_state_dict_alone(tmp_path):
    path = tmp_path / "whole.pth"
    torch.save({"model": make_vit().state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(ModelLoadError, match=r"cannot read checkpoint .*whole\.pth: it holds objects besides tensors"
                                             r".*torch\.save\(model\.state_dict\(\), PATH\)$"):
        load_model(str(path), arch="vit_tiny_patch16_224", device="cpu")


def test_devices_this_machine_lacks_are_refused_by_name():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    absent = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=f"device '{absent}'.*CUDA GPU"):
        resolve_device(absent)


def test_data_config_takes_the_size_the_model_was_built_at():
    model = make_vit(img_size=48)
    config = data_config(model)
    assert config["input_size"] == (3, 48, 48)  # timm's own resolution says 224 for this architecture
    assert set(config) >= {"mean", "std", "interpolation", "crop_pct"}
    plain = torch.nn.Linear(3, 2)  # not a timm model: timm's ImageNet defaults
    assert data_config(plain)["input_size"] == (3, 224, 224)


def test_text_models_load_from_their_folder_only(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Hugging Face model in"):
        load_text_model(tmp_path)
