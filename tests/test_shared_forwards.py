"""``SharedForwards``: within one batch, the pixel-removal protocols forward an image once however many of them
ask for it (the clean image, the whole replacement, a repeated removal), and score exactly what they score alone."""
from __future__ import annotations

import torch
from torch import nn

from vitexplain.metrics import SharedForwards
from vitexplain.metrics.aopc import aopc_log_odds
from vitexplain.metrics.insertion_deletion import insertion_deletion
from vitexplain.metrics.perturbation import perturbation_test
from vitexplain.metrics.saco import saco

BATCH, STEPS, GROUPS = 3, 4, 5
PLAIN = dict(pixel_mean=(0.0, 0.0, 0.0), pixel_std=(1.0, 1.0, 1.0))


class CountingModel(nn.Module):
    """A small convolutional classifier that counts the images it is given."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14 * 14, 6)).double()
        self.images = 0

    def forward(self, x):
        self.images += x.shape[0]
        return self.net(x)


def protocols(model, images, maps, targets, labels):
    """Perturbation (both directions), AOPC, insertion / deletion and SaCo, as the bench runs them on a batch."""
    return {**perturbation_test(model, images, maps, labels, n_steps=10, batch_size=7, **PLAIN),
            **aopc_log_odds(model, images, maps, targets, n_steps=10, batch_size=7, **PLAIN),
            **insertion_deletion(model, images, maps, targets, n_steps=STEPS, batch_size=7),
            **saco(model, images, maps, targets, n_groups=GROUPS, batch_size=7)}


def test_each_image_is_forwarded_once_and_every_value_is_the_one_scored_alone():
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(BATCH, 3, 16, 16, generator=generator, dtype=torch.float64)
    maps = torch.rand(BATCH, 4, 4, generator=generator, dtype=torch.float64)
    model = CountingModel()
    targets = model(images).argmax(1)
    labels = targets.roll(1)
    model.images = 0
    alone = protocols(model, images, maps, targets, labels)
    unshared = model.images
    assert unshared == BATCH * (2 * 10 + 10 + 2 * STEPS + GROUPS + 1)
    model.images = 0
    shared = protocols(SharedForwards(model), images, maps, targets, labels)
    # the clean image once (perturbation's, AOPC's and SaCo's step 0), AOPC none (the positive perturbation
    # again), insertion's last step is the clean image, deletion's the blurred one (forwarded once)
    assert model.images == BATCH * (1 + 2 * 9 + 2 * (STEPS - 1) + 1 + GROUPS)
    assert shared.keys() == alone.keys()
    for key, value in alone.items():
        torch.testing.assert_close(shared[key], value, rtol=1e-12, atol=1e-12)
    model.images = 0
    protocols(SharedForwards(model), images, maps, targets, labels)
    assert model.images == BATCH * (1 + 2 * 9 + 2 * (STEPS - 1) + 1 + GROUPS)   # nothing kept from the last batch


def test_other_images_or_another_map_are_forwarded_again():
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(BATCH, 3, 16, 16, generator=generator, dtype=torch.float64)
    maps = torch.rand(BATCH, 4, 4, generator=generator, dtype=torch.float64)
    model = CountingModel()
    labels = torch.zeros(BATCH, dtype=torch.long)
    shared = SharedForwards(model)
    first = perturbation_test(shared, images, maps, labels, direction="positive", **PLAIN)["positive"]
    model.images = 0
    other_map = perturbation_test(shared, images, maps.flip(-1), labels, direction="positive", **PLAIN)["positive"]
    assert model.images == BATCH * 9                       # only the clean image is shared
    model.images = 0
    perturbation_test(shared, images + 1e-3, maps, labels, direction="positive", **PLAIN)
    assert model.images == BATCH * 10                      # other pixels: nothing is shared
    alone = perturbation_test(model, images, maps.flip(-1), labels, direction="positive", **PLAIN)["positive"]
    assert torch.equal(other_map, alone) and first.shape == alone.shape
