"""Training a digits model: :func:`train_digits` and its steps, and the accuracy it reports."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..datasets.digits import CANVAS, DIGIT_SIZES, MEAN, STD, Digits
from .augmentation import jitter, photometric, rendering_styles
from .checkpoint import checkpoint_path, model_card, resume, save_checkpoint, save_snapshot
from .focus import digit_windows, focused
from .recipe import TrainingRecipe, build_model, digits_model_kwargs, distillation_loss, learning_rate


@functools.lru_cache(maxsize=1)
def _scan_classes() -> Tensor:
    """Class of each of scikit-learn's digit scans (what ``Digits.layout["scans"]`` indexes)."""
    from sklearn.datasets import load_digits

    return torch.from_numpy(load_digits().target).long()


def digits_labels(dataset: Digits, indices: Tensor) -> Tensor:
    """Labels [B] of canvases ``indices`` of ``dataset`` (the class of each canvas's first digit), batched."""
    return _scan_classes()[dataset.layout["scans"][indices, 0]]



@contextlib.contextmanager
def _unfused_attention(models: list[nn.Module], device: torch.device) -> Iterator[None]:
    """On the CPU with more than one torch thread, turn timm's fused attention (``scaled_dot_product_attention``)
    off inside the block: the same arithmetic, but on 2 CPU threads its backward made a training step
    about 3 times slower than two plain matmuls (on 1 thread both are as fast; a GPU keeps its fused kernel)."""
    fused = [module for model in models for module in model.modules() if getattr(module, "fused_attn", False)]
    if torch.get_num_threads() == 1 or device.type != "cpu":
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


def _optimizer(model: nn.Module, recipe: TrainingRecipe) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases, norms, position embeddings and special tokens (timm's / DeiT's groups)."""
    skip = set(getattr(model, "no_weight_decay", lambda: ())())
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if parameter.ndim <= 1 or name in skip else decay).append(parameter)
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr)


def _resolve_teacher(teacher: nn.Module | str | None, device: torch.device) -> tuple[nn.Module | None, str | None]:
    """The teacher model (eval mode, on ``device``: a given module elsewhere is copied there, not moved) and the
    name the model card records."""
    if teacher is None:
        return None, None
    if isinstance(teacher, nn.Module):
        if any(parameter.device != device for parameter in teacher.parameters()):
            teacher = copy.deepcopy(teacher).to(device)
        return teacher.eval(), type(teacher).__name__
    from ..models import load_model

    model, config = load_model(teacher, device=device)
    digits_canvases = (tuple(config["input_size"][1:]) == (CANVAS, CANVAS) and tuple(config["mean"]) == MEAN
                       and tuple(config["std"]) == STD)
    if not digits_canvases:
        raise ValueError(f"teacher {teacher!r} expects {config['input_size']} images normalised with "
                         f"{config['mean']} / {config['std']}, not digits canvases")
    return model, teacher


def _initial_weights(init: str | Path | None) -> tuple[dict[str, Tensor] | None, dict[str, Any] | None]:
    """The weights a fine-tuning run starts from (a shipped name or a checkpoint) and what the model card
    records of them: the name and, from their own card, the command, recipe (with its own ``init``) and accuracy."""
    if init is None:
        return None, None
    from ..models import load_model, read_card, shipped_models

    model, _ = load_model(str(init), device="cpu")
    shipped = shipped_models()
    card = read_card(Path(shipped[init].weights) if init in shipped else Path(init))
    provenance = {key: card[key] for key in ("command", "training", "test_accuracy") if key in card}
    return model.state_dict(), {"from": str(init), **provenance}


def _with_distillation_token(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A plain ViT's weights made to fit a distilled model (DeiT) of the same shape, so that a DeiT can start from
    a trained ViT: the blocks, class token, class head and the positions of the class token and the patches are
    the ViT's; the distillation token, its position and the distillation head keep the model's own
    initialisation and are learnt by the run. Weights that already fit (or fit nothing) are returned as they are."""
    own = model.state_dict()
    if "dist_token" not in own or "dist_token" in weights or "pos_embed" not in weights:
        return weights
    plain, distilled = weights["pos_embed"], own["pos_embed"]
    if plain.shape[1] != distilled.shape[1] - 1 or plain.shape[2:] != distilled.shape[2:]:
        return weights
    positions = torch.cat([plain[:, :1], distilled[:, 1:2], plain[:, 1:]], dim=1)   # class, distillation, patches
    extra = {key: value for key, value in own.items() if key.startswith("head_dist.") or key == "dist_token"}
    return {**weights, **extra, "pos_embed": positions}


def _with_pooled_readout(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A class-token ViT's weights made to fit the same ViT with an average-pooled readout (timm's
    ``global_pool='avg'``), so that a pooled model can be fine-tuned from a trained class-token one: timm then
    normalises the pooled token (``fc_norm``) instead of every token (``norm``, an identity), so the final
    norm's weights move to ``fc_norm``; everything else (the class token included, which the pool skips) is
    copied. Weights that already fit (or fit nothing) are returned as they are."""
    own = model.state_dict()
    if ("fc_norm.weight" not in own or "norm.weight" in own
            or "fc_norm.weight" in weights or "norm.weight" not in weights):
        return weights
    return {("fc_" + key if key.startswith("norm.") else key): value for key, value in weights.items()}


def _load_initial_weights(model: nn.Module, weights: dict[str, Tensor], init: str | Path) -> None:
    from ..models import state_dict_mismatch

    weights = _with_pooled_readout(model, _with_distillation_token(model, weights))
    mismatch = state_dict_mismatch(model, weights)
    if mismatch:
        raise ValueError(f"init {str(init)!r} does not fit this architecture and shape: {mismatch}")
    model.load_state_dict(weights)


def train_digits(arch: str, model_kwargs: dict[str, Any] | None = None, *, teacher: nn.Module | str | None = None,
                 init: str | Path | None = None, threads: int | None = None, device: str | torch.device | None = None,
                 out: str | Path | None = None, command: str | None = None,
                 eval_every: int | None = None, snapshot_every: int | None = None, progress: bool = True,
                 **recipe: Any) -> dict[str, Any]:
    """Train a timm Vision Transformer on ``digits`` — from scratch, or from ``init``'s weights — and measure
    it on the held-out test split.

    Each step renders ``batch_size`` canvases of the train split (digits and clutter from the train
    scans only), augments them as the recipe asks (:mod:`.augmentation`) and takes one AdamW step on
    cross-entropy with label smoothing. With a ``teacher`` the model must have a distillation token
    (e.g. ``deit_tiny_distilled_patch16_224``) and learns DeiT's :func:`distillation_loss`; the
    teacher sees exactly what the model sees (in the focus steps, the same tokens). The reported accuracy
    is that of timm's inference output (for DeiT the mean of both heads, as in DeiT).

    Deterministic given the recipe's ``seed`` and the thread count: the initialisation is drawn under
    ``seed`` inside :func:`torch.random.fork_rng` (the caller's global RNG state is left as it was),
    the canvases are a pure function of ``data_seed`` and their order, focus windows and augmentation
    come from a ``torch.Generator`` seeded with ``seed`` (saved in snapshots, so a resumed run draws
    the same).

    Args:
        arch: a timm architecture name; ``model_kwargs`` override its shape (``embed_dim``, ``depth``,
            ``num_heads``, ``mlp_ratio``...). ``img_size`` 112, ``patch_size`` 8, ``num_classes`` 10 and
            the digits preprocessing (``pretrained_cfg_overlay``) are filled in (:func:`digits_model_kwargs`).
        teacher: a trained digits model, or its short name / checkpoint path (:func:`vitexplain.models.load_model`).
        init: start from this digits model's weights (short name or checkpoint of the same architecture and
            shape) instead of timm's initialisation: fine-tuning. A distilled model (DeiT) may also start from a
            plain ViT of its shape: everything but the distillation token, its position and its head is copied;
            an average-pooled model (``global_pool='avg'``) from a class-token one: the final norm becomes ``fc_norm``.
            The card records it with its own card's command, recipe and accuracy, so a run in stages keeps its history.
        threads: torch intra-op threads during training (None: torch's current setting).
        device: where the model trains (:func:`vitexplain.models.resolve_device`; default: CUDA when
            available, else the CPU), checked first. Canvases, augmentation and the initialisation are
            drawn on the CPU whatever the device, so only the arithmetic differs between devices; the
            card records the device. The shipped models were trained on the CPU.
        out: where to write the checkpoint (``.safetensors``, float32) and its model card (``.json`` beside it).
        command: the command line to record in the model card.
        eval_every: also measure the test accuracy every that many steps (``history``; counts in the time).
        snapshot_every: save the training state every that many steps to ``<out>.snapshot.pt``, and
            resume from that file when it exists (an interrupted run continues bit for bit; its time
            adds up); the file is deleted when the run ends. Needs ``out``.
        progress: show a tqdm progress bar.
        **recipe: the fields of :class:`TrainingRecipe` (``steps`` is required).

    Returns:
        Metrics: ``test_accuracy``, ``losses`` (per step), ``history`` (test accuracy by step),
        ``parameters``, ``wall_seconds`` and ``cpu_seconds`` of the training steps (CPU time of the
        process, all threads), ``threads``, ``model`` (the trained model, eval mode) and, with
        ``out``, ``checkpoint`` and ``card`` (paths).
    """
    from ..devices import resolve_device

    device = resolve_device(device)
    if out is not None:
        out = checkpoint_path(out)
    recipe = TrainingRecipe(**recipe)
    kwargs = digits_model_kwargs(model_kwargs)
    grid = CANVAS // kwargs["patch_size"]
    needed = -(-(DIGIT_SIZES[1] - 1) // kwargs["patch_size"]) + 1  # tokens a digit's square can touch per side
    if recipe.focus and not needed <= recipe.focus_window <= grid:
        raise ValueError(f"focus_window must lie in [{needed}, {grid}] with {kwargs['patch_size']} px patches "
                         f"(a digit can touch {needed} tokens per side), got {recipe.focus_window}")
    if snapshot_every is not None and (out is None or snapshot_every < 1):
        raise ValueError(f"snapshot_every needs an output path and a positive number of steps, got {snapshot_every!r}")
    teacher_model, teacher_name = _resolve_teacher(teacher, device)
    initial_weights, initial = _initial_weights(init)
    snapshot = Path(out).with_suffix(".snapshot.pt") if snapshot_every else None
    identity = json.dumps({"arch": arch, "model_kwargs": kwargs, "recipe": dataclasses.asdict(recipe),
                           "teacher": teacher_name, "init": initial}, sort_keys=True)
    train_set = Digits("train", n=recipe.train_size or recipe.steps * recipe.batch_size, seed=recipe.data_seed,
                       split_seed=recipe.split_seed)
    test_set = Digits("test", n=recipe.test_size, seed=recipe.test_seed, split_seed=recipe.split_seed)

    with _threads(threads) as used_threads, torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(recipe.seed)
        model = build_model(arch, kwargs).train()
        if initial_weights is not None:
            _load_initial_weights(model, initial_weights, init)
        model.to(device)
        distilled = hasattr(model, "set_distilled_training")
        if distilled != (teacher_model is not None):
            raise ValueError(f"{arch} {'has' if distilled else 'has no'} distillation token but "
                             f"{'a' if teacher_model is not None else 'no'} teacher was given: a model with a "
                             "distillation token (deit_*_distilled_*) trains with a teacher, a model without one "
                             "trains without")
        if distilled:
            model.set_distilled_training(True)
        run = _fit(model, teacher_model, recipe, train_set, test_set, eval_every=eval_every, progress=progress,
                   desc=f"train {arch}", snapshot=snapshot, snapshot_every=snapshot_every or 0, identity=identity)
        if distilled:
            model.set_distilled_training(False)
        accuracy = evaluate(model.eval(), test_set)
        history = [*run["history"], {"step": recipe.steps, "test_accuracy": accuracy}]

    parameters = sum(p.numel() for p in model.parameters())
    result = {"test_accuracy": accuracy, "losses": run["losses"], "history": history, "parameters": parameters,
              "wall_seconds": run["wall_seconds"], "cpu_seconds": run["cpu_seconds"], "threads": used_threads,
              "device": device, "model": model}
    if out is not None:
        card = model_card(model, model_kwargs=kwargs, recipe=recipe, teacher=teacher_name, init=initial,
                          command=command, accuracy=accuracy, history=history, run=run, threads=used_threads,
                          train_canvases=len(train_set), device=device)
        result.update(save_checkpoint(model, out, arch=arch, model_kwargs=kwargs, card=card))
    return result


def _fit(model: nn.Module, teacher: nn.Module | None, recipe: TrainingRecipe, train_set: Digits, test_set: Digits, *,
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
        run = resume(snapshot, identity, model, optimizer, generator)
    grid = model.patch_embed.grid_size[0]
    viewers = [m for m in (model, teacher) if m is not None and hasattr(m, "patch_drop")]
    start = run["step"]
    bar = tqdm(range(start, recipe.steps), desc=desc, disable=not progress, unit="step", mininterval=5,
               initial=start, total=recipe.steps)
    clock = (time.perf_counter() - run["wall_seconds"], time.process_time() - run["cpu_seconds"])
    device = next(model.parameters()).device
    with _unfused_attention([m for m in (model, teacher) if m is not None], device), contextlib.ExitStack() as focus:
        keep = focus.enter_context(focused(viewers))
        for step in bar:
            if step >= recipe.focus_steps:
                focus.close()  # once closed, closing again does nothing
            indices = batches[step]
            styles = rendering_styles(recipe, len(indices), generator)
            images, labels = train_set.render(indices, **styles)[0], digits_labels(train_set, indices)
            if recipe.rotation or recipe.shear:
                images = jitter(images, train_set, indices, recipe.rotation, recipe.shear, generator)
            if recipe.contrast or recipe.gradient or recipe.noise:
                images = photometric(images, train_set.preprocess.mean, train_set.preprocess.std,
                                     contrast=recipe.contrast, gradient=recipe.gradient, noise=recipe.noise,
                                     generator=generator)
            if step < recipe.focus_steps:
                keep(digit_windows(train_set, indices, recipe.focus_window, grid, generator).to(device))
            images, labels = images.to(device), labels.to(device)
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
            run.update(step=step + 1, wall_seconds=time.perf_counter() - clock[0],
                       cpu_seconds=time.process_time() - clock[1])
            if snapshot is not None and (step + 1) % snapshot_every == 0 and step + 1 < recipe.steps:
                save_snapshot(snapshot, identity, run, model, optimizer, generator)
    if snapshot is not None:
        snapshot.unlink(missing_ok=True)
    return run
