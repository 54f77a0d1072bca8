"""Stand-ins the bench tests run on (no tests here): a dataset of random images, a fake method, fake metrics.

Importing this module registers the method ``bench_picky`` and the metrics ``bench_stats``,
``bench_replay`` and ``bench_needs_masks``. The subprocess tests import it too, so everything lives at module level.
"""
from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

from vitexplain import register_method
from vitexplain.methods.rollout import rollout
from vitexplain.metrics import Metric, register_metric

POISON = 1000.0  # an image holding this value makes bench_picky raise
STEPS = 4


class RandomImages(Dataset):
    """``size`` random 32x32 images; each depends on its index only.

    ``broken`` indices raise like an unreadable file; ``poisoned`` ones make ``bench_picky`` raise;
    ``unlabelled`` ones have label -1; ``masks`` adds a random foreground mask.
    """

    def __init__(self, size: int = 7, broken=(), poisoned=(), unlabelled=(), masks: bool = False):
        self.size, self.masks = size, masks
        self.broken, self.poisoned, self.unlabelled = set(broken), set(poisoned), set(unlabelled)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        if index in self.broken:
            raise OSError(f"cannot identify image file 'img{index:03d}.jpg'")
        generator = torch.Generator().manual_seed(100 + index)
        image = torch.randn(3, 32, 32, generator=generator)
        if index in self.poisoned:
            image[0, 0, 0] = POISON
        sample = {"image": image, "label": -1 if index in self.unlabelled else index % 10, "id": f"img{index:03d}"}
        if self.masks:
            sample["mask"] = torch.rand(32, 32, generator=generator) > 0.5
        return sample


def _log(variable: str, count: int) -> None:
    """Append ``count`` to the file named by the environment variable, when set (counts work done)."""
    path = os.environ.get(variable)
    if path:
        with open(path, "a") as handle:
            handle.write(f"{count}\n")


@register_method("bench_picky", class_specific=False)
def bench_picky(adapter, images, target=None, *, start_layer: int = 0):
    """Attention rollout that refuses batches holding a poisoned image (tests error handling)."""
    if (images == POISON).any():
        raise RuntimeError("poisoned image")
    _log("BENCH_METHOD_LOG", images.shape[0])
    return rollout(adapter, images, target, start_layer=start_layer)


def top_mass_curve(maps: torch.Tensor, steps: int = STEPS) -> torch.Tensor:
    """Share of the positive map mass in the top k/steps of the patches, k = 1..steps [B, steps]."""
    flat = maps.flatten(1).clamp(min=0).sort(dim=1, descending=True).values
    cumulative = flat.cumsum(1) / flat.sum(1, keepdim=True).clamp(min=1e-12)
    positions = [round(flat.shape[1] * k / steps) - 1 for k in range(1, steps + 1)]
    return cumulative[:, positions]


def _stats(batch):
    _log("BENCH_METRIC_LOG", len(batch.ids))
    time.sleep(float(os.environ.get("BENCH_METRIC_SLEEP", "0")))  # slows a run down enough to kill it midway
    probabilities = batch.logits(batch.images).softmax(-1)
    return {"probability": probabilities.gather(1, batch.targets[:, None])[:, 0], "curve": top_mass_curve(batch.maps)}


STATS = register_metric(Metric(
    name="bench_stats",
    compute=_stats,
    reduce=lambda v: {"probability": v["probability"].mean(), "auc": v["curve"].mean()},
    higher_is_better={"probability": True, "auc": False},
))

REPLAY = register_metric(Metric(
    name="bench_replay",
    compute=lambda batch: {"gap": (batch.explain(batch.images, batch.targets) - batch.maps).abs().flatten(1).amax(1)},
    reduce=lambda v: {"gap": v["gap"].max()},
))

NEEDS_MASKS = register_metric(Metric(
    name="bench_needs_masks",
    compute=lambda batch: {"on_mask": batch.truth["masks"].float().mean((1, 2))},
    reduce=lambda v: {"on_mask": v["on_mask"].mean()},
    requires=("masks",),
    higher_is_better={"on_mask": True},
))
