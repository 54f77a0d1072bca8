"""Where the LRP rules of :mod:`vitexplain.instrumentation.lrp` go in transformers' ViT / DeiT image classifiers.

Their layers compute what timm's blocks compute (pre-norm attention and MLP, two residual adds),
so each rule lands on the same operation as in timm and a network's relevance does not depend on
which library holds it. Where timm's ViT has an eval-mode dropout that transformers' lacks (on the
attention probabilities, after the MLP activation, before the head), the absolute rule set puts its
dropout rule there too (:func:`~vitexplain.instrumentation.lrp.absolute_passthrough`); the other rule
sets pass relevance through dropouts unchanged, so for them nothing is added. Likewise the separate
q / k / v projections count as one layer, as timm's single ``qkv`` Linear, whose input the absolute
rule renormalises once.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .base import ModelAdapter
from .lrp import RuleWriter, absolute_passthrough, require_rules_for


def _attention_forward(attention: nn.Module, hidden_states: Tensor, attention_mask: Tensor | None = None,
                       *args: Any, writer: RuleWriter, **kwargs: Any) -> tuple[Tensor, None]:
    """``ViTAttention.forward`` / ``DeiTAttention.forward`` written out, the softmax and both products under the rules."""
    if attention_mask is not None:
        raise NotImplementedError("LRP through masked attention is not supported")
    batch, tokens, _ = hidden_states.shape
    hidden_states = writer.fused_input(hidden_states)

    def heads(linear: nn.Linear) -> Tensor:
        return linear(hidden_states).view(batch, tokens, -1, attention.head_dim).transpose(1, 2)

    dropout = absolute_passthrough if writer.absolute_dropouts else None
    mixed = writer.attend(heads(attention.q_proj) * attention.scaling, heads(attention.k_proj),
                          heads(attention.v_proj), probability_dropout=dropout)
    return attention.o_proj(mixed.transpose(1, 2).reshape(batch, tokens, -1)), None


def _layer_forward(layer: nn.Module, hidden_states: Tensor, attention_mask: Tensor | None = None,
                   *args: Any, add, **kwargs: Any) -> Tensor:
    """``ViTLayer.forward`` / ``DeiTLayer.forward`` with both residual adds done by ``add``."""
    attended, _ = layer.attention(layer.layernorm_before(hidden_states), attention_mask)
    hidden_states = add(hidden_states, layer.dropout(attended))
    return add(hidden_states, layer.dropout(layer.mlp(layer.layernorm_after(hidden_states))))


def _written_classes() -> tuple[type, ...]:
    """The transformers classes whose forward :func:`apply_rules` knows (or whose modules hold no computation)."""
    from transformers.models.deit import modeling_deit as deit
    from transformers.models.vit import modeling_vit as vit

    return (vit.ViTForImageClassification, vit.ViTModel, vit.ViTEmbeddings, vit.ViTPatchEmbeddings, vit.ViTLayer,
            vit.ViTAttention, vit.ViTMLP, deit.DeiTForImageClassification, deit.DeiTForImageClassificationWithTeacher,
            deit.DeiTModel, deit.DeiTEmbeddings, deit.DeiTPatchEmbeddings, deit.DeiTLayer, deit.DeiTAttention,
            deit.DeiTMLP)


def _covered(model: nn.Module):
    """Whether the rules cover a module: the classes written here, plain layers, the MLP activations
    and the patch convolution."""
    base = model.base_model
    exempt = {id(layer.mlp.activation_fn) for layer in base.layers} | {id(base.embeddings.patch_embeddings.projection)}
    allowed = (*_written_classes(), nn.Linear, nn.LayerNorm, nn.Dropout, nn.Identity, nn.ModuleList)
    return lambda module: id(module) in exempt or type(module) in allowed


def apply_rules(adapter: ModelAdapter, writer: RuleWriter) -> None:
    """Place ``writer``'s rules on the adapter's transformers ViT / DeiT (see :meth:`ModelAdapter.apply_lrp_rules`)."""
    model = adapter.model
    require_rules_for(model, _covered(model))
    base, embeddings = model.base_model, model.base_model.embeddings
    if writer.absolute_dropouts:  # timm's head dropout, before each classifier's own rule
        for head in model.children():
            if isinstance(head, nn.Linear):
                writer.patch.hook(head.register_forward_pre_hook(lambda module, args: (absolute_passthrough(args[0]),)))
    projections = [linear for layer in base.layers for linear in
                   (layer.attention.q_proj, layer.attention.k_proj, layer.attention.v_proj)]
    writer.layers(model, embeddings.dropout, fused=tuple(projections))
    for layer in base.layers:
        writer.activation(layer.mlp.activation_fn, then_dropout=True)
        writer.replace_forward(layer.attention, _attention_forward, writer=writer)
        writer.replace_forward(layer, _layer_forward, add=writer.residual_add())
    writer.blocks(base.layers)
    writer.embeddings(embeddings.patch_embeddings, embeddings.patch_embeddings.projection, embeddings.dropout,
                      adapter.num_prefix_tokens)
