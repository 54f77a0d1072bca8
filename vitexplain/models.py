"""Loading the models users explain, and the one place a model's preprocessing is resolved.

:func:`load_model` takes a shipped model, a checkpoint file, a timm name (with its pretrained tag, if any),
timm's ``hf-hub:ORG/NAME``, the Hugging Face Hub id of a transformers model vitexplain explains
(ViT / DeiT / DINOv2 classifiers and encoders, CLIP / SigLIP) or a local folder of either. Pretrained
weights come the way timm and transformers fetch them: downloaded when the network is there, into
their usual caches (huggingface_hub's, which honours HF_HOME / HF_HUB_CACHE / HF_ENDPOINT; torch hub's
for the few timm weights that only have a URL); ``HF_HUB_OFFLINE=1`` or ``offline=True`` reads those
caches only. Nothing is downloaded at import time.

Why one probe before a Hub load: huggingface_hub retries an unreachable Hub with back-off, about 25 s
per file on a refused connection and minutes on a stalled one. So one HEAD request, without retries
and within HF_HUB_ETAG_TIMEOUT, first asks whether the Hub answers; when it does not, the load reads
the cache only. Whatever still fails becomes one ModelLoadError line: the model, the reason, the fix.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .devices import resolve_device
from .options import similar_names

ASSETS = Path(__file__).parent / "assets" / "models"
CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
#: the prefix timm gives a Hub repository in its own format
TIMM_HUB = "hf-hub:"


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


def _checkpoint_format(path: Path) -> str:
    """``"torch"`` (zip or pickle) or ``"safetensors"``, from the file's first bytes, whatever its suffix."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    if head.startswith((b"PK\x03\x04", b"\x80")):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":  # 8-byte header length, then the JSON header
        return "safetensors"
    raise ModelLoadError(f"checkpoint {path} is neither a PyTorch checkpoint nor a safetensors file "
                         f"(it starts with {head[:8]!r}); give a state dict saved by torch.save or "
                         "safetensors.torch.save_file")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a ``.safetensors`` file or a torch checkpoint (plain or wrapped in
    ``model``/``state_dict``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"checkpoint {path} does not exist")
    safetensors = _checkpoint_format(path) == "safetensors"
    try:
        if safetensors:
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any reader error means an unreadable checkpoint
        detail = " ".join(str(error).split())[:300]
        if str(error).startswith("Weights only load failed"):  # a whole pickled object, not tensors alone
            raise ModelLoadError(f"cannot read checkpoint {path}: it holds objects besides tensors, which "
                                 "torch.load(weights_only=True) refuses; save the state dict alone: "
                                 "torch.save(model.state_dict(), PATH)") from error
        kind = "safetensors file" if safetensors else "PyTorch checkpoint"
        raise ModelLoadError(f"cannot read checkpoint {path}: {type(error).__name__}: {detail}; it is not a valid "
                             f"{kind} (cut short or damaged): download or save it again") from error
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
        close = similar_names(arch, timm.list_models())
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


def load_model(name_or_path: str, arch: str | None = None, device: str | torch.device | None = None,
               offline: bool | None = None) -> tuple[nn.Module, dict]:
    """Build a model in eval mode and its preprocessing config.

    Args:
        name_or_path: one of, in this order of precedence:

            - a shipped model's short name (see :func:`shipped_models`);
            - ``hf-hub:ORG/NAME[@REVISION]``: a Hub repository in timm's format, built by timm;
            - a local folder: a transformers model saved by ``save_pretrained`` (one of
              :data:`TRANSFORMERS_MODELS`) or a timm one (``config.json`` with ``architecture``);
            - a checkpoint file (timm state dict, ``.pth``/``.pt``/``.bin`` or ``.safetensors``), with ``arch``;
            - a timm model name with an optional pretrained tag (``vit_base_patch16_224.augreg_in21k``):
              its pretrained weights;
            - a Hub id ``ORG/NAME[@REVISION]``: a transformers model (``google/vit-base-patch16-224``), or a
              timm one when its ``config.json`` is timm's (``"architecture"``, no ``"architectures"``).
        arch: the timm architecture of a checkpoint file. May be omitted when a model card
            (``<checkpoint>.json`` with ``arch`` and optional ``model_kwargs``, ``class_names``) lies beside it.
        device: where to put the model (default: CUDA when available, else CPU); one this machine
            lacks raises a ValueError.
        offline: True reads pretrained weights from the local caches only; False may download even when
            ``HF_HUB_OFFLINE`` is set; None (default) follows ``HF_HUB_OFFLINE``. Weights are downloaded
            into huggingface_hub's cache (``HF_HOME`` / ``HF_HUB_CACHE``, from ``HF_ENDPOINT``).

    Returns:
        (model, config): the config has :func:`data_config`'s keys (``input_size``, ``mean``, ``std``,
        ``interpolation``, ``crop_pct``, ``crop_mode``), with ``class_names`` when known and
        ``two_tower: True`` for CLIP / SigLIP models with their text tower.

    Raises:
        ModelLoadError: one line naming the model, why it cannot be loaded (no network, not in the cache
            while offline, no such repository or file, an architecture vitexplain does not load) and how
            to fix it. The environment and huggingface_hub's settings are left as they were.
    """
    device = resolve_device(device)
    name = str(name_or_path)
    path = Path(name)
    shipped = shipped_models()
    if name in shipped:
        entry = shipped[name]
        model = _from_checkpoint(entry.weights, entry.arch, **entry.config)
        config = data_config(model)
        if entry.class_names:
            config["class_names"] = entry.class_names
    elif name.startswith(TIMM_HUB):
        model = _timm_from_hub(name, offline)
        config = data_config(model)
    elif path.is_dir():
        model, config = _from_repository(_Repository.folder_of(path, name), offline)
    elif path.exists() or path.suffix in CHECKPOINT_SUFFIXES:
        card = read_card(path)
        model = _from_checkpoint(path, arch or card.get("arch"), **card.get("model_kwargs", {}))
        config = data_config(model)
        if card.get("class_names"):
            config["class_names"] = card["class_names"]
    elif _is_timm_name(name):
        model = _timm_pretrained(name, offline)
        config = data_config(model)
    elif HUB_ID.fullmatch(name):
        model, config = _from_repository(_Repository.hub(name), offline)
    else:
        raise ModelLoadError(_unknown_name(name))
    return model.to(device).eval(), config


# ---------------------------------------------------------------------------------------- the Hub

#: a Hub model id, ``ORG/NAME`` with an optional ``@REVISION``
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_])(?:@(?P<revision>[\w./-]+))?")
_TRUE = {"1", "ON", "YES", "TRUE"}


def _hub_constants():
    from huggingface_hub import constants

    return constants


def _offline_by_environment() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) asks for the cache only, read now
    (huggingface_hub reads it once, at import: a variable set later still counts here)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value is None:
        return bool(_hub_constants().HF_HUB_OFFLINE)
    return value.strip().upper() in _TRUE


@contextlib.contextmanager
def _hub_mode(offline: bool) -> Iterator[None]:
    """Make huggingface_hub (and so timm and transformers) use the local cache only, or allow the network.

    huggingface_hub reads ``HF_HUB_OFFLINE`` once, at import, so both the environment (for code that
    reads it later) and the already-imported constant are switched; both are restored on exit, also
    after an exception.
    """
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved_env = {key: os.environ.get(key) for key in keys}
    constants = _hub_constants()
    saved_constant = constants.HF_HUB_OFFLINE
    try:
        os.environ.update(dict.fromkeys(keys, "1" if offline else "0"))
        constants.HF_HUB_OFFLINE = offline
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved_constant
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _etag_timeout() -> float:
    """huggingface_hub's metadata timeout: ``HF_HUB_ETAG_TIMEOUT`` read now, else the value it read at import."""
    try:
        return float(os.environ["HF_HUB_ETAG_TIMEOUT"])
    except (KeyError, ValueError):
        return float(_hub_constants().HF_HUB_ETAG_TIMEOUT)


def _one_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling (libraries wrap the Hub's errors)."""
    seen: list[BaseException] = []
    while error is not None and all(error is not other for other in seen):
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _is_network_error(error: BaseException) -> bool:
    import urllib.error

    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(error, (HfHubHTTPError, OfflineModeIsEnabled)):
        return False
    return (isinstance(error, (ConnectionError, TimeoutError, urllib.error.URLError))
            or type(error).__module__.split(".")[0] in ("httpx", "httpx2", "requests", "urllib3"))


def _unanswered(repo: str, revision: str | None) -> str | None:
    """None when the Hub answers about ``repo`` (one HEAD of its config.json, no retries, within the metadata
    timeout), else why not: unreachable, an error status, no such repository or revision."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = _hub_constants().ENDPOINT
    try:
        get_hf_file_metadata(hf_hub_url(repo, "config.json", revision=revision), timeout=_etag_timeout())
    except (EntryNotFoundError, GatedRepoError):  # the Hub answered; the load says what is missing or locked
        return None
    except RepositoryNotFoundError:
        return f"no repository {repo} on {endpoint} (a private one needs a login: hf auth login)"
    except RevisionNotFoundError:
        return f"{repo} has no revision {revision!r} on {endpoint}"
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", "?")
        return f"the Hub at {endpoint} answered HTTP {status}"
    except Exception as error:  # noqa: BLE001 - connection refused, timeouts, DNS, proxies, TLS ...
        return f"cannot reach the Hub at {endpoint} ({type(error).__name__}: {_one_line(error, 120)})"
    return None


def _fetch_fix(command: str, fallback: str) -> str:
    cache = _hub_constants().HF_HUB_CACHE
    return (f"pre-fetch it on a machine with network ({command}) and copy the cache folder {cache} here, "
            f"or {fallback}")


def _failure(error: BaseException, repo: str | None, revision: str | None, reason: str | None,
             fix: str) -> tuple[str, str]:
    """(why a load failed, how to fix it) from the error chain and the reason the load was offline, if it was."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from safetensors import SafetensorError

    constants = _hub_constants()
    chain = _chain(error)
    check_name = "check the name: a shipped model, a timm name, a Hub id ORG/NAME, a folder or a checkpoint file"

    def found(kind):
        return next((item for item in chain if isinstance(item, kind)), None)

    if found(GatedRepoError):
        return (f"{repo} is a gated repository", "accept its conditions on its Hub page, then log in: hf auth login")
    if found(RepositoryNotFoundError):
        return (f"no repository {repo} on {constants.ENDPOINT}",
                check_name + " (a private repository needs hf auth login)")
    if found(RevisionNotFoundError):
        return f"{repo} has no revision {revision!r} on {constants.ENDPOINT}", check_name
    missing = found(RemoteEntryNotFoundError)
    if missing is not None:
        url = str(getattr(getattr(missing, "response", None), "url", "") or "")
        return f"{repo} has no file {url.rsplit('/', 1)[-1] or '(unknown)'} on {constants.ENDPOINT}", check_name
    # a cache read that found nothing (transformers says so in a plain OSError of its own)
    cache_miss = found((EntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError)) or isinstance(error, OSError)
    if reason is not None and cache_miss:
        if reason.startswith("no repository") or " has no revision " in reason:
            return f"{reason}, and it is not in the local cache {constants.HF_HUB_CACHE}", check_name
        return f"{reason}, and it is not (completely) in the local cache {constants.HF_HUB_CACHE}", fix
    if found(OfflineModeIsEnabled) or any(_is_network_error(item) for item in chain):
        return f"the download from {constants.ENDPOINT} failed ({_one_line(error, 160)})", fix
    damaged = found(SafetensorError)
    if damaged is not None:
        file = _unreadable_safetensors(damaged)
        again = (f"download it again: hf download {repo}{f' --revision {revision}' if revision else ''} "
                 "--force-download" if repo else "save the model again (save_pretrained) or copy it again")
        return (f"{file or 'its weights file'} is not a valid safetensors file ({_one_line(damaged).rstrip('.')}): "
                "cut short or damaged", again)
    return f"{type(error).__name__}: {_one_line(error).rstrip('.')}", check_name


def _unreadable_safetensors(error: BaseException) -> Path | None:
    """The ``.safetensors`` file that ``error`` (a SafetensorError) was raised on: found among the variables
    of the frames it passed through, innermost first, and confirmed unreadable; None when none is."""
    from safetensors import safe_open

    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        for value in frame.f_locals.values():
            if isinstance(value, (str, os.PathLike)) and str(value).endswith(".safetensors") and Path(value).is_file():
                try:
                    with safe_open(str(value), framework="pt"):
                        pass
                except Exception:  # noqa: BLE001 - this file cannot be read: the one
                    return Path(value)
    return None


@contextlib.contextmanager
def _fetching(name: str, repo: str | None, revision: str | None, offline: bool | None, fix: str) -> Iterator[bool]:
    """The scope of one load that may download: decides whether it is offline (``offline``, else the environment;
    a Hub that does not answer ``repo`` makes it offline too), switches huggingface_hub to that mode, and turns
    any failure into one ModelLoadError line naming ``name``. Yields whether the load is offline."""
    offline = _offline_by_environment() if offline is None else bool(offline)
    reason = "offline mode is on (--offline / HF_HUB_OFFLINE=1)" if offline else None
    if not offline and repo is not None:
        reason = _unanswered(repo, revision)
        offline = reason is not None
    try:
        with _hub_mode(offline):
            yield offline
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - timm, transformers and the Hub raise many kinds of errors
        why, how = _failure(error, repo, revision, reason, fix)
        raise ModelLoadError(f"cannot load model {name!r}: {why}; {how}") from error


# ------------------------------------------------------------------------------------------ timm

def _is_timm_name(name: str) -> bool:
    if "/" in name or "\\" in name or ":" in name:
        return False
    import timm

    return timm.is_model(name.partition(".")[0])


def _unknown_name(name: str) -> str:
    import timm

    forms = (f"--model takes a shipped model ({', '.join(shipped_models())}), a timm name, hf-hub:ORG/NAME, a Hugging "
             "Face Hub id ORG/NAME, a local folder or a checkpoint file (with --arch)")
    if "/" in name or "\\" in name:
        return f"cannot load model {name!r}: no such file or folder, and not a Hub id ORG/NAME; {forms}"
    close = similar_names(name.partition(".")[0], [*shipped_models(), *timm.list_models()])
    hint = f" (similar names: {', '.join(close)})" if close else ""
    return f"unknown timm architecture {name!r}{hint}; {forms}"


def _timm_fix(name: str, arch: str) -> str:
    command = f"python -c 'import timm; timm.create_model(\"{name}\", pretrained=True)'"
    return _fetch_fix(command, f"pass a checkpoint file: --model PATH --arch {arch}")


def _timm_pretrained(name: str, offline: bool | None) -> nn.Module:
    """A timm model with its pretrained weights (the tag's, else timm's default tag), as timm fetches them."""
    import timm
    from timm.models import get_pretrained_cfg

    arch, _, tag = name.partition(".")
    try:
        pretrained = get_pretrained_cfg(name)
    except RuntimeError:  # an unknown tag
        pretrained = None
    if pretrained is None or not (pretrained.hf_hub_id or pretrained.url or pretrained.file):
        tags = [known.partition(".")[2] for known in timm.list_pretrained(f"{arch}.*")]
        tags = list(dict.fromkeys([*similar_names(tag, tags), *tags]))  # a mistyped tag: the like ones first
        what = f"no pretrained tag {tag!r}" if tag else "no pretrained weights"
        offered = f" (its tags: {', '.join(tags[:8])}{', ...' if len(tags) > 8 else ''})" if tags else ""
        raise ModelLoadError(f"cannot load model {name!r}: timm has {what} for {arch}{offered}; pass a checkpoint "
                             f"file: --model PATH --arch {arch}")
    repo, _, revision = (pretrained.hf_hub_id or "").partition("@")
    with _fetching(name, repo or None, revision or None, offline, _timm_fix(name, arch)) as cache_only:
        if cache_only and not repo and pretrained.url and not _in_torch_hub_cache(pretrained.url):
            raise ModelLoadError(f"cannot load model {name!r}: offline, and its weights ({pretrained.url}) are not "
                                 f"in the torch hub cache {torch.hub.get_dir()}; {_timm_fix(name, arch)}")
        return _create(name, pretrained=True)


def _in_torch_hub_cache(url: str) -> bool:
    from urllib.parse import urlsplit

    return (Path(torch.hub.get_dir()) / "checkpoints" / Path(urlsplit(url).path).name).is_file()


def _timm_from_hub(name: str, offline: bool | None) -> nn.Module:
    """timm's ``hf-hub:ORG/NAME[@REVISION]``, passed to ``timm.create_model`` as it is."""
    repo, _, revision = name[len(TIMM_HUB):].partition("@")
    fix = _fetch_fix(f"hf download {repo}", "give its folder as --model")
    with _fetching(name, repo, revision or None, offline, fix):
        import timm

        return timm.create_model(name, pretrained=True)


# ------------------------------------------------------------------------ Hub / folder repositories

#: the transformers classes vitexplain explains (instrumentation/families: hf_vit, hf_vit_model, hf_dinov2,
#: hf_two_tower), the ones a Hub id or a folder may hold
TRANSFORMERS_MODELS = (
    "ViTForImageClassification", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher",
    "ViTModel", "DeiTModel",
    "Dinov2Model", "Dinov2ForImageClassification", "Dinov2WithRegistersModel",
    "Dinov2WithRegistersForImageClassification",
    "CLIPModel", "CLIPVisionModel", "CLIPVisionModelWithProjection", "SiglipModel", "SiglipVisionModel",
)
#: the two-tower models among them (a text tower beside the image tower: explained with texts)
TWO_TOWER_MODELS = ("CLIPModel", "SiglipModel")
#: the class built for a config.json that names no ``architectures``, by its ``model_type``
BY_MODEL_TYPE = {"vit": "ViTModel", "deit": "DeiTModel", "dinov2": "Dinov2Model",
                 "dinov2_with_registers": "Dinov2WithRegistersModel", "clip": "CLIPModel", "siglip": "SiglipModel",
                 "clip_vision_model": "CLIPVisionModel", "siglip_vision_model": "SiglipVisionModel"}
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
#: what each model type's image processor does when ``preprocessor_config.json`` does not say (transformers'
#: defaults): mean, std, PIL resampling code, whether it crops the centre (size and crop: the model's image size)
PROCESSOR_DEFAULTS = {"vit": (*_HALF, 2, False), "deit": (*_IMAGENET, 3, True), "dinov2": (*_IMAGENET, 3, True),
                      "clip": (*_CLIP, 3, True), "siglip": (*_HALF, 2, False)}
_FAMILY_OF_TYPE = {"dinov2_with_registers": "dinov2", "clip_vision_model": "clip", "siglip_vision_model": "siglip"}
#: PIL resampling codes (as processors save them) -> timm's interpolation names
RESAMPLING = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class _Repository:
    """Where a timm or transformers model lies: a Hub repository or a local folder (``source`` either way)."""

    name: str
    source: str
    revision: str | None
    folder: bool

    @classmethod
    def hub(cls, name: str) -> _Repository:
        match = HUB_ID.fullmatch(name)
        return cls(name, match["repo"], match["revision"], False)

    @classmethod
    def folder_of(cls, path: Path, name: str) -> _Repository:
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"cannot load model {name!r}: the folder has no config.json; give a folder saved by "
                                 "transformers' or timm's save_pretrained, or a checkpoint file with --arch")
        return cls(name, str(path), None, True)

    def file(self, filename: str, offline: bool) -> Path | None:
        """One file of the repository (downloaded into the cache when online), None when the repository has none."""
        if self.folder:
            path = Path(self.source) / filename
            return path if path.is_file() else None
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

        if offline:  # the cache also remembers which files the repository lacks
            cached = try_to_load_from_cache(self.source, filename, revision=self.revision)
            if cached is None:
                raise LocalEntryNotFoundError(f"{filename} of {self.source} is not in the cache")
            return Path(cached) if isinstance(cached, str) else None
        try:
            return Path(hf_hub_download(self.source, filename, revision=self.revision))
        except RemoteEntryNotFoundError:
            return None


def _from_repository(repo: _Repository, offline: bool | None) -> tuple[nn.Module, dict]:
    """A Hub repository or a local folder: built by timm when its config.json is timm's, else by transformers."""
    fix = ("give a folder saved by save_pretrained (config.json and the weights)" if repo.folder
           else _fetch_fix(f"hf download {repo.source}", "give its folder as --model"))
    with _fetching(repo.name, None if repo.folder else repo.source, repo.revision, offline, fix) as cache_only:
        config_file = repo.file("config.json", cache_only)
        if config_file is None:
            raise ModelLoadError(f"cannot load model {repo.name!r}: {repo.source} has no config.json; "
                                 "check the name: a timm or transformers model repository or folder")
        try:
            saved = json.loads(config_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ModelLoadError(f"cannot load model {repo.name!r}: its config.json is not valid JSON "
                                 f"({_one_line(error)})") from None
        if "architecture" in saved and "architectures" not in saved:  # timm's format
            import timm

            where = f"local-dir:{repo.source}" if repo.folder else f"{TIMM_HUB}{repo.name}"
            model = timm.create_model(where, pretrained=True)
            return model, data_config(model)
        return _transformers_model(repo, saved, config_file, cache_only)


def _transformers_model(repo: _Repository, saved: dict, config_file: Path, offline: bool) -> tuple[nn.Module, dict]:
    try:
        import transformers
    except ImportError:
        raise ModelLoadError(f"cannot load model {repo.name!r}: a transformers model needs transformers: "
                             "pip install 'vitexplain[hf]'") from None
    architecture = (saved.get("architectures") or [None])[0] or BY_MODEL_TYPE.get(saved.get("model_type"))
    if architecture not in TRANSFORMERS_MODELS:
        raise ModelLoadError(f"cannot load model {repo.name!r}: it holds a {architecture or 'model of no known class'}"
                             f" (model_type {saved.get('model_type')!r}), an architecture vitexplain does not load; "
                             f"it loads transformers' {', '.join(TRANSFORMERS_MODELS)}")
    options = {"revision": repo.revision} if repo.revision else {}
    model = getattr(transformers, architecture).from_pretrained(repo.source, local_files_only=repo.folder or offline,
                                                                **options)
    processor = repo.file("preprocessor_config.json", offline)
    config = transformers_preprocessing(model, json.loads(processor.read_text()) if processor else {})
    names = _label_names(model)
    if names:
        config["class_names"] = names
    if architecture in TWO_TOWER_MODELS:
        config["two_tower"] = True
        if not repo.folder:
            _keep_tokenizer(model, repo, config_file.parent)
    return model, config


def _keep_tokenizer(model: nn.Module, repo: _Repository, snapshot: Path) -> None:
    """Fetch a Hub two-tower model's tokenizer into the cache beside its weights, and point the model at that
    snapshot folder, where text targets read the tokenizer (:func:`vitexplain.text_prompts.text_embeddings`).
    A repository without a tokenizer keeps the model as it is (texts are then refused, saying why)."""
    import transformers

    try:
        transformers.AutoTokenizer.from_pretrained(repo.source, revision=repo.revision)
    except Exception:  # noqa: BLE001 - no tokenizer, or one transformers cannot build here: texts are refused later
        return
    model.name_or_path = str(snapshot)


def _label_names(model: nn.Module) -> list[str] | None:
    """A transformers classifier's class names (``config.id2label``), unless they are the default ``LABEL_<i>``."""
    if "ForImageClassification" not in type(model).__name__:
        return None
    labels = getattr(model.config, "id2label", None) or {}
    names = [str(labels.get(i, labels.get(str(i), i))) for i in range(len(labels))]
    if not names or all(re.fullmatch(r"LABEL_\d+", name) for name in names):
        return None
    return names


def transformers_preprocessing(model: nn.Module, processor: dict) -> dict:
    """The preprocessing of a transformers image model as a :func:`data_config` dict, from its image processor's
    saved settings (``preprocessor_config.json``: ``image_mean``, ``image_std``, ``size``, ``crop_size``,
    ``do_center_crop``, ``resample``, ``do_normalize``) over its model type's defaults.

    A ``size`` of ``height`` x ``width`` without a crop resizes to exactly that (``crop_mode="squash"``); a
    ``shortest_edge`` (or a crop) resizes the short side and crops the centre (``crop_mode="center"``,
    ``crop_pct`` = crop / short side: DINOv2's 256 -> 224 is 0.875). A shortest edge without a crop keeps the
    aspect ratio in transformers; here the centre square is kept, the one approximation.
    """
    config = model.config
    model_type = getattr(config, "model_type", "")
    vision = getattr(config, "vision_config", None) or config
    image_size = getattr(vision, "image_size", 224)
    mean, std, resample, crop = PROCESSOR_DEFAULTS.get(_FAMILY_OF_TYPE.get(model_type, model_type),
                                                       PROCESSOR_DEFAULTS["vit"])
    square = {"height": image_size, "width": image_size}
    settings = {"image_mean": mean, "image_std": std, "resample": resample, "do_center_crop": crop,
                "size": square, "crop_size": square, "do_normalize": True, **processor}
    height, width, shortest = _processor_size(settings["size"])
    if settings["do_center_crop"] and settings.get("crop_size"):
        crop_height, crop_width, _ = _processor_size(settings["crop_size"])
        input_size, crop_pct, crop_mode = (3, crop_height, crop_width), crop_height / height, "center"
    elif shortest:
        input_size, crop_pct, crop_mode = (3, height, width), 1.0, "center"
    else:
        input_size, crop_pct, crop_mode = (3, height, width), 1.0, "squash"
    normalise = settings["do_normalize"]
    return {"input_size": input_size,
            "mean": _three(settings["image_mean"]) if normalise else (0.0, 0.0, 0.0),
            "std": _three(settings["image_std"]) if normalise else (1.0, 1.0, 1.0),
            "interpolation": _interpolation(settings["resample"]),
            "crop_pct": crop_pct, "crop_mode": crop_mode}


def _processor_size(size) -> tuple[int, int, bool]:
    """(height, width, whether it is a shortest edge) of an image processor's ``size`` / ``crop_size``."""
    if isinstance(size, (int, float)):
        return int(size), int(size), True
    if isinstance(size, dict) and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"]), False
    if isinstance(size, dict) and "shortest_edge" in size:
        return int(size["shortest_edge"]), int(size["shortest_edge"]), True
    raise ModelLoadError(f"cannot read the image size {size!r} of preprocessor_config.json "
                         "(expected height and width, or shortest_edge)")


def _three(value) -> tuple[float, ...]:
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    return tuple(values)


def _interpolation(resample) -> str:
    if isinstance(resample, str) and resample.lower() in RESAMPLING.values():
        return resample.lower()
    return RESAMPLING.get(resample, "bicubic")


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
    """Readable class names: the shipped model's (or a transformers classifier's labels), ImageNet's for 1000-class
    models, else the indices."""
    if config.get("class_names"):
        return list(config["class_names"])
    num_classes = getattr(model, "num_classes", 0) or getattr(model, "num_labels", 0)  # timm / transformers
    if num_classes in (1000, 1001):
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [info.index_to_description(i) for i in range(num_classes)]
    return [str(i) for i in range(num_classes)]
