"""What a training run writes: the checkpoint and its model card, and the snapshots a run resumes from."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..datasets import digits
from ..datasets.digits import CANVAS
from .recipe import CLASS_NAMES, TrainingRecipe


def save_snapshot(path: Path, identity: str, run: dict[str, Any], model: nn.Module,
                   optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    """Everything a resumed run needs to continue bit for bit, written atomically."""
    partial = path.with_name(path.name + ".tmp")
    torch.save({"identity": identity, "run": run, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state()}, partial)
    os.replace(partial, path)


def resume(path: Path, identity: str, model: nn.Module, optimizer: torch.optim.Optimizer,
           generator: torch.Generator) -> dict[str, Any]:
    """Load a snapshot into ``model``, ``optimizer`` and ``generator``; returns its run record, one session more.
    A snapshot of another run (``identity``) is refused."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if saved.get("identity") != identity:
        raise ValueError(f"snapshot {path} belongs to another training run (other architecture, shape, recipe or "
                         "teacher); delete it to start afresh")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    return {**saved["run"], "sessions": saved["run"]["sessions"] + 1}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _digits_settings() -> dict[str, Any]:
    """The generator's constants (upper-case names of :mod:`vitexplain.datasets.digits`), JSON-ready."""
    return {name.lower(): value for name, value in vars(digits).items()
            if name.isupper() and not name.startswith("_") and isinstance(value, (int, float, tuple))}


def _summary(model: nn.Module, kwargs: dict[str, Any], parameters: int, distilled: bool) -> str:
    grid = CANVAS // kwargs["patch_size"]
    tokens = "a class token and a distillation token" if distilled else "a class token"
    if getattr(model, "global_pool", "token") == "avg":
        tokens += ", the head reading the average of the patch tokens"
    return (f"{type(model).__module__}.{type(model).__name__}: {CANVAS}x{CANVAS} input, {kwargs['patch_size']}x"
            f"{kwargs['patch_size']} patches ({grid}x{grid} tokens) plus {tokens}, width {model.embed_dim}, "
            f"depth {len(model.blocks)}, {model.blocks[0].attn.num_heads} heads, MLP ratio "
            f"{model.blocks[0].mlp.fc1.out_features / model.embed_dim:g}, {parameters / 1e6:.2f} M parameters, "
            f"{len(CLASS_NAMES)} classes")


def _device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``: a run is reproducible on the same kind of device only."""
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def model_card(model: nn.Module, *, model_kwargs: dict[str, Any], recipe: TrainingRecipe, teacher: str | None,
               init: dict[str, Any] | None, command: str | None, accuracy: float, history: list[dict[str, Any]],
               run: dict[str, Any], threads: int, train_canvases: int, device: torch.device) -> dict[str, Any]:
    """The model card's fields after ``arch``, ``model_kwargs`` and ``class_names``: what the model is,
    the recipe that trained it, its test accuracy, training time, machine and device, data and versions."""
    distilled = hasattr(model, "set_distilled_training")
    return {
        "summary": _summary(model, model_kwargs, sum(p.numel() for p in model.parameters()), distilled),
        "training": {**dataclasses.asdict(recipe), "optimizer": "AdamW", "schedule": "linear warmup, cosine decay",
                     "teacher": teacher, "init": init, "examples": recipe.steps * recipe.batch_size},
        "seed": recipe.seed, "command": command, "test_accuracy": accuracy, "history": history,
        "training_time": {"wall_seconds": round(run["wall_seconds"], 1), "cpu_seconds": round(run["cpu_seconds"], 1),
                          "threads": threads, "machine": f"{_cpu_name()}, {os.cpu_count()} logical CPUs",
                          "device": _device_name(device), "sessions": run["sessions"]},
        "date": datetime.date.today().isoformat(),
        "dataset": {"name": "digits", "train": {"canvases": train_canvases, "seed": recipe.data_seed},
                    "test": {"canvases": recipe.test_size, "seed": recipe.test_seed},
                    "split_seed": recipe.split_seed, "settings": _digits_settings()},
        "versions": {"torch": torch.__version__, "timm": __import__("timm").__version__}}


def checkpoint_path(out: str | Path) -> Path:
    """``out`` as a checkpoint path; one not ending in ``.safetensors`` is a ValueError (checked before
    training too)."""
    out = Path(out)
    if out.suffix != ".safetensors":
        raise ValueError(f"the checkpoint is written as safetensors: give a path ending in .safetensors, got {out}")
    return out


def save_checkpoint(model: nn.Module, out: str | Path, *, arch: str, model_kwargs: dict[str, Any],
                    card: dict[str, Any]) -> dict[str, Path]:
    """Write ``model``'s state dict (float32 safetensors) to ``out`` and its model card to ``out`` with ``.json``.

    The card holds what :func:`vitexplain.models.load_model` needs (``arch``, ``model_kwargs``,
    ``class_names``) followed by the ``card`` fields.
    """
    from safetensors.torch import save_file

    out = checkpoint_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({key: value.detach().float().contiguous().cpu() for key, value in model.state_dict().items()}, str(out))
    card_path = out.with_suffix(".json")
    card_path.write_text(json.dumps({"arch": arch, "model_kwargs": model_kwargs, "class_names": CLASS_NAMES, **card},
                                    indent=2) + "\n")
    return {"checkpoint": out, "card": card_path}
