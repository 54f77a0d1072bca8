"""Transition attention maps (Yuan et al., NeurIPS 2021 XAI4Debugging workshop)."""
from __future__ import annotations

from torch import Tensor

from ..instrumentation import ModelAdapter
from ..options import PositiveInt
from ..registry import register_method
from ._gradients import IntegrationSteps, integrated_gradient_weights, resolve_start_layer
from ._products import push_rows

#: First block of the transition chain in the authors' code (``start_layer=4``) for 12-block ViT-B.
AUTHORS_START_LAYER = 4


@register_method(cost=lambda o: 3 * o["n_steps"] + 3)
def tam(adapter: ModelAdapter, images: Tensor, target=None, *, start_layer: int | None = None,
        n_steps: IntegrationSteps = 20, integrated: bool = True, batch_size: PositiveInt = 16) -> Tensor:
    """Transition attention maps: a Markov chain over the blocks' attention, weighted by integrated gradients.

    Yuan, Li, Xiong, Cao & Dou, "Explaining Information Flow Inside Vision Transformers Using Markov
    Chain", NeurIPS 2021 XAI4Debugging workshop. The tokens after each block are the states of a
    Markov chain whose transition matrix is the head-averaged attention Ā_l (plus the identity of the
    skip connection); the class token's state is carried from the last block down to ``start_layer``
    and weighted element-wise by the integrated gradient of the last attention map:

        s = Ā_L[cls, :];   s <- s (Ā_l + I)  for l = L-1 … start_layer;
        W = mean_h ( (1/n_steps) Σ_k ∂y_c/∂A_L,h[cls, :] (a_k x) )^+,  a_k = k/(n_steps-1);
        map = (s ⊙ W)[patches].

    The formulas, the transition matrices without row renormalisation, the gradient of the target
    logit at the softmax output and the integration path (zero image to the image, both ends,
    ``np.linspace(0, 1, n_steps)``) follow the authors' ``transition_attention_maps``
    (XianrenYty/Transition_Attention_Maps); blocks are 0-based here, L is the last block. Hierarchical
    models: docs/decisions/families.md.

    Options:
        start_layer: lowest block whose attention enters the chain (0-based, negative counts from
            the end). None = the authors' 4 for a 12-block ViT-B, scaled to the model's depth
            (4·depth // 12).
        n_steps: integration steps (the authors' 20); all steps of all images run batched.
        integrated: False weights by the plain gradient at the image (the authors' ``with_integral``).
        batch_size: scaled images per forward/backward pass of the integration; bounds memory only.
    """
    start = resolve_start_layer(start_layer, AUTHORS_START_LAYER, adapter.num_blocks)
    record = adapter.record(images, target, fields=("attn",), blocks=range(start, adapter.num_blocks),
                            grads={} if integrated else {"attn": (-1,)})
    last, geometry = record.blocks[-1], record.geometry
    lower = [block.mixing(block.attn.mean(1)) for block in record.blocks[start:-1]]
    states = push_rows(geometry.readout_rows(last.mixing(last.attn.mean(1))), lower, stages=geometry.stages)
    if integrated:
        weights = integrated_gradient_weights(adapter, images, record.target, n_steps=n_steps, batch_size=batch_size)
    else:
        weights = geometry.readout_rows(last.mixing(last.grads["attn"])).clamp(min=0).mean(1)
    # on a hierarchical model the two factors lie on different stages: they meet on the map's grid
    return geometry.patch_map(states) * geometry.patch_map(weights)
