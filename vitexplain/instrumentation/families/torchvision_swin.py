"""torchvision's Swin Transformers (``swin_t`` / ``swin_s`` / ``swin_b`` and ``swin_v2_t`` / ``_s`` / ``_b``, and models
built from ``SwinTransformer`` with any size): a patch convolution with a LayerNorm, stages of windowed blocks with
shifted windows and patch merging between them (NHWC token grids), the final norm, average pooling, a Linear.

What differs from timm's Swin (``timm_swin.py``): each attention pads its grid to whole windows *before* the cyclic
shift (timm shifts, then pads), and drops the shift on a side whose padded length is no longer than the window;
V2's attention leaves the key third of the qkv bias out (the module zeroes it in every call)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention import AttentionParts, clamped_logit_scale
from ..windows import Grid, WindowLayout, Windows
from .base import EmbeddingParts, Family, LinearView, register_family
from .examples import Example
from .stack import Parts, Stack
from .timm_swin import HierarchicalSwin, grid_back, grid_tokens

#: where torchvision keeps the classes described
MODULE = "torchvision.models.swin_transformer"
#: block class -> (the attention class it holds, the layout its forward computes)
BLOCKS = {"SwinTransformerBlock": ("ShiftedWindowAttention", "pre_norm"),
          "SwinTransformerBlockV2": ("ShiftedWindowAttentionV2", "res_post_norm")}


def _effective_shift(window: Grid, shift: Grid, padded: Grid) -> Grid:
    """torchvision's shift on a padded grid: none on a side whose padded length is no longer than the window."""
    return tuple(0 if size >= side else step for step, size, side in zip(shift, window, padded))


def _padded(grid: Grid, window: Grid) -> Grid:
    return tuple(math.ceil(side / size) * size for side, size in zip(grid, window))


def _shift_mask(window: Grid, shift: Grid, padded: Grid, device: torch.device, dtype: torch.dtype) -> Tensor:
    """torchvision's additive mask of a shifted block's windows [windows, T, T]: -100 between tokens of different
    regions of the rolled, padded grid (its slices, taken with the effective shift as the module takes them)."""
    regions = torch.zeros(padded, device=device)
    count = 0
    for rows in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
        for cols in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
            regions[rows[0]:rows[1], cols[0]:cols[1]] = count
            count += 1
    regions = regions.view(padded[0] // window[0], window[0], padded[1] // window[1], window[1])
    regions = regions.permute(0, 2, 1, 3).reshape(-1, window[0] * window[1])
    different = (regions[:, None, :] - regions[:, :, None]) != 0
    return torch.zeros(different.shape, device=device, dtype=dtype).masked_fill(different, -100.0)


@dataclass(frozen=True)
class PaddedThenShifted(Windows):
    """torchvision's windows: the grid padded to whole windows at the bottom / right, then rolled by the shift."""

    def layout(self, grid: Grid, device: torch.device, dtype: torch.dtype) -> WindowLayout:
        padded = _padded(grid, self.window)
        shift = _effective_shift(self.window, self.shift, padded)
        i = torch.arange(padded[0], device=device)[:, None]
        j = torch.arange(padded[1], device=device)[None, :]
        rows, cols = (i + shift[0]) % padded[0], (j + shift[1]) % padded[1]
        tokens = torch.where((rows < grid[0]) & (cols < grid[1]), rows * grid[1] + cols, -1)
        slots = tokens.reshape(padded[0] // self.window[0], self.window[0], padded[1] // self.window[1], self.window[1])
        slots = slots.permute(0, 2, 1, 3).reshape(-1, self.window[0] * self.window[1])
        mask = _shift_mask(self.window, shift, padded, device, dtype) if any(shift) else None
        return WindowLayout(tuple(grid), tuple(self.window), shift, slots, mask)


def _key_bias_left_out(linear: nn.Linear) -> LinearView:
    """V2's qkv Linear as its attention calls it: the key third of the bias left out (a Linear of the description,
    so LRP's Linear rules act on it)."""
    def bias() -> Tensor | None:
        if linear.bias is None:
            return None
        third = linear.bias.numel() // 3
        return torch.cat([linear.bias[:third], torch.zeros_like(linear.bias[third:2 * third]), linear.bias[2 * third:]])

    return LinearView(lambda: linear.weight, bias, linear.in_features, linear.out_features)


def _without_graph(attn: nn.Module):
    """V2's continuous position bias (16·sigmoid of its MLP), a constant of the input: computed without a graph, as
    for timm's Swin V2 (``timm_swin.py``), so the LRP rules on that MLP's Linears stay out of its way."""
    def bias() -> Tensor:
        with torch.no_grad():
            return attn.get_relative_position_bias()
    return bias


def _attention(attn: nn.Module) -> AttentionParts:
    """``ShiftedWindowAttention`` (a relative position bias table), or V2's (with a logit scale)."""
    head_dim = attn.qkv.out_features // (3 * attn.num_heads)
    if not hasattr(attn, "logit_scale"):
        return AttentionParts(module=attn, num_heads=attn.num_heads, head_dim=head_dim, scale=head_dim ** -0.5,
                              proj=attn.proj, qkv=attn.qkv, position_bias=attn.get_relative_position_bias)
    return AttentionParts(module=attn, num_heads=attn.num_heads, head_dim=head_dim, scale=head_dim ** -0.5,
                          proj=attn.proj, qkv=_key_bias_left_out(attn.qkv), position_bias=_without_graph(attn),
                          logit_scale=clamped_logit_scale(attn))


def tiny_torchvision_swin(version: int):
    """A builder of a tiny torchvision Swin (``swin_t`` style, or ``swin_v2_t`` style for ``version`` 2)."""
    def make(**overrides) -> nn.Module:
        from torchvision.models import swin_transformer as swin

        v2 = {} if version != 2 else dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2)
        return swin.SwinTransformer(**{**dict(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[2, 4],
                                              window_size=[2, 2], num_classes=10, **v2), **overrides})

    return make


def _stage_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of every stage, in order (the ``features`` entries that are stages of blocks)."""
    return [block for stage in model.features[1:] if isinstance(stage, nn.Sequential) for block in stage]


def _attention_reason(place: str, block: nn.Module) -> str | None:
    expected, _ = BLOCKS[type(block).__name__]
    if type(block.attn).__name__ == expected:
        return None
    return f"{place}: its attention is a {type(block.attn).__name__}, not torchvision's {expected}"


def _pooling_reason(model: nn.Module) -> str | None:
    if isinstance(model.avgpool, nn.AdaptiveAvgPool2d) and model.avgpool.output_size in (1, (1, 1)):
        return None
    return f"its head pools with a {type(model.avgpool).__name__}, not an average over the tokens"


@register_family
class TorchvisionSwin(HierarchicalSwin, Family):
    """Where torchvision's ``SwinTransformer`` (V1 and V2 blocks) keeps its parts; blocks of all stages in order."""

    name = "torchvision Swin Transformer (V1, V2)"
    listing_order = 32
    model_classes = (f"{MODULE}.SwinTransformer",)
    # the MLP: Linear, GELU, Dropout, Linear, Dropout
    stack = Stack(_stage_blocks, {name: layout for name, (_, layout) in BLOCKS.items()},
                  "torchvision's SwinTransformerBlock(V2)", checks=(_attention_reason,),
                  parts=Parts(activation="mlp.1", inputs=grid_tokens, output=grid_back,
                              windows=lambda block: PaddedThenShifted(tuple(block.attn.window_size),
                                                                      tuple(block.attn.shift_size))))
    refusals = (_pooling_reason, stack.reason)
    # the merges concatenate 2x2 neighbours (a selection) before or after their norm and Linear, which the rules
    # cover; stochastic depth is the identity in evaluation; V2's bias MLP (with its ReLU) computes a constant of the
    # input, which carries no relevance
    lrp_modules = (f"{MODULE}.PatchMerging", f"{MODULE}.PatchMergingV2", "torchvision.ops.misc.Permute",
                   "torchvision.ops.stochastic_depth.StochasticDepth", nn.AdaptiveAvgPool2d, nn.Flatten, nn.ReLU)
    example_models = (Example("torchvision Swin (swin_t style)", tiny_torchvision_swin(1)),
                      Example("torchvision Swin V2 (swin_v2_t style)", tiny_torchvision_swin(2)))
    patch_convolution = "model.features.0.0"
    attention = staticmethod(_attention)

    def grid_size(self, images: Tensor) -> tuple[int, int]:
        size, patch = tuple(images.shape[-2:]), self.patch_size
        if any(side % step for side, step in zip(size, patch)):
            raise ValueError(f"this model cuts images into {patch[0]}x{patch[1]} patches, which do not tile a "
                             f"{size[0]}x{size[1]} image; resize or crop it to a multiple")
        return size[0] // patch[0], size[1] // patch[1]

    def head(self, tokens: Tensor, *, final_norm: bool = True) -> Tensor:
        """``norm`` (the final norm), the average over the grid [B, h, w, C], ``head``."""
        model = self.model
        tokens = model.norm(tokens) if final_norm else tokens
        return model.head(model.flatten(model.avgpool(model.permute(tokens))))

    def embedding(self) -> EmbeddingParts:
        """``features[0]``: the patch convolution, a permute to NHWC, a LayerNorm; no position embedding."""
        return EmbeddingParts(self.model.features[0], self.model.features[0][0], None)
