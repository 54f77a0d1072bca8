"""Test-time registers: a model's register neurons moved into one extra token, without training (Jiang et al. 2025).

Jiang, Dravid, Efros & Gandelsman, "Vision Transformers Don't Need Trained Registers" (arXiv 2506.08010, 2025;
code: github.com/nickjiang2378/test-time-registers). A few MLP units of a large ViT (DINOv2, OpenCLIP), the
*register neurons*, fire at a few patch tokens and give them the high norms that make attention sinks and the
artefacts of attention maps. At test time one token is added (zero, no position embedding) and, in every block
that holds register neurons, their activations are moved into it: set there to the largest activation of the
layer's register neurons over all tokens, zeroed at the patch tokens (Sec. 4, Eq. 2; the rule of the code's
``activate_on_registers``). Nothing is trained.

* :func:`find_register_neurons` finds them from images, as the authors' ``find_register_neurons`` does (with the
  sparsity filter their notebook turns on), and gives them as plain data: ``((layer, neuron), ...)``.
* :func:`test_time_registers` applies the transformation for the length of a ``with`` block (a forward hook on the
  module after the position embedding adds the token, one on each named block's MLP activation moves the units)
  and undoes it on exit, also after an exception; the adapter counts the token as one more prefix token, so token
  maps keep the patch grid. The attention methods take the neurons as their ``registers`` option.

The authors append the token after the patches; it is put here right after the model's prefix tokens (where trained
registers sit), which changes nothing a block computes (attention without position-dependent terms is equivariant
to the order of its tokens) and keeps every prefix token before the patches. Decisions and the comparison with the
authors' code: docs/decisions/test-time-registers.md.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from ..options import Range, block_index
from .adapter import ModelAdapter, evaluation_mode
from .attention import Sink
from .families import ForwardOnly
from .families.base import UnsupportedModelError
from .patching import ModelPatch

#: register neurons as plain data: (block, unit of its MLP activation) pairs, 0-based, the strongest first
RegisterNeurons = tuple[tuple[int, int], ...]
#: the ``registers`` option of the attention methods: (block, unit) pairs, as :func:`find_register_neurons` gives
#: them (a YAML / ``-O`` list of two-number lists too)
Registers = Sequence[tuple[Annotated[int, Range(low=0)], Annotated[int, Range(low=0)]]]


def refusal(adapter: ModelAdapter) -> str | None:
    """Why test-time registers cannot be added to the adapter's model (a clause), or None."""
    family = adapter.family
    if isinstance(family, ForwardOnly):
        return family.unreachable
    if adapter.modality != "image":
        return "it reads text, and test-time registers are a change to image models"
    if adapter.readout != "token":
        return (f"its output reads the tokens' {adapter.readout} pooling, which the extra token would enter (test-time "
                "registers need a class-token readout)")
    for index, parts in enumerate(adapter.blocks):
        attention = parts.attention
        if parts.windows is not None or attention.rope_prefix is not None or attention.position_bias is not None:
            return (f"block {index}'s attention depends on the tokens' positions (windows, rotary or relative position "
                    "terms), where an extra token has no place")
        if parts.activation is None or parts.gated_mlp is not None:
            return f"block {index}'s MLP has no described element-wise activation whose units could be moved"
    try:
        position = family.embedding().position_module
    except UnsupportedModelError:
        position = None
    if position is None:
        return "the module after its position embedding, where the extra token is added, is not described"
    return None


def _adapter(model: nn.Module | ModelAdapter) -> ModelAdapter:
    """``model``'s adapter (itself when it is one), refused in one line where test-time registers cannot apply."""
    if not isinstance(model, ModelAdapter):
        from . import adapter_for  # the package's entry point (it does not import this module)

        model = adapter_for(model)
    reason = refusal(model)
    if reason is not None:
        raise UnsupportedModelError(f"test-time registers cannot be added to this {model.model_name}: {reason}")
    return model


def _grouped(registers: Sequence[Sequence[int]], adapter: ModelAdapter) -> dict[int, list[int]]:
    """The (block, unit) pairs by block, in the order given, each unit once; blocks checked against the model."""
    grouped: dict[int, list[int]] = {}
    for pair in registers:
        if len(pair) != 2:
            raise ValueError(f"a register neuron is a (block, unit) pair, got {tuple(pair)!r}")
        layer, unit = (int(value) for value in pair)
        if not 0 <= layer < adapter.num_blocks:
            raise ValueError(f"register neuron {(layer, unit)}: block {layer} is not one of the model's "
                             f"{adapter.num_blocks} blocks (0 … {adapter.num_blocks - 1})")
        if unit not in grouped.setdefault(layer, []):
            grouped[layer].append(unit)
    if not grouped:
        raise ValueError("registers names no register neuron; give (block, unit) pairs (find_register_neurons)")
    return grouped


def _insert_token(prefix: int, module: nn.Module, args: Any, tokens: Tensor) -> Tensor:
    """The tokens after the position embedding [B, N, C] with a zero token after the ``prefix`` tokens."""
    zero = tokens.new_zeros(tokens.shape[0], 1, tokens.shape[-1])
    return torch.cat([tokens[:, :prefix], zero, tokens[:, prefix:]], dim=1)


def _move_units(prefix: int, units: list[int], layer: int, block: nn.Module, sequence_first: bool, module: nn.Module,
                args: Any, output: Tensor) -> Tensor:
    """The MLP activation [B, N, F] with the register units moved to the extra token (position ``prefix``): there,
    per image, the largest-magnitude value of those units over every token (its sign kept; the authors'
    ``sign_max``, which takes the minimum on a tie of magnitudes); at the patch tokens (after it), zero. The other
    prefix tokens keep theirs. A ``sequence_first`` family's block lays its tokens out [N, B, F] when it runs its
    own forward; the instrumented forward (which replaces ``block.forward``) runs batch first."""
    if sequence_first and "forward" not in block.__dict__:
        return _move_units(prefix, units, layer, block, False, module, args, output.transpose(0, 1)).transpose(0, 1)
    if max(units) >= output.shape[-1]:
        raise ValueError(f"register neuron ({layer}, {max(units)}): block {layer}'s MLP has {output.shape[-1]} units")
    index = torch.tensor(units, device=output.device)
    chosen = output[..., index].flatten(1)  # [B, N·k]
    high, low = chosen.amax(1), chosen.amin(1)
    value = torch.where(high.abs() > low.abs(), high, low)
    moved = output[..., index].clone()
    moved[:, prefix] = value[:, None]
    moved[:, prefix + 1:] = 0
    output = output.clone()
    output[..., index] = moved
    return output


@contextlib.contextmanager
def test_time_registers(model: nn.Module | ModelAdapter,
                        registers: Sequence[Sequence[int]] | None) -> Iterator[ModelAdapter]:
    """Within the block, ``model`` runs with one test-time register holding the ``registers`` neurons' activations
    (see the module docstring); yields its adapter, whose recordings count the token as one more prefix token
    (explain through it: ``explain(adapter, ...)``). On exit, also after an exception, the hooks are removed and
    the adapter's count restored: the model is as it was. ``registers`` None: nothing is changed."""
    if registers is None:
        yield model if isinstance(model, ModelAdapter) else _adapter(model)
        return
    adapter = _adapter(model)
    grouped = _grouped(registers, adapter)
    position = adapter.family.embedding().position_module
    if any(isinstance(hook, functools.partial) and hook.func is _insert_token
           for hook in position._forward_hooks.values()):
        raise ValueError("this model already runs with test-time registers (one with block is enough)")
    prefix = adapter.num_prefix_tokens
    with ModelPatch() as patch:
        patch.hook(position.register_forward_hook(functools.partial(_insert_token, prefix)))
        for layer, units in grouped.items():
            parts = adapter.blocks[layer]
            patch.hook(parts.activation.register_forward_hook(
                functools.partial(_move_units, prefix, units, layer, parts.module, adapter.sequence_first)))
        patch.set_attribute(adapter, "num_prefix_tokens", prefix + 1)
        yield adapter


test_time_registers.__test__ = False  # a context manager, not a test, wherever pytest meets its name


class _BlockOutput(Sink):
    """Keeps one block's output tokens [B, N, C] of an instrumented forward."""

    def __init__(self, block: int):
        self.block, self.tokens = block, None

    def wants(self, block: int, name: str) -> bool:
        return block == self.block and name == "block_output"

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == self.block and "block_output" in tensors:
            self.tokens = tensors["block_output"]


def neuron_scores(model: nn.Module | ModelAdapter, images: Tensor, *, outlier_norm: float = 30.0,
                  outlier_layer: int = -1, sparsity_filter: bool = True, sparsity_share: float = 0.5,
                  sparsity_activation: float = 0.5, batch_size: int = 16) -> Tensor:
    """Each MLP unit's register score [blocks, units] (float64), the statistic the authors rank by.

    For each image with *outlier tokens* (tokens, class token included, whose output of block ``outlier_layer`` has
    an L2 norm above ``outlier_norm``): a unit's mean |activation| over those tokens; with ``sparsity_filter``, 0
    for a unit that is below ``sparsity_activation`` at fewer than ``sparsity_share`` of the tokens (a unit active
    almost everywhere is no register neuron). The score is its mean over the images that have outlier tokens (the
    others are left out, as in the authors' ``find_register_neurons``). Images are run ``batch_size`` at a time (two
    forwards each: the outlier tokens first, then the activations), each image on its own."""
    adapter = _adapter(model)
    layer = block_index("outlier_layer", outlier_layer, adapter.num_blocks)
    totals: list[Tensor | None] = [None] * adapter.num_blocks
    counted = 0
    with adapter.call(images, reads_target=False) as call, torch.no_grad(), evaluation_mode(adapter.model):
        for chunk in call.inputs.split(batch_size):
            sink = _BlockOutput(layer)
            with adapter.instrumented(sink=sink):
                adapter.forward(chunk)
            outliers = sink.tokens.float().norm(dim=-1) > outlier_norm  # [b, N]
            kept = outliers.any(1)
            if not kept.any():
                continue
            outliers, counted = outliers[kept], counted + int(kept.sum())

            def score(index: int, module: nn.Module, args: Any, output: Tensor) -> None:
                units = output[kept].double()  # [b', N, F]
                at = outliers[..., None].double()
                mean = (units.abs() * at).sum(1) / at.sum(1)
                if sparsity_filter:
                    mean = mean * ((units < sparsity_activation).sum(1) >= sparsity_share * units.shape[1])
                totals[index] = mean.sum(0) if totals[index] is None else totals[index] + mean.sum(0)

            with ModelPatch() as patch, adapter.instrumented():
                for index, parts in enumerate(adapter.blocks):
                    patch.hook(parts.activation.register_forward_hook(functools.partial(score, index)))
                adapter.forward(chunk)
    if counted == 0:
        raise ValueError(f"no token of the {images.shape[0]} image(s) has a norm above outlier_norm={outlier_norm:g} "
                         f"at block {layer}: lower outlier_norm, or give more images")
    if len({total.shape[0] for total in totals}) != 1:
        raise UnsupportedModelError(f"the MLPs of this {adapter.model_name} differ in width, so its units are not "
                                    "ranked together")
    return torch.stack(totals) / counted


def find_register_neurons(model: nn.Module | ModelAdapter, images: Tensor, *, outlier_norm: float = 30.0,
                          outlier_layer: int = -1, top_k: int = 10, highest_layer: int | None = None,
                          lowest_layer: int = 0, sparsity_filter: bool = True, batch_size: int = 16) -> RegisterNeurons:
    """The ``top_k`` units of blocks ``lowest_layer`` … ``highest_layer`` with the highest register score
    (:func:`neuron_scores`), the highest first (ties: the lower block, then the lower unit), as (block, unit) pairs.

    The authors' procedure (``find_register_neurons`` and ``filter_layers`` of their ``shared/``, as their
    ``register_neurons.ipynb`` calls them): 100 random ImageNet images, the sparsity filter on; for OpenCLIP ViT-B/16
    ``outlier_norm=30``, ``outlier_layer=-1``, ``highest_layer=5``, ``top_k=10``; for DINOv2 ViT-L/14
    ``outlier_norm=150``, ``outlier_layer=-2``, ``highest_layer=17``, ``top_k=50`` (their ``configs/``). The
    threshold and the layers are the model's: a norm between the outliers' and the other tokens', from the layer
    where the outliers are clear, and the neurons below the layer where they appear.
    """
    adapter = _adapter(model)
    scores = neuron_scores(adapter, images, outlier_norm=outlier_norm, outlier_layer=outlier_layer,
                           sparsity_filter=sparsity_filter, batch_size=batch_size)
    lowest = block_index("lowest_layer", lowest_layer, adapter.num_blocks)
    highest = adapter.num_blocks - 1 if highest_layer is None else block_index("highest_layer", highest_layer,
                                                                               adapter.num_blocks)
    blocks, units = scores.shape
    allowed = torch.zeros(blocks, dtype=torch.bool, device=scores.device)
    allowed[lowest:highest + 1] = True
    ranked = torch.where(allowed[:, None], scores, -torch.inf).flatten()
    order = torch.sort(ranked, descending=True, stable=True).indices[:min(top_k, int(allowed.sum()) * units)]
    return tuple((int(i) // units, int(i) % units) for i in order.tolist())


__all__ = ["RegisterNeurons", "Registers", "find_register_neurons", "neuron_scores", "refusal", "test_time_registers"]
