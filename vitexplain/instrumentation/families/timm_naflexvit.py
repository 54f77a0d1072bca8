"""timm's ``NaFlexVit`` (``naflexvit_*``, and the ViTs / EVAs timm builds with ``use_naflex=True``) on images
[B, C, H, W]: linear or convolutional patch embedding, learnt position embedding resized to the grid (or
factorised into rows and columns, ``parfac``), class and register tokens, RoPE on EVA blocks, average,
average-and-maximum, class-token or attention-pool (MAP) readout.

Dosovitskiy et al. (ICLR 2021) for the ViT; Dehghani et al., "Patch n' Pack: NaViT" (NeurIPS 2023) for the
factorised position embedding; Tschannen et al., "SigLIP 2" (2025) for NaFlex. What is served and why:
docs/decisions/families.md ("timm NaFlexVit")."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..blocks import BlockParts
from .base import EmbeddingParts, TokenContext, register_family, require_tiling
from .examples import Example, timm_tiny
from .stack import Stack
from .timm_common import GlobalPool, TimmSequenceFamily
from .timm_eva import EVA_BLOCKS, eva_attention, run_blocks
from .timm_vit import VIT_BLOCKS, vit_block

#: ``rope_type`` values whose tables the written-out attention applies (timm's ``apply_rot_embed_cat`` layout)
ROPE_TYPES = ("", "axial", "mixed", "dinov3", "mrope")


def _eva(block: nn.Module) -> bool:
    return type(block).__name__ in EVA_BLOCKS.layouts


def _blocks(model: nn.Module) -> Stack:
    """EVA's blocks where every block is one, else ViT's (the reasons name ViT's blocks)."""
    return EVA_BLOCKS if all(_eva(block) for block in model.blocks) else VIT_BLOCKS


def _blocks_reason(model: nn.Module) -> str | None:
    return _blocks(model).reason(model)


def _rope_reason(model: nn.Module) -> str | None:
    rope_type = _rope_type(model)
    if rope_type in ROPE_TYPES:
        return None
    return f"its rotary embedding ({rope_type}) is not one vitexplain applies (it applies {', '.join(ROPE_TYPES[1:])})"


@register_family
class TimmNaFlexViT(TimmSequenceFamily):
    """Where timm's ``NaFlexVit`` keeps its parts: ``embeds`` (``NaFlexEmbeds``: patch projection, position
    embedding, prefix tokens), ``rope``, ``blocks`` (timm's ``Block`` or ``EvaBlock``), ``norm``, the head."""

    name = "timm NaFlexVit"
    listing_order = 12
    model_classes = ("timm.models.naflexvit.NaFlexVit",)
    stack = VIT_BLOCKS
    pooling = GlobalPool(method="_pool")
    refusals = (pooling.reason, _rope_reason, _blocks_reason)
    lrp_modules = (*TimmSequenceFamily.lrp_modules, "timm.models.naflexvit.NaFlexEmbeds",
                   "timm.layers.PatchDropoutWithIndices", "timm.layers.PatchEmbedInterpolator")
    example_models = (
        Example("NaFlexViT (linear patches, registers, average pooling)", timm_tiny("naflexvit_base_patch16_gap")),
        Example("NaFlexViT, factorised positions, attention pooling",
                timm_tiny("naflexvit_base_patch16_parfac_gap", global_pool="map")))

    def block(self, module: nn.Module) -> BlockParts:
        return EVA_BLOCKS.block(module, eva_attention) if _eva(module) else vit_block(module)

    @property
    def class_token_index(self) -> int | None:
        return 0 if self.model.embeds.cls_token is not None else None

    # -- images: any size the patches tile (or that the embedding pads) -----------------------------------
    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.model.embeds.patch_size)

    @property
    def in_channels(self) -> int:
        return self.model.embeds.in_chans

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        embeds, size = self.model.embeds, tuple(images.shape[-2:])
        require_tiling(size, self.patch_size, embeds.dynamic_img_pad)
        return tuple(embeds.dynamic_feat_size(size))

    def check_inputs(self, inputs: Any) -> Any:
        if isinstance(inputs, dict):
            raise TypeError("vitexplain explains NaFlexVit on image tensors [B, C, H, W]; a dictionary of patches, "
                            "coordinates and validity masks (the NaFlex collator's) is not taken: its maps would lie "
                            "on each image's own grid")
        return super().check_inputs(inputs)

    # -- token subsets -------------------------------------------------------------------------------------
    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        embedded = self.model._forward_embeds(images, patch_coord=None, patch_valid=None, attn_mask=None)
        return embedded["patches"], TokenContext(rope=embedded["rope_embeds"])

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        return self.head(run_blocks(self.model.blocks, tokens, context.rope, self.model.rope_is_mixed))

    # -- LRP -----------------------------------------------------------------------------------------------
    def embedding(self) -> EmbeddingParts:
        """The patch tokens leave ``embeds.norm`` (an Identity unless the model norms them), before the
        position embedding is added to them in place and the prefix tokens put before them; ``pos_drop`` follows.
        The projection (a Linear of flattened patches, or a convolution) takes the pixels' rule."""
        embeds = self.model.embeds
        return EmbeddingParts(embeds.norm, embeds.proj, embeds.pos_drop,
                              as_pixels=self._as_pixels if embeds.is_linear else None)

    def _as_pixels(self, values: Tensor, grid: tuple[int, int]) -> Tensor:
        """Values laid out as timm's ``batch_patchify`` cuts an image, [B, h·w, P·P·C], as that image [B, C, H, W]
        (channels fastest within a patch, or slowest with ``patchify_channels_last=False``)."""
        (height, width), (ph, pw), channels = grid, self.patch_size, self.in_channels
        if self.model.embeds.channels_last:
            image = values.reshape(-1, height, width, ph, pw, channels).permute(0, 5, 1, 3, 2, 4)
        else:
            image = values.reshape(-1, height, width, channels, ph, pw).permute(0, 3, 1, 4, 2, 5)
        return image.reshape(-1, channels, height * ph, width * pw)


def _rope_type(model: nn.Module) -> str:
    """The model's rotary embedding kind, as ``NaFlexVitCfg.rope_type`` names it ('' without one)."""
    rope = model.rope
    if rope is None:
        return ""
    return {"RotaryEmbeddingCat": "axial", "RotaryEmbeddingMixed": "mixed",
            "RotaryEmbeddingDinoV3": "dinov3", "RotaryEmbeddingMRope": "mrope"}.get(type(rope).__name__,
                                                                                       type(rope).__name__)
