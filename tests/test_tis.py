"""TIS (Englebert et al., ICCVW 2023) and its batched k-means, against plain loop computations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitexplain.api import explain
from vitexplain.instrumentation import adapter_for
from vitexplain.methods._kmeans import initial_indices, kmeans
from vitexplain.methods.tis import kept_tokens

from conftest import make_vit

N_MASKS = 16
PATCH = 8
GRID_W = 4


def images_for(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# -- plain references ------------------------------------------------------------------------------
def prefix_tokens(model) -> list[torch.Tensor]:
    dist = getattr(model, "dist_token", None)
    return [model.cls_token] + ([dist] if dist is not None else [])


def manual_embed(model, image: torch.Tensor) -> torch.Tensor:
    """Patch projection, prefix tokens, position embedding for one image, written out [1, N, C]."""
    patches = model.patch_embed.proj(image[None]).flatten(2).transpose(1, 2)
    patches = model.patch_embed.norm(patches)
    return torch.cat([*prefix_tokens(model), patches], dim=1) + model.pos_embed


def manual_head(model, tokens: torch.Tensor) -> torch.Tensor:
    """Blocks, final norm and head(s) on a token sequence [1, N', C] -> logits [classes]."""
    for block in model.blocks:
        tokens = block(tokens)
    tokens = model.norm(tokens)
    logits = model.head(tokens[0, 0])
    if getattr(model, "dist_token", None) is not None:
        logits = (logits + model.head_dist(tokens[0, 1])) / 2
    return logits


def manual_logits_on_tokens(model, image: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    tokens = manual_embed(model, image)
    prefix = len(prefix_tokens(model))
    return manual_head(model, torch.cat([tokens[:, :prefix], tokens[:, prefix + keep]], dim=1))


def manual_pixel_logits(model, image: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    masked = image.clone()
    for patch in range(GRID_W * GRID_W):
        if patch not in keep.tolist():
            row, col = divmod(patch, GRID_W)
            masked[:, row * PATCH:(row + 1) * PATCH, col * PATCH:(col + 1) * PATCH] = 0
    return model(masked[None])[0]


def reference_tis(model, images, keeps, targets, score="probability", input_space=False) -> torch.Tensor:
    """Eq. (4)-(5) one image, one mask, one token at a time; ``keeps`` = kept indices per ratio."""
    maps = torch.zeros(images.shape[0], GRID_W * GRID_W)
    with torch.no_grad():
        for b in range(images.shape[0]):
            weighted = [0.0] * (GRID_W * GRID_W)
            coverage = [0] * (GRID_W * GRID_W)
            for keep in keeps:
                for j in range(keep.shape[1]):
                    forward = manual_pixel_logits if input_space else manual_logits_on_tokens
                    logits = forward(model, images[b], keep[b, j])
                    out = logits.softmax(-1) if score == "probability" else logits
                    for token in keep[b, j].tolist():
                        weighted[token] += out[targets[b]].item()
                        coverage[token] += 1
            for token in range(GRID_W * GRID_W):
                maps[b, token] = weighted[token] / coverage[token] if coverage[token] else 0.0
    return maps.reshape(-1, GRID_W, GRID_W)


def lloyd_reference(points: np.ndarray, init: np.ndarray, max_iter: int = 100, tol: float = 1e-4) -> np.ndarray:
    """Plain Lloyd iteration in float64; empty clusters keep their centroid; stop once shift <= tol."""
    centroids = points[init].astype(np.float64)
    for _ in range(max_iter):
        distances = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)
        assignment = distances.argmin(1)
        updated = centroids.copy()
        for k in range(len(centroids)):
            if (assignment == k).any():
                updated[k] = points[assignment == k].mean(0)
        shift = ((updated - centroids) ** 2).sum()
        centroids = updated
        if shift <= tol:
            break
    return centroids


# -- k-means ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_iter, tol", [(1, 1e-4), (3, 1e-4), (100, 1e-4), (100, 0.05)])
def test_kmeans_matches_plain_lloyd_per_entry(max_iter, tol):
    generator = torch.Generator().manual_seed(3)
    # entries of different spread stop after different numbers of iterations
    points = torch.randn(3, 60, 5, generator=generator) * torch.tensor([0.1, 1.0, 3.0])[:, None, None]
    centroids = kmeans(points, 7, seed=11, max_iter=max_iter, tol=tol)
    init = initial_indices(60, 7, seed=11).numpy()
    assert len(set(init.tolist())) == 7
    for b in range(3):
        expected = lloyd_reference(points[b].double().numpy(), init, max_iter=max_iter, tol=tol)
        np.testing.assert_allclose(centroids[b].numpy(), expected, rtol=1e-5, atol=1e-5)
        alone = kmeans(points[b:b + 1], 7, seed=11, max_iter=max_iter, tol=tol)[0]
        torch.testing.assert_close(alone, centroids[b], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_clusters", [8, 20])
def test_kmeans_with_fewer_distinct_points_than_centroids(n_clusters):
    distinct = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, -1.0, 0.0, 2.0], [-4.0, 4.0, 1.0, 0.0]])
    points = distinct[torch.arange(12) % 3][None].repeat(2, 1, 1)  # 12 points, 3 distinct values
    centroids = kmeans(points, n_clusters, seed=0)
    assert centroids.shape == (2, n_clusters, 4)
    assert torch.isfinite(centroids).all()
    # every centroid sits on one of the distinct points (a duplicate or empty cluster never drifts)
    distance_to_closest = torch.cdist(centroids[0], distinct).min(-1).values
    assert distance_to_closest.max() < 1e-6


def test_kmeans_rejects_bad_input():
    with pytest.raises(ValueError, match="points must be"):
        kmeans(torch.zeros(5, 3), 2)
    with pytest.raises(ValueError, match="n_clusters"):
        kmeans(torch.zeros(1, 5, 3), 0)


def test_masks_are_top_tokens_of_kmeans_on_block_output_columns():
    model = make_vit()
    images = images_for(2)
    outputs = []
    handles = [block.register_forward_hook(lambda m, a, out: outputs.append(out)) for block in model.blocks]
    with torch.no_grad():
        model(images)
    for handle in handles:
        handle.remove()
    A = torch.cat([out[:, 1:] for out in outputs], dim=-1)  # [B, N_t, L·D]
    record = adapter_for(model).record(images)
    keep_half, keep_quarter = kept_tokens(record, N_MASKS, [0.5, 0.25], seed=5)
    init = initial_indices(A.shape[-1], N_MASKS, seed=5).numpy()
    for b in range(2):
        centroids = lloyd_reference(A[b].T.double().numpy(), init)  # columns of A are the points
        for keep, count in ((keep_half, 8), (keep_quarter, 4)):
            expected = np.sort(np.argsort(-centroids, axis=1)[:, :count], axis=1)
            np.testing.assert_array_equal(keep[b].sort(-1).values.numpy(), expected)


# -- the token-dropping forward --------------------------------------------------------------------
@pytest.mark.parametrize("distilled", [False, True])
def test_logits_on_tokens_equals_manual_forward_on_kept_tokens(distilled):
    model = make_vit(distilled=distilled)
    images = images_for(2)
    keep = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(s))[:6] for s in range(6)])
    keep = keep.reshape(2, 3, 6)
    logits = adapter_for(model).logits_on_tokens(images, keep, batch_size=4)
    with torch.no_grad():
        for b in range(2):
            for j in range(3):
                expected = manual_logits_on_tokens(model, images[b], keep[b, j])
                torch.testing.assert_close(logits[b, j], expected, rtol=1e-4, atol=1e-5)


# -- the method ------------------------------------------------------------------------------------
CONFIGS = {
    "vit": dict(distilled=False, options=dict()),
    "deit_distilled": dict(distilled=True, options=dict()),
    "logit": dict(distilled=False, options=dict(score="logit")),
    "ratio_list": dict(distilled=False, options=dict(ratio=[0.25, 0.5])),
    "input_space": dict(distilled=False, options=dict(input_space=True)),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tis_equals_plain_loop_on_the_same_masks(name):
    config = CONFIGS[name]
    model = make_vit(distilled=config["distilled"])
    options = config["options"]
    images = images_for(2)
    maps = explain(model, images, "tis", n_masks=N_MASKS, batch_size=5, **options)
    record = adapter_for(model).record(images)
    ratios = options.get("ratio", [0.5])
    keeps = kept_tokens(record, N_MASKS, ratios, seed=0)
    targets = model(images).argmax(-1)
    expected = reference_tis(model, images, keeps, targets, options.get("score", "probability"),
                             options.get("input_space", False))
    torch.testing.assert_close(maps, expected, rtol=1e-4, atol=1e-5)


def test_options_change_the_map():
    model = make_vit()
    images = images_for(1)
    base = explain(model, images, "tis", n_masks=N_MASKS)
    for options in (dict(score="logit"), dict(ratio=[0.25, 0.5]), dict(input_space=True), dict(ratio=0.25)):
        assert not torch.allclose(base, explain(model, images, "tis", n_masks=N_MASKS, **options)), options


def test_same_seed_same_map_other_seed_other_map_global_rng_untouched():
    model = make_vit()
    images = images_for(2)
    rng_state = torch.get_rng_state()
    first = explain(model, images, "tis", n_masks=N_MASKS, seed=3)
    assert torch.equal(rng_state, torch.get_rng_state())
    assert torch.equal(first, explain(model, images, "tis", n_masks=N_MASKS, seed=3))
    assert not torch.allclose(first, explain(model, images, "tis", n_masks=N_MASKS, seed=4))


def test_batch_equals_one_image_at_a_time():
    model = make_vit()
    images = images_for(3)
    together = explain(model, images, "tis", n_masks=N_MASKS, batch_size=7)
    alone = torch.cat([explain(model, images[i:i + 1], "tis", n_masks=N_MASKS) for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-6)


def test_class_specific():
    model = make_vit()
    images = images_for(2)
    assert not torch.allclose(explain(model, images, "tis", 0, n_masks=N_MASKS),
                              explain(model, images, "tis", 1, n_masks=N_MASKS))


def test_tokens_no_mask_keeps_get_zero_not_nan():
    # one mask keeps a single token: every other token is never kept
    model = make_vit()
    maps = explain(model, images_for(1), "tis", n_masks=1, ratio=1 / 16)
    assert torch.isfinite(maps).all()
    assert (maps != 0).sum() == 1


@pytest.mark.parametrize("options, message", [
    (dict(score="softmax"), "option score of method .* must be one of"),
    (dict(ratio=0), "ratio"),
    (dict(ratio=[0.5, 1.5]), "ratio"),
    (dict(ratio=[]), "ratio"),
    (dict(ratio=0.01), "keeps no token"),
    (dict(n_masks=0), "n_masks"),
    (dict(batch_size=0), "batch_size"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        explain(make_vit(), images_for(1), "tis", **options)
