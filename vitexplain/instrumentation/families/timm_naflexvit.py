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
from .base import EmbeddingParts, TokenContext, register_family, require_tiling, timm_example
from .timm_common import TimmSequenceFamily, timm_layer_classes
from .timm_eva import BLOCK_LAYOUTS as EVA_BLOCKS
from .timm_eva import eva_block, eva_blocks_reason, run_blocks
from .timm_vit import vit_block, vit_blocks_reason

#: ``rope_type`` values whose tables the written-out attention applies (timm's ``apply_rot_embed_cat`` layout)
ROPE_TYPES = ("", "axial", "mixed", "dinov3", "mrope")


@register_family
class TimmNaFlexViT(TimmSequenceFamily):
    """Where timm's ``NaFlexVit`` keeps its parts: ``embeds`` (``NaFlexEmbeds``: patch projection, position
    embedding, prefix tokens), ``rope``, ``blocks`` (timm's ``Block`` or ``EvaBlock``), ``norm``, the head."""

    name = "timm NaFlexVit"
    listing_order = 12
    pool_method = "_pool"

    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        from timm.models.naflexvit import NaFlexVit

        return isinstance(model, NaFlexVit)

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        if reason := cls.head_pooling_reason(model):
            return reason
        rope_type = _rope_type(model)
        if rope_type not in ROPE_TYPES:
            return (f"its rotary embedding ({rope_type}) is not one vitexplain applies "
                    f"(it applies {', '.join(ROPE_TYPES[1:])})")
        kinds = {type(block).__name__ in EVA_BLOCKS for block in model.blocks}
        return eva_blocks_reason(model.blocks) if kinds == {True} else vit_blocks_reason(model.blocks)

    @classmethod
    def examples(cls):
        return {"NaFlexViT (linear patches, registers, average pooling)": timm_example("naflexvit_base_patch16_gap"),
                "NaFlexViT, factorised positions, attention pooling": timm_example("naflexvit_base_patch16_parfac_gap",
                                                                                   global_pool="map")}

    def block(self, module: nn.Module) -> BlockParts:
        return eva_block(module) if type(module).__name__ in EVA_BLOCKS else vit_block(module)

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

    def lrp_allowed(self) -> tuple[type, ...]:
        from timm.layers import PatchDropoutWithIndices, PatchEmbedInterpolator
        from timm.models.naflexvit import NaFlexEmbeds, NaFlexVit

        return (NaFlexVit, NaFlexEmbeds, *{type(parts.module) for parts in self.blocks},
                *{type(parts.attention.module) for parts in self.blocks}, *timm_layer_classes(),
                PatchDropoutWithIndices, PatchEmbedInterpolator, type(self.model.rope or nn.Identity()))


def _rope_type(model: nn.Module) -> str:
    """The model's rotary embedding kind, as ``NaFlexVitCfg.rope_type`` names it ('' without one)."""
    rope = model.rope
    if rope is None:
        return ""
    return {"RotaryEmbeddingCat": "axial", "RotaryEmbeddingMixed": "mixed",
            "RotaryEmbeddingDinoV3": "dinov3", "RotaryEmbeddingMRope": "mrope"}.get(type(rope).__name__,
                                                                                       type(rope).__name__)
