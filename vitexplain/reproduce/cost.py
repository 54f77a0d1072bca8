"""Rough GPU hours of a recipe, from counts of model passes (a planning aid, not a measurement).

Cost of one image in one cell = passes of its method + passes of its metric (each registered with its
``cost``), where a backward counts as two forwards; passes run at :data:`FORWARDS_PER_SECOND`
ViT-B/16 forwards per second (batched fp32 inference on one recent data-centre GPU), scaled by the
model's size. Maps are computed once per (setting, row) and shared by the setting's metrics, as the
bench does.
"""
from __future__ import annotations

from ..metrics import get_metric
from ..registry import get_method
from .recipe import MODELS, TableRecipe

#: Batched fp32 ViT-B/16 forwards at 224 x 224 per second assumed for one GPU.
FORWARDS_PER_SECOND = 1500.0
#: Cost of one forward relative to ViT-B/16 (ViT-L/16 has 3.5x its FLOPs).
RELATIVE_COST = {"vit_large_patch16_224": 3.5}


def estimate_gpu_hours(recipe: TableRecipe, limit: int | None = None) -> float:
    """GPU hours of a full run of ``recipe`` (or of ``limit`` images per setting)."""
    seconds = 0.0
    for setting in recipe.settings:
        images = setting.data.subset or setting.data.size
        images = min(images, limit) if limit else images
        scale = RELATIVE_COST.get(MODELS[setting.model].arch, 1.0) / FORWARDS_PER_SECOND
        for row in recipe.rows:
            if setting.covers(row.label):
                method = get_method(row.method).passes(row.options)
                metrics = sum(get_metric(m.name).passes(m.options, method) for m in setting.metrics)
                seconds += images * (method + metrics) * scale
    return seconds / 3600
