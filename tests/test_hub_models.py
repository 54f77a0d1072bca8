"""Models loaded the way timm and transformers load them: downloaded from a Hub into the user's cache, read from
the cache alone offline, and one fast line when neither works (vitexplain.models.load_model, ``--offline``).

A local HTTP server stands in for the Hugging Face Hub (tests/hub_server.py), reached through ``HF_ENDPOINT``;
every test has its own empty cache (``HF_HOME`` / ``HF_HUB_CACHE``). The served repositories are built here from
tiny random models: timm's ``test_vit`` (its real architecture, 0.37 M parameters, in timm's Hub format), a
transformers ``ViTForImageClassification`` with an image processor's settings, and a CLIP two-tower model
with its tokenizer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import timm
import torch
from huggingface_hub import constants
from PIL import Image

import vitexplain
from vitexplain.models import TRANSFORMERS_MODELS, ModelLoadError, load_model

from cli import python_env
from hub_server import HubServer, closed_endpoint, silent_endpoint

transformers = pytest.importorskip("transformers")

from test_two_tower import tokenizer as clip_tokenizer  # noqa: E402
from test_two_tower import two_tower  # noqa: E402

TIMM_NAME = "test_vit"                                       # timm's default tag: r160_in1k
TIMM_REPO = timm.models.get_pretrained_cfg(TIMM_NAME).hf_hub_id   # timm/test_vit.r160_in1k
VIT_REPO = "tiny-org/vit-classifier"
CLIP_REPO = "tiny-org/clip"
LABELS = ["cat", "dog", "bird"]
PROCESSOR = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"shortest_edge": 40},
             "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "resample": 3, "do_rescale": True,
             "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.1, 0.2, 0.3],
             "image_std": [0.4, 0.5, 0.6]}
#: huggingface_hub settings a load must leave as they were
CONSTANTS = ("HF_HUB_OFFLINE", "ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE", "HF_HUB_CACHE", "HF_HOME",
             "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")


def _served_weights(folder: Path, transformers_class: type | None = None) -> dict[str, torch.Tensor]:
    """The weights a served folder holds, as a model loaded from it names them (transformers renames the saved
    keys to its current layout on loading)."""
    if transformers_class is None:
        return safetensors.torch.load_file(str(folder / "model.safetensors"))
    return transformers_class.from_pretrained(folder).state_dict()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in Hub, serving the three repositories (their folders: ``hub.folders``)."""
    root = tmp_path_factory.mktemp("served")
    torch.manual_seed(0)
    timm_model = timm.create_model(TIMM_NAME, pretrained=False)
    timm.models.save_for_hf(timm_model, root / "timm", safe_serialization=True)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, intermediate_size=96, num_labels=len(LABELS),
                                    id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    transformers.ViTForImageClassification(config).save_pretrained(root / "vit")
    (root / "vit" / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    clip, tok = two_tower("clip")
    clip.save_pretrained(root / "clip")
    tok.save_pretrained(root / "clip")
    (root / "clip" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32}, "do_center_crop": True,
         "crop_size": {"height": 32, "width": 32}, "resample": 3,
         "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}))
    with HubServer() as server:
        for repo, folder in ((TIMM_REPO, "timm"), (VIT_REPO, "vit"), (CLIP_REPO, "clip")):
            server.add(repo, root / folder)
        server.folders = {"timm": root / "timm", "vit": root / "vit", "clip": root / "clip"}
        yield server


def _point_at(monkeypatch, endpoint: str, home: Path) -> None:
    """Make huggingface_hub (already imported) and any child process use ``endpoint`` and the cache in ``home``:
    the variables, and the constants it read from them at import (restored by monkeypatch)."""
    import huggingface_hub.hf_api
    import transformers.utils.hub

    cache = home / "hub"
    for key, value in {"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache),
                       "TORCH_HOME": str(home / "torch"), "HF_HUB_DISABLE_TELEMETRY": "1",
                       "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_TOKEN_PATH": str(home / "token")}.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_ETAG_TIMEOUT", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {"127.0.0.1"})
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", endpoint)       # the HfApi made at import
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)               # transformers' shared HfApi


@pytest.fixture
def online(hub, monkeypatch, tmp_path):
    """The stand-in Hub as the endpoint and an empty cache; yields the server (its requests cleared)."""
    _point_at(monkeypatch, hub.url, tmp_path / "hf")
    hub.requests.clear()
    yield hub


def _settings() -> tuple[dict, dict]:
    return dict(os.environ), {name: getattr(constants, name) for name in CONSTANTS}


def _load(name, **options):
    """load_model on the CPU, checking it leaves the environment and huggingface_hub's settings as they were,
    also when it fails."""
    before = _settings()
    try:
        return load_model(name, device="cpu", **options)
    finally:
        assert _settings() == before


def _fails(name, **options) -> tuple[str, float]:
    """(the ModelLoadError's message, seconds until it came)."""
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as caught:
        _load(name, **options)
    return str(caught.value), time.perf_counter() - start


def _assert_weights(model: torch.nn.Module, served: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert served and set(served) <= set(state)
    for key, value in served.items():
        assert torch.equal(state[key], value), key


def test_a_timm_name_downloads_into_the_cache_then_loads_offline(online, monkeypatch):
    served = _served_weights(online.folders["timm"])
    model, config = _load(TIMM_NAME)
    assert type(model).__name__ == "VisionTransformer" and not model.training
    _assert_weights(model, served)
    assert f"/{TIMM_REPO}/resolve/main/model.safetensors" in online.paths("GET")
    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{TIMM_REPO.replace('/', '--')}" / "snapshots"
    assert [path.name for path in snapshots.glob("*/*")] == ["model.safetensors"]
    assert config["input_size"] == (3, 160, 160) and config["mean"] == (0.5, 0.5, 0.5)
    # from the cache alone: HF_HUB_OFFLINE, offline=True, and a Hub that does not answer
    online.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _assert_weights(_load(TIMM_NAME)[0], served)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    _assert_weights(_load(TIMM_NAME, offline=True)[0], served)
    assert online.requests == []
    _point_at(monkeypatch, closed_endpoint(), Path(constants.HF_HOME))
    _assert_weights(_load(TIMM_NAME)[0], served)


def test_a_timm_hub_repository_loads_through_timm_with_or_without_the_prefix(online):
    served = _served_weights(online.folders["timm"])
    for name in (f"hf-hub:{TIMM_REPO}", TIMM_REPO):  # the plain id: its config.json is timm's
        model, config = _load(name)
        assert type(model).__name__ == "VisionTransformer"
        _assert_weights(model, served)
        assert config["input_size"] == (3, 160, 160) and config["crop_pct"] == 0.95


def test_a_transformers_classifier_downloads_with_its_processors_preprocessing(online):
    model, config = _load(VIT_REPO)
    assert type(model) is transformers.ViTForImageClassification and not model.training
    _assert_weights(model, _served_weights(online.folders["vit"], transformers.ViTForImageClassification))
    assert config == {"input_size": (3, 32, 32), "mean": (0.1, 0.2, 0.3), "std": (0.4, 0.5, 0.6),
                      "interpolation": "bicubic", "crop_pct": 0.8, "crop_mode": "center", "class_names": LABELS}
    maps = vitexplain.explain(model, torch.randn(2, 3, 32, 32), "gae")
    assert maps.shape == (2, 4, 4) and torch.isfinite(maps).all()
    same, again = _load(VIT_REPO, offline=True)                  # the same from the cache
    assert again == config
    _assert_weights(same, _served_weights(online.folders["vit"], transformers.ViTForImageClassification))


def test_a_two_tower_hub_model_loads_with_its_tokenizer(online):
    model, config = _load(CLIP_REPO)
    assert type(model) is transformers.CLIPModel and config["two_tower"] is True
    assert config["input_size"] == (3, 32, 32) and config["crop_mode"] == "center"
    assert config["mean"] == (0.48145466, 0.4578275, 0.40821073)
    _assert_weights(model, _served_weights(online.folders["clip"], transformers.CLIPModel))
    # the tokenizer was fetched beside the weights, so texts are targets as for a local folder
    expected = vitexplain.text_embeddings(model, ["a dog"], clip_tokenizer())
    torch.testing.assert_close(vitexplain.text_embeddings(model, ["a dog"]), expected)


@pytest.mark.parametrize("name", [TIMM_NAME, f"hf-hub:{TIMM_REPO}", VIT_REPO])
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_offline_on_an_empty_cache_is_one_fast_line_saying_how_to_fetch(online, monkeypatch, name, how):
    if how == "environment":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message, seconds = _fails(name, **({"offline": True} if how == "argument" else {}))
    assert "\n" not in message and f"cannot load model {name!r}" in message
    assert "offline mode is on" in message
    assert f"not (completely) in the local cache {constants.HF_HUB_CACHE}" in message
    fetch = f"timm.create_model(\"{TIMM_NAME}\", pretrained=True)" if name == TIMM_NAME else "hf download "
    assert "pre-fetch it on a machine with network" in message and fetch in message, message
    if name == TIMM_NAME:
        assert "--model PATH --arch test_vit" in message
    assert seconds < 5 and online.requests == []


def test_an_unreachable_hub_fails_in_one_line_well_within_30_s(online, monkeypatch):
    refused = closed_endpoint()
    _point_at(monkeypatch, refused, Path(constants.HF_HOME))
    for name in (TIMM_NAME, VIT_REPO):
        message, seconds = _fails(name)
        assert "\n" not in message and f"cannot load model {name!r}" in message
        assert f"cannot reach the Hub at {refused} (ConnectError" in message and "not (completely) in the local cache" \
            in message and "pre-fetch it" in message, message
        assert seconds < 5, seconds      # huggingface_hub alone retries for ~25 s per file here
    # a Hub that takes the connection and never answers: the metadata timeout (HF_HUB_ETAG_TIMEOUT), one try
    with silent_endpoint() as stalled:
        _point_at(monkeypatch, stalled, Path(constants.HF_HOME))
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
        message, seconds = _fails(VIT_REPO)
    assert f"cannot reach the Hub at {stalled} (ReadTimeout" in message, message
    assert 2 <= seconds < 6, seconds


def test_missing_repositories_files_and_architectures_are_named(online, tmp_path):
    message, seconds = _fails("tiny-org/no-such-model")
    assert message.startswith("cannot load model 'tiny-org/no-such-model': no repository tiny-org/no-such-model on "
                              f"{online.url}") and "check the name" in message and seconds < 5
    message, _ = _fails(f"{VIT_REPO}@v9")
    assert f"{VIT_REPO} has no revision 'v9'" in message
    folder = tmp_path / "mae"
    folder.mkdir()
    mae = {"architectures": ["ViTMAEForPreTraining"], "model_type": "vit_mae"}
    (folder / "config.json").write_text(json.dumps(mae))
    online.add("tiny-org/mae", folder)
    for name in ("tiny-org/mae", str(folder)):
        message, _ = _fails(name)
        assert "holds a ViTMAEForPreTraining" in message and "an architecture vitexplain does not load" in message
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text((online.folders["vit"] / "config.json").read_text())
    online.add("tiny-org/weightless", weightless)
    message, _ = _fails("tiny-org/weightless")
    assert "\n" not in message and "model.safetensors" in message, message
    message, _ = _fails("test_vit.no_such_tag")
    assert "timm has no pretrained tag 'no_such_tag' for test_vit (its tags: r160_in1k)" in message
    assert "--model PATH --arch test_vit" in message


def test_a_damaged_weights_file_on_the_hub_is_named_with_the_command_that_fetches_it_again(online, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in online.folders["vit"].iterdir():
        data = file.read_bytes()
        (broken / file.name).write_bytes(data[:len(data) // 2] if file.name == "model.safetensors" else data)
    online.add("tiny-org/broken", broken)
    message, _ = _fails("tiny-org/broken")
    cached = next((Path(constants.HF_HUB_CACHE) / "models--tiny-org--broken" / "snapshots").glob("*/model.safetensors"))
    assert "\n" not in message and "check the name" not in message
    assert message.startswith(f"cannot load model 'tiny-org/broken': {cached} is not a valid safetensors file (")
    assert message.endswith("cut short or damaged; download it again: hf download tiny-org/broken --force-download")


def test_a_local_folder_of_any_served_class_loads_without_the_network(online, tmp_path):
    folder = tmp_path / "dino"
    config = transformers.Dinov2Config(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=1,
                                       num_attention_heads=3, intermediate_size=96)
    transformers.Dinov2Model(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}, "do_center_crop": True}))
    model, config = _load(str(folder))
    assert type(model) is transformers.Dinov2Model and "two_tower" not in config and "class_names" not in config
    assert config["input_size"] == (3, 32, 32) and config["crop_pct"] == pytest.approx(32 / 36)
    assert config["mean"] == (0.485, 0.456, 0.406) and config["interpolation"] == "bicubic"   # DINOv2's defaults
    assert online.requests == []


def test_the_transformers_models_loaded_are_those_the_families_explain():
    from vitexplain.instrumentation.families import hf_dinov2, hf_two_tower, hf_vit
    from vitexplain.instrumentation.families.base import loaded_classes

    explained = loaded_classes((*hf_vit.CLASSIFIERS, *hf_vit.ENCODERS, *hf_dinov2.SERVED, *hf_two_tower.SERVED))
    assert set(TRANSFORMERS_MODELS) == {cls.__name__ for cls in explained}


def test_a_hub_id_works_in_a_bench_models_entry(online):
    from vitexplain.bench.config import ModelEntry
    from vitexplain.bench.runner import _load_model

    model, config = _load_model(ModelEntry("vit", VIT_REPO), torch.device("cpu"))
    assert type(model) is transformers.ViTForImageClassification and config["class_names"] == LABELS


def test_bench_offline_reads_the_cache_only(online, tmp_path, capsys):
    from vitexplain.cli.main import main

    before = _settings()
    code = main(["bench", "--model", VIT_REPO, "--offline", "--method", "random_baseline", "--metric", "sparseness",
                 "--dataset", "digits", "--limit", "2", "--device", "cpu", "--no-progress", "-o", str(tmp_path / "b")])
    assert _settings() == before
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(errors) == 1 and "offline mode is on" in errors[0] and online.requests == []


def test_the_cli_downloads_then_refuses_offline_on_an_empty_cache_in_one_line(online, tmp_path):
    picture = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(picture)
    explain = [sys.executable, "-m", "vitexplain.cli.main", "explain", str(picture), "--model", TIMM_NAME,
               "--method", "gae", "--device", "cpu", "--no-progress"]
    downloading = subprocess.Popen([*explain, "-o", str(tmp_path / "out")], env=python_env(), cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    empty = {**python_env(), "HF_HOME": str(tmp_path / "empty"), "HF_HUB_CACHE": str(tmp_path / "empty" / "hub")}
    refused = subprocess.run([*explain, "--offline", "-o", str(tmp_path / "never")], env=empty, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    out, err = downloading.communicate(timeout=120)
    assert downloading.returncode == 0, err
    saved = np.load(tmp_path / "out" / "photo.gae.npy")
    assert saved.shape == (10, 10) and np.isfinite(saved).all() and (tmp_path / "out" / "photo.gae.png").is_file()
    assert any(path.name == "model.safetensors" for path in (tmp_path / "hf" / "hub").rglob("*"))
    assert refused.returncode == 2 and not (tmp_path / "never").exists()
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot load model '{TIMM_NAME}': offline mode is on"), \
        refused.stderr
