"""A gating activation x·g(x) with its gate g held constant: LibraGrad's rule for GELU and SiLU.

Mehri, Baghshah & Pilehvar, "LibraGrad: Balancing Gradient Flow for Universally Better Vision Transformer
Attributions", CVPR 2025: a gated unit's gradient path through its gate is pruned, so the activation passes the
gradient g(x) instead of g(x) + x·g'(x). The authors' timm fork (``GELUDecomposed`` and ``FairSiLU`` of
``timm/night/decomposition.py``, gradient mode ``LineX_ZO``) computes g in closed form and detaches it; so does
:class:`ConstantGate` for torch's own modules. Another activation module (timm's or transformers' GELU, open_clip's
QuickGELU) is read as the ratio act(x) / x, the same gate up to float rounding (0 where x is exactly 0, as LRP's
pass-through rule). An activation that is no gate (a sigmoid or tanh, e.g. the gate branch of timm's ``GluMlp``)
keeps its own derivative, as the authors' ``FairGluMlp`` leaves it.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .core import passes_unchanged, with_gradient_of
from .modules import ModuleRule

#: activations that are not of the form x·g(x): their derivative is left as it is
NOT_GATES = (nn.Sigmoid, nn.Tanh, nn.Hardsigmoid, nn.Softsign, nn.Softmax)


def closed_gate(module: nn.Module, x: Tensor) -> Tensor | None:
    """g(x) of torch's own gating activations (GELU exact or tanh-approximated, SiLU, ReLU), None for others."""
    if isinstance(module, nn.GELU):
        if module.approximate == "tanh":
            return 0.5 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))
        return 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    if isinstance(module, nn.SiLU):
        return torch.sigmoid(x)
    if isinstance(module, nn.ReLU):
        return (x > 0).to(x.dtype)
    return None


class ConstantGate(ModuleRule):
    """act(x) = x·g(x) with g held constant in the backward: the gradient reaching x is g(x) times the incoming one."""

    def output(self, module: nn.Module, x: Tensor, output: Tensor) -> Tensor:
        if isinstance(module, NOT_GATES):
            return output
        gate = closed_gate(module, x.detach())
        if gate is None:
            return passes_unchanged(output, x)
        return with_gradient_of(output, x * gate)


__all__ = ["ConstantGate", "NOT_GATES", "closed_gate"]
