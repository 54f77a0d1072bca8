"""The gallery of report.html: a few images of one model with every method's cached maps and the model's prediction."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..instrumentation import ModelAdapter
from .cache import MethodCache
from .data import one_batch
from .result import Gallery


def build_gallery(adapter: ModelAdapter, model_name: str, dataset: Dataset, indices: list[int],
                  caches: dict[str, MethodCache],
                  normalisation: tuple[tuple[float, ...], tuple[float, ...]] | None, class_names: list[str],
                  device: torch.device) -> Gallery | None:
    """The images at ``indices`` with each method's maps (None where some image has none) and the
    model's top-1 class and probability; None without images.

    Images are shown with ``normalisation`` (mean, std) undone, or each stretched to [0, 1] when it is unknown.
    """
    batch = one_batch(dataset, indices, device)
    if batch is None:
        return None
    images = batch.data["images"]
    probabilities = adapter.logits(images).softmax(-1)
    if normalisation is None:
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        display = (images - low) / (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp_min(1e-12)
    else:
        mean, std = (torch.tensor(v, device=images.device).view(1, -1, 1, 1) for v in normalisation)
        display = images * std + mean
    maps = {label: cache.cached_maps(batch) for label, cache in caches.items()}
    top = probabilities.topk(min(5, probabilities.shape[-1]), dim=-1)
    top5 = [list(zip(classes.tolist(), values.tolist())) for values, classes in zip(top.values, top.indices)]
    return Gallery(model_name, batch.ids, display.clamp(0, 1).permute(0, 2, 3, 1).cpu(), batch.data["labels"].tolist(),
                   probabilities.argmax(-1).tolist(), probabilities.amax(-1).tolist(), class_names,
                   {label: None if found is None else found["maps"].cpu() for label, found in maps.items()},
                   top5, tuple(adapter.grid_size(images)))
