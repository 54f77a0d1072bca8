"""The recipe of a digits model: its fields and checks, the model it builds, its learning-rate
schedule and its objective. Decisions: docs/decisions/training.md."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..datasets.digits import CANVAS, MEAN, PATCH, STD
from ..options import similar_names

CLASS_NAMES = [str(digit) for digit in range(10)]
#: the digits preprocessing, written into every model's timm ``pretrained_cfg`` so that
#: ``timm.data.resolve_data_config(model=model)`` gives it wherever the model is loaded
PREPROCESSING = {"input_size": (3, CANVAS, CANVAS), "mean": MEAN, "std": STD, "crop_pct": 1.0,
                 "interpolation": "bilinear", "num_classes": len(CLASS_NAMES)}
DISTILLATIONS = ("hard", "soft")


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
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
        nearest, stroke: rendering augmentation (:func:`rendering_styles`): a ``nearest`` share of the
            training canvases have their scans scaled by nearest neighbour instead of bilinearly, and
            each canvas's strokes are thickened or thinned by a whole number of pixels up to ``stroke``.
        contrast, gradient, noise: photometric augmentation (:func:`photometric`) of every training
            canvas: its grey range squeezed by up to ``contrast`` (a share) and lifted, a linear
            brightness ramp of up to ``gradient`` added in a random direction, and per-pixel Gaussian
            noise of standard deviation up to ``noise`` (0: none). Test canvases are never augmented.
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
    nearest: float = 0.0
    stroke: int = 0
    contrast: float = 0.0
    gradient: float = 0.0
    noise: float = 0.0
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
                  "warmup_steps": 0 <= self.warmup_steps <= self.steps,
                  "label_smoothing": 0 <= self.label_smoothing < 1,
                  "clip_grad": self.clip_grad is None or self.clip_grad > 0, "focus": 0 <= self.focus <= 1,
                  "tau": self.tau > 0, "rotation": 0 <= self.rotation <= 45, "shear": 0 <= self.shear <= 0.5,
                  "nearest": 0 <= self.nearest <= 1,
                  "stroke": (isinstance(self.stroke, int) and not isinstance(self.stroke, bool)
                             and 0 <= self.stroke <= 3),
                  "contrast": 0 <= self.contrast < 1, "gradient": 0 <= self.gradient <= 1,
                  "noise": 0 <= self.noise <= 0.5}
        wanted = {"min_lr": "in [0, lr]", "warmup_steps": "in [0, steps]", "label_smoothing": "in [0, 1)",
                  "focus": "in [0, 1]",
                  "rotation": "in [0, 45] degrees", "shear": "in [0, 0.5]", "nearest": "in [0, 1]",
                  "stroke": "a whole number of pixels in [0, 3]", "contrast": "in [0, 1)", "gradient": "in [0, 1]",
                  "noise": "in [0, 0.5]"}
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
        close = similar_names(arch, timm.list_models())
        hint = f"; similar names: {', '.join(close)}" if close else ""
        raise ValueError(f"unknown timm architecture {arch!r}{hint}")
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

