"""Model loading (vitexplain.models): checkpoints, devices, the one data config, text models."""
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
