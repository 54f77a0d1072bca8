"""PA-LRP's position-embedding add: the learned position embedding's share of the relevance, kept.

Bakish, Zimerman, Chefer & Wolf, "Revisiting LRP: Positional Attribution as the Missing Ingredient for Transformer
Explainability", NeurIPS 2025. At the add y = x + p of the patch embeddings x and the position embedding p, the
ε-rule gives R_x = x ⊙ R_y / y and R_p = p ⊙ R_y / y (their ``Add.relprop`` with ``epsilon_rule``); AttnLRP keeps
R_x and loses R_p. In Gradient×Input form R_y / y is the gradient g at y under the rules, so R_p = p ⊙ g: nothing
in the backward changes, the position embedding's share is only read (docs/decisions/pa-lrp.md).
"""
from __future__ import annotations

from torch import Tensor

from ...families.base import UnsupportedModelError
from .core import current_phase, is_plain


class PositionShare:
    """A rule set's ``position`` rule that reads R_p = p ⊙ g of every patch token at the position add.

    Placed (by :func:`~..placement.lrp_rules`) on the output y of the module right after the add; p is y minus the
    patch embeddings (the prefix tokens' rows are left out: the map has none). After the backward,
    :attr:`relevance` holds R_p [B, h·w, C] in float32 (None before). One object per propagation: it keeps what it
    read.
    """

    #: the add's input is not renormalised (that is the absolute rule's step, ``abslrp``)
    renormalises_input = False

    def __init__(self) -> None:
        self.relevance: Tensor | None = None

    def __call__(self, output: Tensor, patches: Tensor | None, num_prefix_tokens: int) -> Tensor:
        if patches is None or not output.requires_grad:
            return output
        patches = patches.reshape(output.shape[0], -1, output.shape[-1])
        position = (output[:, num_prefix_tokens:] - patches).detach().float()
        phase = current_phase()

        def keep(grad: Tensor) -> None:
            if not is_plain(phase):  # the relevance's backward, not a plain one beside it
                self.relevance = position * grad[:, num_prefix_tokens:].float()

        output.register_hook(keep)
        return output


def reachable_position(adapter, method: str) -> None:
    """Refuse, in one line, a model whose position information PA-LRP here cannot give relevance to: no absolute
    position embedding added to the patch tokens (relative position biases, Swin's windows), or rotary embeddings
    (RoPE), whose rule (the uniform rule at q ⊙ cos and rot(q) ⊙ sin, per block) is not written here."""
    family = adapter.family
    if family.embedding().position_module is None:
        raise UnsupportedModelError(f"{method} gives relevance to an absolute position embedding added to the patch "
                                    f"tokens, and this {family.name} model adds none (its positions are relative "
                                    "biases or none): use attnlrp")
    if getattr(adapter.model, "rope", None) is not None:
        raise UnsupportedModelError(f"{method} has no rule for rotary position embeddings (RoPE) here, and this "
                                    f"{family.name} model rotates its queries and keys: use attnlrp")


__all__ = ["PositionShare", "reachable_position"]
