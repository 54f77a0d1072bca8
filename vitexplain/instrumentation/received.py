"""Inputs as the adapter receives them: checked once, where a call on the model takes them, then only placed.

A user's inputs are checked (:func:`checked`: the family's check, of the images as the described model sees them
when the adapter preprocesses) and moved to the model's device and dtype. What a method derives from checked inputs
within a call (masked, noisy, interpolated copies) is only moved (:func:`placed`): a call
(:class:`~vitexplain.instrumentation.adapter.Call`) is the mark that its inputs were checked, so nothing re-checks
them, and no finite-value check waits for the device at every forward (docs/decisions/adapter-call.md).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .families.base import Family, check_images
from .inputs import TokenBatch
from .modes import evaluation_mode


def checked(family: Family, preprocessing: nn.Module | None, model: nn.Module, inputs: Any) -> Any:
    """What the user passed, checked by ``family`` and moved to ``model``'s device (and, for images, dtype); with
    ``preprocessing``, images are checked as the described model sees them (preprocessed)."""
    if preprocessing is None:
        inputs = family.check_inputs(inputs)
    else:
        inputs = check_images(inputs, grid_size=lambda images: None)
        family.check_inputs(as_seen(preprocessing, model, inputs))
    return placed(model, inputs)


def placed(model: nn.Module, inputs: Any) -> Any:
    """Checked ``inputs`` on ``model``'s device (images also in its dtype)."""
    parameter = next(model.parameters())
    if isinstance(inputs, TokenBatch):
        return inputs.to(parameter.device)
    return inputs.to(device=parameter.device, dtype=parameter.dtype)


def as_seen(preprocessing: nn.Module, model: nn.Module, images: Tensor) -> Tensor:
    """``images`` through ``preprocessing`` without gradients, ``model`` in eval mode: what the described model would
    check."""
    parameter = next(model.parameters())
    with torch.no_grad(), evaluation_mode(model):
        return preprocessing(images.to(device=parameter.device, dtype=parameter.dtype))
