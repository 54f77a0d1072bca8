"""Loading the models users explain: timm names (local weight cache), checkpoints, shipped models,
local Hugging Face text classifiers and two-tower models (CLIP, SigLIP); and the one place a model's
preprocessing is resolved.

Nothing here downloads at import time. ``load_model`` never reaches the network either: timm's
pretrained weights are read from the local Hugging Face / torch cache only, and a missing file gets
a one-line error that says how to supply it.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ASSETS = Path(__file__).parent / "assets" / "models"


class ModelLoadError(RuntimeError):
    """A model could not be built or its weights could not be found."""


@dataclass(frozen=True)
class ShippedModel:
    """A model trained by the project and committed with its model card."""

    name: str
    arch: str
    weights: Path
    config: dict
    class_names: list[str]


def shipped_models() -> dict[str, ShippedModel]:
    """Models that ship inside the package (``vitexplain/assets/models/<name>.json`` + ``.safetensors``)."""
    found = {}
    for card in sorted(ASSETS.glob("*.json")):
        meta = read_card(card.with_suffix(".safetensors"))
        found[card.stem] = ShippedModel(card.stem, meta["arch"], card.with_suffix(".safetensors"),
                                        meta.get("model_kwargs", {}), meta.get("class_names", []))
    return found


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Make huggingface_hub use its local cache only, so a missing file fails at once instead of retrying.

    huggingface_hub reads ``HF_HUB_OFFLINE`` once, at import, so both the environment (for code that
    reads it later) and the already-imported constant are switched, and both are restored on exit.
    """
    saved_env = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - timm depends on huggingface_hub
        constants = None
    saved_constant = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if constants is not None:
            constants.HF_HUB_OFFLINE = saved_constant
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _checkpoint_format(path: Path) -> str:
    """``"torch"`` (zip or pickle) or ``"safetensors"``, from the file's first bytes, whatever its suffix."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    if head.startswith((b"PK\x03\x04", b"\x80")):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":  # 8-byte header length, then the JSON header
        return "safetensors"
    raise ModelLoadError(f"checkpoint {path} is neither a PyTorch checkpoint nor a safetensors file "
                         f"(it starts with {head[:8]!r})")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a ``.safetensors`` file or a torch checkpoint (plain or wrapped in
    ``model``/``state_dict``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"checkpoint {path} does not exist")
    try:
        if _checkpoint_format(path) == "safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - any reader error means an unreadable checkpoint
        detail = " ".join(str(error).split())[:300]
        raise ModelLoadError(f"cannot read checkpoint {path}: {type(error).__name__}: {detail}") from error
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ModelLoadError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    return {key.removeprefix("module."): value for key, value in state.items()}


def _some(items: list[str], one: str, many: str, shown: int = 3) -> str:
    """``"2 missing keys (a, b)"``: a count and the first ``shown`` items."""
    listed = ", ".join(items[:shown]) + (", ..." if len(items) > shown else "")
    return f"{len(items)} {one if len(items) == 1 else many} ({listed})"


def state_dict_mismatch(model: nn.Module, state: dict[str, torch.Tensor]) -> str:
    """What keeps ``state`` from loading into ``model``: missing / unexpected keys and shape mismatches,
    each a count and a few names (empty when it fits)."""
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    shapes = [f"{key}: checkpoint {list(state[key].shape)}, model {list(value.shape)}"
              for key, value in expected.items() if key in state and state[key].shape != value.shape]
    parts = [_some(missing, "missing key", "missing keys") if missing else "",
             _some(unexpected, "unexpected key", "unexpected keys") if unexpected else "",
             _some(shapes, "shape mismatch", "shape mismatches") if shapes else ""]
    return "; ".join(part for part in parts if part)


def read_card(checkpoint: Path) -> dict:
    """The model card beside a checkpoint (same name, ``.json``): ``arch``, ``model_kwargs``, ``class_names``."""
    card = checkpoint.with_suffix(".json")
    if not card.is_file():
        return {}
    try:
        return json.loads(card.read_text())
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"model card {card} is not valid JSON: {error}") from error


def _create(arch: str, **kwargs) -> nn.Module:
    import timm

    if not timm.is_model(arch):
        close = timm.list_models(f"*{arch.split('_')[0]}*")[:8]
        hint = f"; similar names: {', '.join(close)}" if close else ""
        raise ModelLoadError(f"unknown timm architecture {arch!r}{hint}")
    return timm.create_model(arch, **kwargs)


def _from_checkpoint(path: Path, arch: str | None, **kwargs) -> nn.Module:
    if arch is None:
        raise ModelLoadError(f"loading checkpoint {path} needs its architecture name "
                             "(e.g. --arch vit_base_patch16_224)")
    state = read_state_dict(path)
    head = state.get("head.weight")
    if head is not None:
        kwargs.setdefault("num_classes", head.shape[0])
    model = _create(arch, pretrained=False, **kwargs)
    mismatch = state_dict_mismatch(model, state)
    if mismatch:
        raise ModelLoadError(f"checkpoint {path} does not fit architecture {arch}: {mismatch}")
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        reason = " ".join(str(error).split())
        raise ModelLoadError(f"checkpoint {path} does not fit architecture {arch}: {reason}") from error
    return model


def _pretrained(name: str) -> nn.Module:
    try:
        with _offline():
            return _create(name, pretrained=True)
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - timm / hub raise many kinds of errors for a missing file
        raise ModelLoadError(
            f"pretrained weights for {name!r} are not in the local cache and cannot be downloaded here "
            f"({type(error).__name__}); run timm.create_model({name!r}, pretrained=True) once on a machine "
            f"with network and copy ~/.cache/huggingface to this one, or pass a checkpoint file: "
            f"--model PATH --arch {name}") from error


def load_model(name_or_path: str, arch: str | None = None,
               device: str | torch.device | None = None) -> tuple[nn.Module, dict]:
    """Build a model in eval mode and its preprocessing config.

    Args:
        name_or_path: a shipped model's short name (see :func:`shipped_models`), a checkpoint file
            (timm state dict, ``.pth``/``.pt``/``.bin`` or ``.safetensors``), a timm model name
            whose pretrained weights are in the local cache, or a local transformers folder of a
            two-tower model (:func:`load_two_tower_folder`).
        arch: the timm architecture of a checkpoint file. May be omitted when a model card
            (``<checkpoint>.json`` with ``arch`` and optional ``model_kwargs``, ``class_names``) lies beside it.
        device: where to put the model (default: CUDA when available, else CPU); one this machine
            lacks raises a ValueError.

    Returns:
        (model, config): the config is :func:`data_config`, with ``class_names`` when known.
    """
    device = resolve_device(device)
    shipped = shipped_models()
    class_names = None
    if name_or_path in shipped:
        entry = shipped[name_or_path]
        model = _from_checkpoint(entry.weights, entry.arch, **entry.config)
        class_names = entry.class_names
    elif (Path(name_or_path) / "config.json").is_file():
        model, config = load_two_tower_folder(Path(name_or_path))
        return model.to(device).eval(), config
    elif Path(name_or_path).exists() or Path(name_or_path).suffix in (".safetensors", ".pth", ".pt", ".bin"):
        path = Path(name_or_path)
        card = read_card(path)
        model = _from_checkpoint(path, arch or card.get("arch"), **card.get("model_kwargs", {}))
        class_names = card.get("class_names")
    else:
        model = _pretrained(name_or_path)
    model = model.to(device).eval()
    config = data_config(model)
    if class_names:
        config["class_names"] = class_names
    return model, config


#: the transformers two-tower models a local folder may hold, and their image processors' defaults
#: (mean, std, crop, PIL resampling code)
TWO_TOWER_DEFAULTS = {
    "CLIPModel": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), "center", 3),
    "SiglipModel": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "squash", 2),
}
#: PIL resampling codes (as processors save them) -> timm's interpolation names
RESAMPLING = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


def load_two_tower_folder(folder: Path) -> tuple[nn.Module, dict]:
    """A CLIP or SigLIP two-tower model saved by transformers' ``save_pretrained`` (config.json, weights and,
    for text targets, its tokenizer), and its preprocessing: the image size of its vision tower, the mean,
    std and resampling of ``preprocessor_config.json`` when the folder has one (else the processor's
    defaults), CLIP's processor resizing the short side and cropping the centre, SigLIP's resizing to the
    square without a crop. Never downloads."""
    try:
        import transformers
    except ImportError:
        raise ModelLoadError("a transformers model folder needs transformers: pip install 'vitexplain[hf]'") from None
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as error:
        reason = " ".join(str(error).split())[:200]
        raise ModelLoadError(f"cannot read the transformers config in {folder}: {reason}") from None
    architecture = (getattr(config, "architectures", None) or ["?"])[0]
    if architecture not in TWO_TOWER_DEFAULTS:
        raise ModelLoadError(f"{folder} holds a {architecture}; a transformers folder is read for the two-tower "
                             f"models explained with --text ({', '.join(TWO_TOWER_DEFAULTS)})")
    try:
        model = getattr(transformers, architecture).from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise ModelLoadError(f"cannot load the {architecture} in {folder}: {reason}") from None
    mean, std, crop_mode, resample = TWO_TOWER_DEFAULTS[architecture]
    processor = folder / "preprocessor_config.json"
    saved = json.loads(processor.read_text()) if processor.is_file() else {}
    size = config.vision_config.image_size
    return model, {"input_size": (3, size, size), "mean": tuple(saved.get("image_mean", mean)),
                   "std": tuple(saved.get("image_std", std)),
                   "interpolation": RESAMPLING.get(saved.get("resample", resample), "bicubic"),
                   "crop_pct": 1.0, "crop_mode": crop_mode, "two_tower": True}


def data_config(model: nn.Module) -> dict:
    """The preprocessing of a model: timm's data config (``input_size``, ``mean``, ``std``,
    ``interpolation``, ``crop_pct``, ``crop_mode``), its size the one the model was built at.

    timm resolves the config from the pretrained weights' card; a checkpoint built at another size
    (``img_size=112``) keeps the card's 224, so the size is read from the patch embedding instead.
    A model without a card (not from timm) gets timm's ImageNet defaults.
    """
    from timm.data import resolve_data_config

    config = dict(resolve_data_config(model=model))
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "img_size", None):
        config["input_size"] = (config["input_size"][0], *embed.img_size)
    return config


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a :class:`torch.device` this machine has; the one place every command and the API check a device.

    None means CUDA when available, else the CPU. A CUDA device always comes back with its index:
    ``torch.cuda.set_device`` refuses a plain ``cuda``, and two processes of one ``torchrun`` must
    not share a GPU. So a plain ``cuda`` becomes ``cuda:LOCAL_RANK`` when the launcher sets
    ``LOCAL_RANK`` (torchrun does), else the current CUDA device; an explicit index is kept.
    No CUDA, an index the machine lacks or an unknown name raises a one-line ValueError naming it.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {str(device)!r}: expected cpu, cuda, cuda:N, mps ...") from None
    if resolved.type == "cuda":
        resolved = _indexed_cuda(resolved, str(device))
    try:
        torch.empty(0, device=resolved)
    except Exception as error:  # noqa: BLE001 - each backend fails in its own way (RuntimeError, AssertionError ...)
        raise ValueError(f"device {str(device)!r} is not available here ({str(error).splitlines()[0]})") from None
    return resolved


def _indexed_cuda(device: torch.device, given: str) -> torch.device:
    """``device`` (a CUDA one) with its index: the given one, else ``LOCAL_RANK``'s, else the current device's."""
    if not torch.cuda.is_available():
        raise ValueError(f"device {given!r}: no CUDA GPU is available on this machine")
    rank_note = ""
    index = device.index
    if index is None and "LOCAL_RANK" in os.environ:
        rank_note = f" (cuda:{os.environ['LOCAL_RANK']} from LOCAL_RANK)"
        try:
            index = int(os.environ["LOCAL_RANK"])
        except ValueError:
            raise ValueError(f"device {given!r}: LOCAL_RANK must be a GPU index, "
                             f"got {os.environ['LOCAL_RANK']!r}") from None
    if index is None:
        index = torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device {given!r}{rank_note}: this machine has {count} CUDA GPU(s), "
                         f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def load_text_model(directory: str | Path):
    """(tokenizer, model in eval mode) from a local Hugging Face model directory; never downloads."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"no Hugging Face model in {directory} (expected config.json and the weights, "
                                "as save_pretrained writes them)")
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError:
        raise ImportError("explaining text needs transformers: pip install 'vitexplain[hf]'") from None
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(directory), local_files_only=True)
    return tokenizer, model.eval()


def class_names_for(model: nn.Module, config: dict) -> list[str]:
    """Readable class names: the shipped model's, ImageNet's for 1000-class models, else the indices."""
    if config.get("class_names"):
        return list(config["class_names"])
    num_classes = getattr(model, "num_classes", 0)
    if num_classes in (1000, 1001):
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(num_classes)]
    return [str(i) for i in range(num_classes)]
