"""Model family descriptions, one module each, in the order they are tried (the first that describes a model wins).

Adding a family is one module here with a :class:`~.base.Family` subclass, and its name in :data:`FAMILIES`.
A model no family instruments is described by its forward alone (:class:`~.forward_only.ForwardOnly`).
"""
from __future__ import annotations

from .base import (
                               EmbeddingParts,
                               Family,
                               ProbeParts,
                               TokenContext,
                               UnsupportedModelError,
)
from .forward_only import ForwardOnly
from .hf_bert import TransformersText
from .hf_dinov2 import TransformersDinov2
from .hf_two_tower import TransformersTwoTower
from .hf_vit import TransformersViT
from .hf_vit_model import TransformersViTModel
from .timm_eva import TimmEva
from .timm_relpos import TimmBeit, TimmRelPos
from .timm_swin import TimmSwin
from .timm_vit import TimmViT
from .torchvision_vit import TorchvisionViT

#: every family, in the order they are tried
FAMILIES: list[type[Family]] = [TimmViT, TimmEva, TimmBeit, TimmRelPos, TimmSwin, TransformersViT, TransformersTwoTower, TransformersText,
                               TransformersViTModel, TransformersDinov2, TorchvisionViT]

__all__ = ["EmbeddingParts", "FAMILIES", "Family", "ForwardOnly", "ProbeParts", "TimmBeit", "TimmEva", "TimmRelPos",
           "TimmSwin", "TimmViT", "TokenContext", "TorchvisionViT", "TransformersDinov2", "TransformersText",
           "TransformersTwoTower", "TransformersViT", "TransformersViTModel",
           "UnsupportedModelError"]
