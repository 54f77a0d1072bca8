"""What one instrumented forward (and optional backward) of a Transformer leaves behind.

These containers are model-family neutral: every family fills them the same way, so the
explanation methods only ever read a :class:`Recording` and never look inside a model. A recording
holds only what was asked for (:class:`Recorder`): the fields and blocks a method names, and the
gradients of some fields in some blocks — or, of each block's attention, only what the method's
reduction makes of it — so memory and backward cost follow the method.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from .attention import Sink
from .blocks import BlockParts
from .geometry import TokenGeometry
from .instrumented import READOUT
from .targets import Target
from .windows import WindowedMatrix, WindowLayout, mixing

#: Per-block tensors that can be recorded, and whose gradients can be asked for.
BLOCK_FIELDS = ("residual", "attn_input", "q", "k", "v", "attn_logits", "attn", "attn_branch", "mlp_residual",
                "mlp_input", "mlp_branch", "block_output")
#: The attention's N×N fields, which a recording can reduce per block instead of keeping (:class:`Recorder`).
ATTENTION_FIELDS = ("attn_logits", "attn")
#: What the model's head leaves when it reads a block's output (recorded with ``layer_scores`` only, see
#: :class:`~vitexplain.instrumentation.layer_scores.LayerScores`).
HEAD_FIELDS = ("probe_attn",)


@dataclass
class BlockRecord:
    """Activations of one Transformer block for a batch (the fields not asked for are None).

    Shapes use B = batch, H = heads, N = tokens (prefix tokens first), C = width, D = head width.
    Windowed blocks (Swin) hold their attention per window: [B, H, windows, T, T] with T tokens per
    window (see ``windows``); their q, k and v are in token order like every other field. A block of a
    later stage of a hierarchical model has fewer tokens (patch merging).

    Attributes:
        residual: block input, the residual stream [B, N, C].
        attn_input: the (normalised) input the attention sublayer reads [B, N, C].
        q, k, v: per-head query (after any q-norm and RoPE, before the 1/√D scale), key and value [B, H, N, D].
        attn_logits: attention scores before the softmax, q kᵀ / √D plus any bias and mask [B, H, N, N]
            (windowed: [B, H, windows, T, T]).
        attn: attention probabilities [B, H, N, N] (row = query token; windowed: [B, H, windows, T, T]).
        attn_branch: what the attention sublayer adds to the residual stream [B, N, C].
        mlp_residual: the residual stream the feed-forward branch is added to [B, N, C]: residual +
            attn_branch, or in ``post_norm`` blocks ``mlp_input`` (a tensor the backward keeps anyway).
        mlp_input: the input the feed-forward sublayer reads [B, N, C].
        mlp_branch: what the feed-forward sublayer adds [B, N, C].
        probe_attn: the attention of the model's attention-pooling head reading this block's output
            [B, H, 1, N'] (N' the tokens it reads), when the block's output is scored through the head
            (:class:`~vitexplain.instrumentation.layer_scores.LayerScores`).
        head_projection: per-head output projection [H, D, C] (LayerScale folded in), so that
            ``v[:, h] @ head_projection[h]`` is head h's share of ``attn_branch`` without the output bias;
            None when the branch is not a sum over heads (output norm, gate, post-branch norm) or not asked.
        layout: ``pre_norm``, ``res_post_norm`` or ``post_norm`` (see :mod:`.blocks`).
        block_output: the block output, recorded where it is not a sum (``post_norm`` blocks, and blocks ending
            with a norm of the residual stream, :attr:`~.blocks.BlockParts.main_norm`) and wherever it, or its
            gradient, is asked for (:attr:`output` reads it).
        windows: for windowed attention, the :class:`~vitexplain.instrumentation.windows.WindowLayout`
            that maps per-window attention to tokens; None for global attention.
        grads: gradient of the target score with respect to any of the fields above, by field name.
        reduced: what the recording's ``reduce`` made of this block's attention (see :class:`Recorder`);
            None where it did not run.
        index: the block's position in the model (0 first).
    """

    residual: Tensor | None = None
    attn_input: Tensor | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    attn_logits: Tensor | None = None
    attn: Tensor | None = None
    attn_branch: Tensor | None = None
    mlp_residual: Tensor | None = None
    mlp_input: Tensor | None = None
    mlp_branch: Tensor | None = None
    probe_attn: Tensor | None = None
    head_projection: Tensor | None = None
    layout: str = "pre_norm"
    block_output: Tensor | None = None
    windows: Any = None
    grads: dict[str, Tensor] = field(default_factory=dict)
    reduced: Any = None
    index: int = 0

    @property
    def output(self) -> Tensor:
        """The block output, i.e. the next block's residual stream [B, N, C]."""
        if self.block_output is not None:
            return self.block_output
        return self.residual + self.attn_branch + self.mlp_branch

    def mixing(self, matrix: Tensor) -> Tensor | WindowedMatrix:
        """A token-by-token matrix in this block's attention layout ([B, N, N], or per window [B, windows,
        T, T] for windowed attention) as a factor of the token products (``methods/_products.py``)."""
        return mixing(self.windows, matrix)

    def per_key(self, values: Tensor) -> Tensor:
        """Per-token values [..., N] shaped to scale the columns (keys) of this block's attention:
        [..., 1, N], or [..., windows, 1, T] for windowed attention (0 at padding slots)."""
        if self.windows is None:
            return values[..., None, :]
        return self.windows.windows_of(values)[..., None, :]

    def attended_by(self, per_query: Tensor) -> Tensor:
        """For every key token, the sum of ``per_query`` [B, H, N, D] over the queries whose attention
        includes it (all queries for global attention; the window's unmasked ones for windowed) -> [B, H, N, D]."""
        if self.windows is None:
            return per_query.sum(2, keepdim=True).expand_as(per_query)
        windowed = self.windows.windows_of(per_query, dim=2)  # [B, H, windows, T, D]
        connected = self.windows.connected.to(per_query.dtype)  # [windows, query, key]
        return self.windows.tokens_of(torch.einsum("wqk,bhwqd->bhwkd", connected, windowed), dim=2)


@dataclass
class Recording:
    """Everything one instrumented pass over a batch recorded.

    Attributes:
        logits: model output [B, classes], or [B, D] for a model without a classifier head.
        targets: the class explained for each image [B] (the prediction when none was given); -1 when
            the target is a score function or an embedding direction rather than a class.
        scores: the target score that was back-propagated, one per image [B].
        blocks: one :class:`BlockRecord` per Transformer block, input to output.
        geometry: where the tokens sit: grid, prefix tokens, class token, readout, stages, window layouts
            (:class:`~.geometry.TokenGeometry`); maps, readout rows and block matrices are read through it.
        input_grad: gradient of the scores with respect to the images, when asked for.
        target: the resolved target (:class:`~vitexplain.instrumentation.targets.Target`), to score other
            forwards of the same inputs by.
    """

    logits: Tensor
    targets: Tensor
    scores: Tensor
    blocks: list[BlockRecord]
    geometry: TokenGeometry
    input_grad: Tensor | None = None
    target: Any = None

    @property
    def embeddings(self) -> Tensor:
        """The token embeddings fed to the first block [B, N, C]."""
        return self.blocks[0].residual

    @property
    def batch_size(self) -> int:
        return self.logits.shape[0]


class Recorder(Sink):
    """Keeps the recording fields asked for while an instrumented forward runs, the pooling head's attention in its
    readout slot (or, while the head reads a scored block's output, as that block's ``probe_attn``), and the outputs
    of the scored blocks; then fills the :class:`Recording` and runs its backward.

    Args:
        num_blocks: blocks of the model.
        fields: the fields to keep (None: all of :data:`BLOCK_FIELDS`), or a mapping from fields to the
            blocks each is kept in (None: ``blocks``).
        blocks: the blocks whose fields are kept (None: all); negative indices count from the end.
        grads: fields whose gradient is wanted, each with the blocks it is wanted in (None: all).
        anchor: given, the attention fields (:data:`ATTENTION_FIELDS`) asked for — values or gradients —
            are not kept: in each block that asks for them, they reach :attr:`reduce` as the backward
            passes the block's attention (see :meth:`~.attention.Sink.anchor`), and this leaf, which
            every such attention depends on, is what the backward must reach.
        scored: the blocks whose outputs the target is scored at
            (:class:`~vitexplain.instrumentation.layer_scores.LayerScores`).
    """

    def __init__(self, num_blocks: int, fields: Collection[str] | Mapping[str, Collection[int] | None] | None = None,
                 blocks: Collection[int] | None = None, grads: Mapping[str, Collection[int] | None] | None = None,
                 anchor: Tensor | None = None, scored: Collection[int] = ()):
        everything = range(num_blocks)
        resolve = lambda chosen: set(everything) if chosen is None else {i % num_blocks for i in chosen}  # noqa: E731
        default = resolve(blocks)
        if not isinstance(fields, Mapping):
            fields = dict.fromkeys(BLOCK_FIELDS if fields is None else fields)
        #: field -> blocks it is kept in
        self.fields = {name: default if chosen is None else resolve(chosen) for name, chosen in fields.items()}
        self.grads = {name: resolve(chosen) for name, chosen in (grads or {}).items()}
        self.entries: list[dict[str, Tensor]] = [{} for _ in everything]
        #: tokens entering each block (filled whatever is kept)
        self.tokens: list[int] = [0 for _ in everything]
        #: the attention of an attention-pooling head [B, H, latents, N], when the model has one
        self.readout_attn: Tensor | None = None
        #: a max-pooling head's selection of the tokens it pools, averaged over the channels [B, N'] (see
        #: :func:`~vitexplain.instrumentation.families.base.max_selection`)
        self.readout_selection: Tensor | None = None
        #: each windowed block's layout in this forward (None for global attention)
        self.layouts: list[WindowLayout | None] = [None for _ in everything]
        self.anchor_leaf = anchor
        #: the blocks whose attention fields go to :attr:`reduce` instead of being kept
        self.reduced_blocks = set() if anchor is None else {
            block for name in ATTENTION_FIELDS for block in self.fields.get(name, set()) | self.grads.get(name, set())}
        #: (block, its attention fields and their gradients, asked for and laid out) -> None, called in the backward
        self.reduce: Callable[[int, dict[str, Tensor], dict[str, Tensor]], None] | None = None
        self.scored = set(scored)
        #: each scored block's output, as the block returns it (in the graph)
        self.outputs: dict[int, Tensor] = {}
        #: the block whose output the head is reading, None while the model runs
        self.reading: int | None = None

    def layout(self, block: int, layout: WindowLayout) -> None:
        self.layouts[block] = layout

    def wants(self, block: int, name: str) -> bool:
        if block == READOUT:
            return name in ("attn", "selection")
        if name == "output":
            return block in self.scored
        return block in self.fields.get(name, ()) or block in self.grads.get(name, ())

    def wants_gradient(self, block: int, name: str) -> bool:
        return block in self.grads.get(name, ())

    def anchor(self, block: int) -> Tensor | None:
        return self.anchor_leaf if block in self.reduced_blocks else None

    def put(self, block: int, **tensors: Tensor) -> None:
        if block == READOUT and self.reading is not None:  # the head reading a scored block's output
            if "attn" in tensors:
                self.put(self.reading, probe_attn=tensors["attn"])
            return
        if block == READOUT:
            self.readout_attn = tensors.get("attn", self.readout_attn)
            self.readout_selection = tensors.get("selection", self.readout_selection)
            return
        if "output" in tensors:
            self.outputs[block] = tensors["output"]
            return
        if "residual" in tensors:
            self.tokens[block] = tensors["residual"].shape[-2]
        for name, tensor in tensors.items():
            if self.wants(block, name) or name == "block_output":
                self.entries[block][name] = tensor

    def put_backward(self, block: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        asked = {name: tensor for name, tensor in tensors.items() if block in self.fields.get(name, ())}
        gradients = {name: gradient for name, gradient in gradients.items() if self.wants_gradient(block, name)}
        self.reduce(block, self.laid_out(block, asked), self.laid_out(block, gradients))

    def laid_out(self, block: int, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """A block's recorded tensors in the recording's layout (a windowed block's per window, see
        :meth:`~.windows.WindowLayout.recorded`)."""
        layout = self.layouts[block]
        return tensors if layout is None else layout.recorded(tensors)

    @property
    def first_gradient_block(self) -> int | None:
        """The lowest block holding a tensor whose gradient is wanted or whose attention is reduced in the
        backward (None: neither in any block)."""
        found = [min(chosen) for chosen in (*self.grads.values(), self.reduced_blocks) if chosen]
        return min(found) if found else None

    def gradient_inputs(self) -> list[tuple[int, str, Tensor]]:
        """(block, field, tensor) of every recorded tensor whose gradient is wanted, in block order."""
        return [(block, name, self.entries[block][name]) for block in range(len(self.entries))
                for name in BLOCK_FIELDS + HEAD_FIELDS
                if block in self.grads.get(name, ()) and name in self.entries[block]]

    def recording(self, parts: Sequence[BlockParts], outputs: Tensor, target: Target, scores: Tensor,
                  geometry: TokenGeometry) -> Recording:
        """What the forward left, as a :class:`Recording` of the blocks described by ``parts`` (gradients to come)."""
        records = []
        for index, (entry, layout) in enumerate(zip(self.entries, self.layouts)):
            values = self.laid_out(index, {name: tensor.detach() for name, tensor in entry.items()})
            projection = parts[index].head_projection() if "v" in values else None
            records.append(BlockRecord(**values, head_projection=projection, layout=parts[index].layout,
                                       windows=layout, index=index))
        return Recording(logits=outputs.detach(), targets=target.labels(outputs.shape[0], outputs.device),
                         scores=scores.detach(), blocks=records, target=target, geometry=geometry)

    def backward(self, scores: Tensor, recording: Recording,
                 reduce: Callable[[Recording, BlockRecord], Any] | None, images: Tensor | None) -> None:
        """The backward of the summed ``scores``: the gradients asked for into ``recording`` (each block's
        ``grads``, ``input_grad`` with respect to ``images``), and ``reduce``'s value of each reduced block's
        attention as it passes."""
        def reduce_block(index: int, tensors: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
            block = recording.blocks[index]
            block.reduced = reduce(recording, replace(block, **tensors, grads=gradients))

        self.reduce = reduce_block
        inputs = self.gradient_inputs()
        tensors = [tensor for _, _, tensor in inputs] + ([images] if images is not None else [])
        anchors = [self.anchor_leaf] if self.reduced_blocks else []
        found = torch.autograd.grad(scores.sum(), tensors + anchors, allow_unused=True)
        found = [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, found)]
        if images is not None:
            recording.input_grad = found.pop()
        by_block: dict[int, dict[str, Tensor]] = {}
        for (block, name, _), gradient in zip(inputs, found):
            by_block.setdefault(block, {})[name] = gradient
        for block, gradients in by_block.items():
            recording.blocks[block].grads = self.laid_out(block, gradients)


def identity_like(matrix: Tensor) -> Tensor:
    """Batch of identity matrices shaped like ``matrix`` [..., N, N]."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    return eye.expand_as(matrix).clone()
