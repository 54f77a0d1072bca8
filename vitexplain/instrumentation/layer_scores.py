"""The target scored at blocks' outputs through the model's head (LeGrad's s_l), instead of at the model's output:
what a recording differentiates when ``record(..., layer_scores=LayerScores(...))`` asks for it."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from torch import Tensor

from .families.base import ProbeParts, UnsupportedModelError
from .recording import HEAD_FIELDS, Recorder
from .targets import Target


@dataclasses.dataclass(frozen=True)
class LayerScores:
    """The target scored at the outputs of some blocks, read through the model's head (``Family.head``),
    instead of at the model's output: what the model would score if it ended at each of those blocks.

    Every block from the lowest gradient asked for on starts its own gradient graph at its input, so the
    one backward of the layer scores' sum leaves in each block the gradient of the score read at its own
    output only (∂s_l/∂A_l for every l at the cost of one backward; a block whose output is not scored gets
    zero gradients).

    Attributes:
        blocks: the blocks whose outputs are scored (negative indices count from the end).
        mean_token: the head reads a sequence whose every token is the mean of the block's tokens (prefix
            included), so that any readout weighting the tokens reads their mean, rather than the tokens.
        final_norm: the model's final norm comes before the head (False: the head reads the tokens as they are).
    """

    blocks: Collection[int]
    mean_token: bool = False
    final_norm: bool = True

    def scored(self, recorder: Recorder, head: Callable[..., Tensor], sequence_first: bool, target: Target,
               score: str | Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        """The target's score read at each scored block's output (kept by ``recorder``) through ``head``, summed
        over the blocks -> [B] (the head's probe attention goes to the block it reads)."""
        last = recorder.tokens[-1]
        total = 0
        for block, output in recorder.outputs.items():
            if recorder.tokens[block] != last:
                raise UnsupportedModelError(
                    f"block {block} has {recorder.tokens[block]} tokens, the last block {last} (a patch merge "
                    "comes between), so the model's head cannot read its output; read blocks of the last stage only")
            if self.mean_token:
                tokens = output.transpose(0, 1) if sequence_first else output
                mean = tokens.flatten(1, -2).mean(1)
                tokens = mean.reshape(mean.shape[0], *(1,) * (tokens.ndim - 2), mean.shape[-1]).expand_as(tokens)
                output = tokens.transpose(0, 1) if sequence_first else tokens
            recorder.reading = block
            total = total + target.score(head(output, final_norm=self.final_norm), score)
        recorder.reading = None
        return total


def refuse_layer_scores(layer_scores: LayerScores | None, names: set[str], input_grad: bool, probe: ProbeParts | None,
                        readout: str) -> None:
    """Refuse what layer scores cannot give, and head fields (``names`` asked) without them."""
    if layer_scores is None:
        if names & set(HEAD_FIELDS):
            raise ValueError(f"{sorted(names & set(HEAD_FIELDS))} are recorded when the head reads blocks' "
                             "outputs: pass layer_scores")
        return
    if "probe_attn" in names and probe is None:
        raise ValueError(f"'probe_attn' needs an attention-pooling head; this model's head reads the tokens by "
                         f"{readout!r} pooling")
    if input_grad:
        raise ValueError("layer scores cut the graph at every block, "
                         "so they have no gradient with respect to the images")
    if not layer_scores.blocks:
        raise ValueError("layer_scores names no block")
