"""Model family descriptions, one module each, each family registered by its module
(:func:`~.base.register_family`); :func:`~.base.served_families` lists them.

Adding a family is one module here with a registered :class:`~.base.Family` subclass, which declares its model
classes, its blocks (:class:`~.stack.Stack`) and its example models (:class:`~.examples.Example`): nothing else to
edit. A family only recognises models of its own kind (:meth:`~.base.Family.recognises`), so the order in
which they are asked does not matter. A model no family instruments is described by its forward alone
(:class:`~.forward_only.ForwardOnly`, not registered: the fallback).
"""
from __future__ import annotations

from .base import (
                   EmbeddingParts,
                   Family,
                   ProbeParts,
                   TokenContext,
                   UnsupportedModelError,
                   register_family,
                   served_families,
)
from .forward_only import ForwardOnly

__all__ = ["EmbeddingParts", "Family", "ForwardOnly", "ProbeParts", "TokenContext", "UnsupportedModelError",
           "register_family", "served_families"]
