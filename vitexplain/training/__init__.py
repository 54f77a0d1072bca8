"""Training small Vision Transformers on the ``digits`` benchmark: the models in ``vitexplain/assets/models``.

:func:`train_digits` trains a timm ViT with a class token, or a DeiT with a distillation token
taught by a trained ViT, from scratch on rendered ``digits`` canvases (a CPU is enough), measures its
accuracy on the held-out test split and, given ``out``, writes a safetensors checkpoint and the JSON
model card that :func:`vitexplain.models.load_model` reads. Decisions: docs/decisions/training.md.

``recipe``        the :class:`TrainingRecipe`, the model it builds, its schedule and objective
``focus``         the focus phase (a window of tokens around the digit)
``augmentation``  what is done to the training canvases
``loop``          :func:`train_digits`, its steps, and the reported accuracy
``checkpoint``    the checkpoint, its model card, and the snapshots a run resumes from
"""
from .augmentation import jitter, photometric, rendering_styles
from .checkpoint import save_checkpoint
from .focus import digit_windows, focused
from .loop import digits_labels, evaluate, train_digits
from .recipe import (
                     CLASS_NAMES,
                     DISTILLATIONS,
                     PREPROCESSING,
                     TrainingRecipe,
                     build_model,
                     digits_model_kwargs,
                     distillation_loss,
                     learning_rate,
)

__all__ = ["CLASS_NAMES", "DISTILLATIONS", "PREPROCESSING", "TrainingRecipe", "build_model", "digit_windows",
           "digits_labels", "digits_model_kwargs", "distillation_loss", "evaluate", "focused", "jitter",
           "learning_rate", "photometric", "rendering_styles", "save_checkpoint", "train_digits"]
