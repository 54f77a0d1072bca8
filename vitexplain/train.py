"""Training small Vision Transformers on the ``digits`` benchmark: the models in ``vitexplain/assets/models``.

:func:`train_digits` trains a timm ViT with a class token, or a DeiT with a distillation token
taught by a trained ViT, from scratch on rendered ``digits`` canvases (a CPU is enough), measures its
accuracy on the held-out test split and, given ``out``, writes a safetensors checkpoint and the JSON
model card that :func:`vitexplain.models.load_model` reads. Decisions: docs/decisions/training.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .datasets import digits
from .datasets.digits import CANVAS, DIGIT_SIZES, MEAN, PATCH, STD, Digits

CLASS_NAMES = [str(digit) for digit in range(10)]
#: the digits preprocessing, written into every model's timm ``pretrained_cfg`` so that
#: ``timm.data.resolve_data_config(model=model)`` gives it wherever the model is loaded
PREPROCESSING = {"input_size": (3, CANVAS, CANVAS), "mean": MEAN, "std": STD, "crop_pct": 1.0,
                 "interpolation": "bilinear", "num_classes": len(CLASS_NAMES)}
DISTILLATIONS = ("hard", "soft")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a digits model is trained; every field is recorded in the model card.

    Attributes:
        steps: AdamW steps of ``batch_size`` canvases of the train split.
        lr, min_lr, warmup_steps: :func:`learning_rate` (linear warmup, then cosine decay to ``min_lr``).
        weight_decay: AdamW's, on weight matrices only (not on biases, norms, position embeddings, tokens).
        label_smoothing: of the cross-entropy on the true labels.
        clip_grad: gradient norm clip (None: no clipping).
        focus: fraction of the steps, at the start, on which the model sees only a ``focus_window`` x
            ``focus_window`` block of patch tokens that holds the digit (:func:`digit_windows`); the
            rest of the steps see whole canvases.
        rotation, shear: shape jitter of the training canvases (:func:`jitter`): each canvas turned
            by up to ``rotation`` degrees and sheared by up to ``shear`` about its digit's centre
            (0: none). The test canvases are never jittered.
        distillation, tau: DeiT's objective when there is a teacher (:func:`distillation_loss`).
        seed: the initialisation, the order of the canvases and the focus windows.
        train_size: canvases in the training set; None: ``steps * batch_size`` distinct canvases, each
            seen once; fewer: a fixed set seen for several epochs, reshuffled every epoch.
        data_seed: seed of the training canvases (``Digits("train", seed=data_seed)``).
        split_seed: the scans' train/test split (keep the benchmark's 0).
        test_size, test_seed: the canvases of the reported accuracy (``Digits("test", n=test_size, seed=test_seed)``).
    """

    steps: int
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 0
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    clip_grad: float | None = 1.0
    focus: float = 0.0
    focus_window: int = 8
    rotation: float = 0.0
    shear: float = 0.0
    distillation: str = "hard"
    tau: float = 1.0
    seed: int = 0
    train_size: int | None = None
    data_seed: int = 0
    split_seed: int = 0
    test_size: int = 2000
    test_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "focus_window", "test_size") + (("train_size",) if self.train_size else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        checks = {"lr": self.lr > 0, "min_lr": 0 <= self.min_lr <= self.lr, "weight_decay": self.weight_decay >= 0,
                  "warmup_steps": 0 <= self.warmup_steps <= self.steps, "label_smoothing": 0 <= self.label_smoothing < 1,
                  "clip_grad": self.clip_grad is None or self.clip_grad > 0, "focus": 0 <= self.focus <= 1,
                  "tau": self.tau > 0, "rotation": 0 <= self.rotation <= 45, "shear": 0 <= self.shear <= 0.5}
        wanted = {"min_lr": "in [0, lr]", "warmup_steps": "in [0, steps]", "label_smoothing": "in [0, 1)",
                  "focus": "in [0, 1]",
                  "rotation": "in [0, 45] degrees", "shear": "in [0, 0.5]"}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name} must be {wanted.get(name, 'positive')}, got {getattr(self, name)!r}")
        if self.distillation not in DISTILLATIONS:
            raise ValueError(f"distillation must be one of {DISTILLATIONS}, got {self.distillation!r}")

    @property
    def focus_steps(self) -> int:
        return round(self.focus * self.steps)


def digits_model_kwargs(model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``model_kwargs`` completed for ``digits``: 112 px input, 8 px patches (unless given), 10 classes,
    and the digits preprocessing in ``pretrained_cfg_overlay``."""
    kwargs = {"img_size": CANVAS, "patch_size": PATCH, "num_classes": len(CLASS_NAMES), **(model_kwargs or {})}
    if kwargs["img_size"] not in (CANVAS, (CANVAS, CANVAS), [CANVAS, CANVAS]):
        raise ValueError(f"digits canvases are {CANVAS} x {CANVAS}; img_size={kwargs['img_size']!r} does not fit")
    if kwargs["num_classes"] != len(CLASS_NAMES):
        raise ValueError(f"digits has {len(CLASS_NAMES)} classes; num_classes={kwargs['num_classes']!r} does not fit")
    kwargs["pretrained_cfg_overlay"] = {**kwargs.get("pretrained_cfg_overlay", {}), **PREPROCESSING}
    return kwargs


def build_model(arch: str, model_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """A randomly initialised timm model ``arch`` for digits (see :func:`digits_model_kwargs`); seeds nothing."""
    import timm

    if not timm.is_model(arch):
        raise ValueError(f"unknown timm architecture {arch!r}")
    return timm.create_model(arch, pretrained=False, **digits_model_kwargs(model_kwargs))


def learning_rate(step: int, *, steps: int, lr: float, warmup_steps: int, min_lr: float) -> float:
    """Linear warmup from ``lr / warmup_steps`` to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


def distillation_loss(class_logits: Tensor, distill_logits: Tensor, labels: Tensor, teacher_logits: Tensor, *,
                      kind: str = "hard", tau: float = 1.0, label_smoothing: float = 0.0) -> Tensor:
    """DeiT's objective for a model with a distillation token (Touvron et al., "Training data-efficient
    image transformers & distillation through attention", ICML 2021, Sec. 4).

    The class head learns the true labels (cross-entropy, with ``label_smoothing``: DeiT smooths the
    true labels only); the distillation head learns from the teacher; weight 1/2 each:

    * ``"hard"`` (hard-label distillation): ``1/2 CE(class, y) + 1/2 CE(distill, argmax teacher)``;
    * ``"soft"``: ``1/2 CE(class, y) + 1/2 tau^2 KL(softmax(teacher / tau) || softmax(distill / tau))``,
      the KL averaged over images (the authors' code further divides it by the number of classes).
    """
    if kind not in DISTILLATIONS:
        raise ValueError(f"distillation must be one of {DISTILLATIONS}, got {kind!r}")
    base = F.cross_entropy(class_logits, labels, label_smoothing=label_smoothing)
    if kind == "hard":
        taught = F.cross_entropy(distill_logits, teacher_logits.argmax(-1))
    else:
        taught = F.kl_div(F.log_softmax(distill_logits / tau, -1), F.log_softmax(teacher_logits / tau, -1),
                          reduction="batchmean", log_target=True) * tau ** 2
    return (base + taught) / 2


@functools.lru_cache(maxsize=1)
def _scan_classes() -> Tensor:
    """Class of each of scikit-learn's digit scans (what ``Digits.layout["scans"]`` indexes)."""
    from sklearn.datasets import load_digits

    return torch.from_numpy(load_digits().target).long()


def digits_labels(dataset: Digits, indices: Tensor) -> Tensor:
    """Labels [B] of canvases ``indices`` of ``dataset`` (the class of each canvas's first digit), batched."""
    return _scan_classes()[dataset.layout["scans"][indices, 0]]


def digit_windows(dataset: Digits, indices: Tensor, window: int, grid: int, generator: torch.Generator) -> Tensor:
    """Patch-token indices [B, window^2] (row-major in the ``grid`` x ``grid`` token grid) of a
    ``window`` x ``window`` block that holds every token the square of the canvas's digit touches,
    placed uniformly among the blocks that do, with ``generator``."""
    patch = CANVAS // grid
    corners = []
    for axis in ("y", "x"):
        start = dataset.layout[axis][indices, 0]
        first, last = start // patch, (start + dataset.layout["sizes"][indices, 0] - 1) // patch
        low, high = (last - window + 1).clamp(min=0), first.clamp(max=grid - window)
        corners.append(low + (torch.rand(len(indices), generator=generator) * (high - low + 1)).long())
    span = torch.arange(window)
    rows, cols = corners[0][:, None] + span, corners[1][:, None] + span
    return (rows[:, :, None] * grid + cols[:, None, :]).flatten(1)


def jitter(images: Tensor, dataset: Digits, indices: Tensor, rotation: float, shear: float,
           generator: torch.Generator) -> Tensor:
    """The canvases turned by a uniform angle in ±``rotation`` degrees and sheared horizontally by a
    uniform factor in ±``shear``, both about the centre of each canvas's digit, so the digit stays
    where its layout (and :func:`digit_windows`) says it is; bilinear, edges repeated.

    Training-time augmentation of the digit's shape: the train split has only 1,438 scans, and a
    model that sees them only scaled and moved learns the scans more than the digits.
    """
    batch = images.shape[0]
    angle = torch.deg2rad((torch.rand(batch, generator=generator) * 2 - 1) * rotation)
    slant = (torch.rand(batch, generator=generator) * 2 - 1) * shear
    cos, sin = angle.cos(), angle.sin()
    # output -> input map in normalised (x, y) coordinates: rotation @ shear, about the digit's centre
    matrix = torch.stack([torch.stack([cos, cos * slant - sin], 1), torch.stack([sin, sin * slant + cos], 1)], 1)
    sizes = dataset.layout["sizes"][indices, 0].float()
    centre = torch.stack([(dataset.layout[axis][indices, 0].float() + sizes / 2) * 2 / CANVAS - 1 for axis in ("x", "y")], 1)
    offset = centre - (matrix @ centre[:, :, None])[:, :, 0]
    theta = torch.cat([matrix, offset[:, :, None]], 2).to(images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


class _TokenWindow(nn.Module):
    """Stands in for a timm ViT's ``patch_drop`` (applied right after the position embedding): keeps
    the prefix tokens and, of the patch tokens, those listed in ``keep`` [B, K] (all when None)."""

    def __init__(self, prefix: int):
        super().__init__()
        self.prefix = prefix
        self.keep: Tensor | None = None

    def forward(self, tokens: Tensor) -> Tensor:
        if self.keep is None:
            return tokens
        patches = tokens[:, self.prefix:].gather(1, self.keep[:, :, None].expand(-1, -1, tokens.shape[-1]))
        return torch.cat([tokens[:, :self.prefix], patches], 1)


@contextlib.contextmanager
def focused(models: list[nn.Module]) -> Iterator[Callable[[Tensor | None], None]]:
    """Inside the block the timm ViTs ``models`` see only the patch tokens last given to the yielded
    function (indices [B, K], or None for all); their own ``patch_drop`` is put back on exit."""
    saved = [model.patch_drop for model in models]
    windows = [_TokenWindow(model.num_prefix_tokens) for model in models]
    for model, window in zip(models, windows):
        model.patch_drop = window

    def keep(indices: Tensor | None) -> None:
        for window in windows:
            window.keep = indices

    try:
        yield keep
    finally:
        for model, original in zip(models, saved):
            model.patch_drop = original


@contextlib.contextmanager
def _unfused_attention(models: list[nn.Module]) -> Iterator[None]:
    """With more than one torch thread, turn timm's fused attention (``scaled_dot_product_attention``)
    off inside the block: the same arithmetic, but on 2 CPU threads its backward made a training step
    about 3 times slower than two plain matmuls (on 1 thread both are as fast)."""
    fused = [module for model in models for module in model.modules() if getattr(module, "fused_attn", False)]
    if torch.get_num_threads() == 1:
        fused = []
    for module in fused:
        module.fused_attn = False
    try:
        yield
    finally:
        for module in fused:
            module.fused_attn = True


@contextlib.contextmanager
def _threads(count: int | None) -> Iterator[int]:
    """Use ``count`` intra-op threads inside the block (torch's current setting when None)."""
    saved = torch.get_num_threads()
    if count is not None:
        if count < 1:
            raise ValueError(f"threads must be a positive integer, got {count!r}")
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(saved)


@torch.inference_mode()
def evaluate(model: nn.Module, dataset: Digits, batch_size: int = 250) -> float:
    """Top-1 accuracy of ``model`` (eval mode, its default output) on every canvas of ``dataset``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for indices in torch.arange(len(dataset)).split(batch_size):
        images = dataset.render(indices)[0].to(device)
        correct += int((model(images).argmax(-1).cpu() == digits_labels(dataset, indices)).sum())
    model.train(was_training)
    return correct / len(dataset)


def _optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases, norms, position embeddings and special tokens (timm's / DeiT's groups)."""
    skip = set(getattr(model, "no_weight_decay", lambda: ())())
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if parameter.ndim <= 1 or name in skip else decay).append(parameter)
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr)


def _resolve_teacher(teacher: nn.Module | str | None) -> tuple[nn.Module | None, str | None]:
    """The teacher model (eval mode) and the name the model card records."""
    if teacher is None:
        return None, None
    if isinstance(teacher, nn.Module):
        return teacher.eval(), type(teacher).__name__
    from .models import load_model

    model, config = load_model(teacher, device="cpu")
    if tuple(config["input_size"][1:]) != (CANVAS, CANVAS) or tuple(config["mean"]) != MEAN or tuple(config["std"]) != STD:
        raise ValueError(f"teacher {teacher!r} expects {config['input_size']} images normalised with "
                         f"{config['mean']} / {config['std']}, not digits canvases")
    return model, teacher


def train_digits(arch: str, model_kwargs: dict[str, Any] | None = None, *, teacher: nn.Module | str | None = None,
                 threads: int | None = None, out: str | Path | None = None, command: str | None = None,
                 eval_every: int | None = None, snapshot_every: int | None = None, progress: bool = True,
                 **recipe: Any) -> dict[str, Any]:
    """Train a timm Vision Transformer from scratch on ``digits`` and measure it on the held-out test split.

    Each step renders ``batch_size`` canvases of the train split (digits and clutter from the train
    scans only) and takes one AdamW step on cross-entropy with label smoothing. With a ``teacher``
    the model must have a distillation token (e.g. ``deit_tiny_distilled_patch16_224``) and learns
    DeiT's :func:`distillation_loss`; the teacher sees exactly what the model sees (in the focus
    steps, the same tokens). The reported accuracy is that of timm's inference output (for DeiT the
    mean of both heads, as in DeiT).

    Deterministic given the recipe's ``seed`` and the thread count: the initialisation is drawn under
    ``seed`` inside :func:`torch.random.fork_rng` (the caller's global RNG state is left as it was),
    the canvases are a pure function of ``data_seed`` and their order and focus windows come from a
    ``torch.Generator`` seeded with ``seed``.

    Args:
        arch: a timm architecture name; ``model_kwargs`` override its shape (``embed_dim``, ``depth``,
            ``num_heads``, ``mlp_ratio``...). ``img_size`` 112, ``patch_size`` 8, ``num_classes`` 10 and
            the digits preprocessing (``pretrained_cfg_overlay``) are filled in (:func:`digits_model_kwargs`).
        teacher: a trained digits model, or its short name / checkpoint path (:func:`vitexplain.models.load_model`).
        threads: torch intra-op threads during training (None: torch's current setting).
        out: where to write the checkpoint (``.safetensors``, float32) and its model card (``.json`` beside it).
        command: the command line to record in the model card.
        eval_every: also measure the test accuracy every that many steps (``history``; counts in the time).
        snapshot_every: save the training state every that many steps to ``<out>.snapshot.pt``, and
            resume from that file when it exists (an interrupted run continues bit for bit; its time
            adds up); the file is deleted when the run ends. Needs ``out``.
        progress: show a tqdm progress bar.
        **recipe: the fields of :class:`Recipe` (``steps`` is required).

    Returns:
        Metrics: ``test_accuracy``, ``losses`` (per step), ``history`` (test accuracy by step),
        ``parameters``, ``wall_seconds`` and ``cpu_seconds`` of the training steps (CPU time of the
        process, all threads), ``threads``, ``model`` (the trained model, eval mode) and, with
        ``out``, ``checkpoint`` and ``card`` (paths).
    """
    recipe = Recipe(**recipe)
    kwargs = digits_model_kwargs(model_kwargs)
    grid = CANVAS // kwargs["patch_size"]
    needed = -(-(DIGIT_SIZES[1] - 1) // kwargs["patch_size"]) + 1  # tokens a digit's square can touch per side
    if recipe.focus and not needed <= recipe.focus_window <= grid:
        raise ValueError(f"focus_window must lie in [{needed}, {grid}] with {kwargs['patch_size']} px patches "
                         f"(a digit can touch {needed} tokens per side), got {recipe.focus_window}")
    if snapshot_every is not None and (out is None or snapshot_every < 1):
        raise ValueError(f"snapshot_every needs an output path and a positive number of steps, got {snapshot_every!r}")
    teacher_model, teacher_name = _resolve_teacher(teacher)
    snapshot = Path(out).with_suffix(".snapshot.pt") if snapshot_every else None
    identity = json.dumps({"arch": arch, "model_kwargs": kwargs, "recipe": dataclasses.asdict(recipe),
                           "teacher": teacher_name}, sort_keys=True)
    train_set = Digits("train", n=recipe.train_size or recipe.steps * recipe.batch_size, seed=recipe.data_seed,
                       split_seed=recipe.split_seed)
    test_set = Digits("test", n=recipe.test_size, seed=recipe.test_seed, split_seed=recipe.split_seed)

    with _threads(threads) as used_threads, torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = build_model(arch, kwargs).train()
        distilled = hasattr(model, "set_distilled_training")
        if distilled != (teacher_model is not None):
            raise ValueError(f"{arch} {'has' if distilled else 'has no'} distillation token but "
                             f"{'a' if teacher_model is not None else 'no'} teacher was given: a model with a distillation "
                             "token (deit_*_distilled_*) trains with a teacher, a model without one trains without")
        if distilled:
            model.set_distilled_training(True)
        run = _fit(model, teacher_model, recipe, train_set, test_set, eval_every=eval_every, progress=progress,
                   desc=f"train {arch}", snapshot=snapshot, snapshot_every=snapshot_every or 0, identity=identity)
        if distilled:
            model.set_distilled_training(False)
        accuracy = evaluate(model.eval(), test_set)
        history = [*run["history"], {"step": recipe.steps, "test_accuracy": accuracy}]

    parameters = sum(p.numel() for p in model.parameters())
    train_wall, train_cpu = run["wall_seconds"], run["cpu_seconds"]
    result = {"test_accuracy": accuracy, "losses": run["losses"], "history": history, "parameters": parameters,
              "wall_seconds": train_wall, "cpu_seconds": train_cpu, "threads": used_threads, "model": model}
    if out is not None:
        result.update(save_checkpoint(model, out, arch=arch, model_kwargs=kwargs, card={
            "summary": _summary(model, kwargs, parameters, distilled),
            "training": {**dataclasses.asdict(recipe), "optimizer": "AdamW", "schedule": "linear warmup, cosine decay",
                         "teacher": teacher_name, "examples": recipe.steps * recipe.batch_size},
            "seed": recipe.seed, "command": command, "test_accuracy": accuracy, "history": history,
            "training_time": {"wall_seconds": round(train_wall, 1), "cpu_seconds": round(train_cpu, 1),
                              "threads": used_threads, "machine": f"{_cpu_name()}, {os.cpu_count()} logical CPUs",
                              "sessions": run["sessions"]},
            "date": datetime.date.today().isoformat(),
            "dataset": {"name": "digits", "train": {"canvases": len(train_set), "seed": recipe.data_seed},
                        "test": {"canvases": recipe.test_size, "seed": recipe.test_seed},
                        "split_seed": recipe.split_seed, "settings": _digits_settings()},
            "versions": {"torch": torch.__version__, "timm": __import__("timm").__version__}}))
    return result


def _fit(model: nn.Module, teacher: nn.Module | None, recipe: Recipe, train_set: Digits, test_set: Digits, *,
         eval_every: int | None, progress: bool, desc: str, snapshot: Path | None, snapshot_every: int,
         identity: str) -> dict[str, Any]:
    """The training steps. Returns the loss of each step, the test accuracy every ``eval_every`` steps
    and the wall and CPU time of the steps; with a ``snapshot`` path, resumes from it when it exists
    and rewrites it every ``snapshot_every`` steps (``sessions`` counts the runs that made it)."""
    from tqdm import tqdm

    generator = torch.Generator().manual_seed(recipe.seed)
    examples = recipe.steps * recipe.batch_size
    epochs = -(-examples // len(train_set))
    batches = torch.cat([torch.randperm(len(train_set), generator=generator) for _ in range(epochs)])[:examples]
    batches = batches.view(recipe.steps, recipe.batch_size)
    optimizer = _optimizer(model, recipe)
    run = {"step": 0, "losses": [], "history": [], "wall_seconds": 0.0, "cpu_seconds": 0.0, "sessions": 1}
    if snapshot is not None and snapshot.is_file():
        run = _resume(snapshot, identity, model, optimizer, generator)
    grid = model.patch_embed.grid_size[0]
    viewers = [m for m in (model, teacher) if m is not None and hasattr(m, "patch_drop")]
    start = run["step"]
    bar = tqdm(range(start, recipe.steps), desc=desc, disable=not progress, unit="step", mininterval=5,
               initial=start, total=recipe.steps)
    clock = (time.perf_counter() - run["wall_seconds"], time.process_time() - run["cpu_seconds"])
    with _unfused_attention([m for m in (model, teacher) if m is not None]), contextlib.ExitStack() as focus:
        keep = focus.enter_context(focused(viewers))
        for step in bar:
            if step >= recipe.focus_steps:
                focus.close()  # once closed, closing again does nothing
            indices = batches[step]
            images, labels = train_set.render(indices)[0], digits_labels(train_set, indices)
            if recipe.rotation or recipe.shear:
                images = jitter(images, train_set, indices, recipe.rotation, recipe.shear, generator)
            if step < recipe.focus_steps:
                keep(digit_windows(train_set, indices, recipe.focus_window, grid, generator))
            rate = learning_rate(step, steps=recipe.steps, lr=recipe.lr, warmup_steps=recipe.warmup_steps,
                                 min_lr=recipe.min_lr)
            for group in optimizer.param_groups:
                group["lr"] = rate
            outputs = model(images)
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(images)
                loss = distillation_loss(*outputs, labels, teacher_logits, kind=recipe.distillation, tau=recipe.tau,
                                         label_smoothing=recipe.label_smoothing)
            else:
                loss = F.cross_entropy(outputs, labels, label_smoothing=recipe.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.clip_grad is not None:
                nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_grad)
            optimizer.step()
            run["losses"].append(loss.item())
            bar.set_postfix(loss=f"{run['losses'][-1]:.3f}", lr=f"{rate:.2e}")
            if eval_every and (step + 1) % eval_every == 0 and step + 1 < recipe.steps:
                keep(None)  # whole canvases
                run["history"].append({"step": step + 1, "test_accuracy": evaluate(model, test_set)})
                bar.write(f"step {step + 1}: test accuracy {run['history'][-1]['test_accuracy']:.4f}")
            run.update(step=step + 1, wall_seconds=time.perf_counter() - clock[0], cpu_seconds=time.process_time() - clock[1])
            if snapshot is not None and (step + 1) % snapshot_every == 0 and step + 1 < recipe.steps:
                _save_snapshot(snapshot, identity, run, model, optimizer, generator)
    if snapshot is not None:
        snapshot.unlink(missing_ok=True)
    return run


def _save_snapshot(path: Path, identity: str, run: dict[str, Any], model: nn.Module,
                   optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    """Everything a resumed run needs to continue bit for bit, written atomically."""
    partial = path.with_name(path.name + ".tmp")
    torch.save({"identity": identity, "run": run, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state()}, partial)
    os.replace(partial, path)


def _resume(path: Path, identity: str, model: nn.Module, optimizer: torch.optim.Optimizer,
            generator: torch.Generator) -> dict[str, Any]:
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
    return (f"{type(model).__module__}.{type(model).__name__}: {CANVAS}x{CANVAS} input, {kwargs['patch_size']}x"
            f"{kwargs['patch_size']} patches ({grid}x{grid} tokens) plus {tokens}, width {model.embed_dim}, "
            f"depth {len(model.blocks)}, {model.blocks[0].attn.num_heads} heads, MLP ratio "
            f"{model.blocks[0].mlp.fc1.out_features / model.embed_dim:g}, {parameters / 1e6:.2f} M parameters, "
            f"{len(CLASS_NAMES)} classes")


def save_checkpoint(model: nn.Module, out: str | Path, *, arch: str, model_kwargs: dict[str, Any],
                    card: dict[str, Any]) -> dict[str, Path]:
    """Write ``model``'s state dict (float32 safetensors) to ``out`` and its model card to ``out`` with ``.json``.

    The card holds what :func:`vitexplain.models.load_model` needs (``arch``, ``model_kwargs``,
    ``class_names``) followed by the ``card`` fields.
    """
    from safetensors.torch import save_file

    out = Path(out)
    if out.suffix != ".safetensors":
        raise ValueError(f"the checkpoint is written as safetensors: give a path ending in .safetensors, got {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({key: value.detach().float().contiguous().cpu() for key, value in model.state_dict().items()}, str(out))
    card_path = out.with_suffix(".json")
    card_path.write_text(json.dumps({"arch": arch, "model_kwargs": model_kwargs, "class_names": CLASS_NAMES, **card},
                                    indent=2) + "\n")
    return {"checkpoint": out, "card": card_path}
