"""ROAD (Rong et al., ICML 2022): noisy linear imputation of the removed pixels, MoRF and LeRF curves."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitexplain.metrics import EvalBatch, get_metric
from vitexplain.metrics import road as road_module
from vitexplain.metrics._stencil_cg import conjugate_gradient_imputation
from vitexplain.metrics.road import NEIGHBOURS, chosen_solver, linear_imputation, reduce_road, road

from test_metrics_perturbation import WeightedPixels

MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)


def dense_imputation(image, removed):
    """The imputation written out: one equation per removed pixel (its value = the weighted mean of its
    neighbours inside the image, 1/6 across an edge, 1/12 across a corner), solved densely in float64."""
    channels, height, width = image.shape
    unknown = [(r, c) for r in range(height) for c in range(width) if removed[r, c]]
    index = {pixel: k for k, pixel in enumerate(unknown)}
    matrix = torch.zeros(len(unknown), len(unknown), dtype=torch.float64)
    rhs = torch.zeros(len(unknown), channels, dtype=torch.float64)
    for k, (r, c) in enumerate(unknown):
        for dr in (-1, 0, 1):
            for dc in (-1, 0, 1):
                rr, cc = r + dr, c + dc
                if (dr, dc) == (0, 0) or not (0 <= rr < height and 0 <= cc < width):
                    continue
                weight = 1 / 12 if dr and dc else 1 / 6
                matrix[k, k] += weight
                if removed[rr, cc]:
                    matrix[k, index[(rr, cc)]] -= weight
                else:
                    rhs[k] += weight * image[:, rr, cc].double()
    solution = torch.linalg.solve(matrix, rhs)
    out = image.double().clone()
    for k, (r, c) in enumerate(unknown):
        out[:, r, c] = solution[k]
    return out


def test_linear_imputation_solves_the_neighbour_system():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(3, 3, 6, 7, generator=g, dtype=torch.float64)
    removed = torch.rand(3, 6, 7, generator=g) < torch.tensor([0.2, 0.6, 0.95])[:, None, None]
    removed[2, 0, 0] = False                                             # one kept pixel is enough
    imputed = linear_imputation(images, removed)
    for image, mask, got in zip(images, removed, imputed):
        assert torch.allclose(got, dense_imputation(image, mask), rtol=0, atol=1e-12)
        assert torch.equal(got[:, ~mask], image[:, ~mask])
    with pytest.raises(ValueError, match="kept pixel"):
        linear_imputation(images[:1], torch.ones(1, 6, 7, dtype=torch.bool))


def test_the_images_solved_side_by_side_are_the_images_solved_one_at_a_time():
    g = torch.Generator().manual_seed(1)
    images = torch.rand(12, 3, 24, 20, generator=g, dtype=torch.float64)
    removed = hard_masks(24, 20, g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.stack([linear_imputation(image[None], mask[None])[0] for image, mask in zip(images, removed)])
        torch.set_num_threads(4)
        together = linear_imputation(images, removed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, alone)


def hard_masks(height, width, generator):
    """Removal masks [12, H, W] with 10 to 90 % removed: random pixels, whole rows and columns, blocks on the
    borders and corners, the whole border ring, everything but one corner block."""
    masks = [torch.rand(height, width, generator=generator) < share for share in (0.1, 0.5, 0.9)]
    rows = torch.zeros(height, width, dtype=torch.bool)
    rows[::2] = True                                                     # every other row: 50 %
    columns = torch.zeros(height, width, dtype=torch.bool)
    columns[:, : width * 9 // 10] = True                                 # 90 %, touching three borders
    block = torch.zeros(height, width, dtype=torch.bool)
    block[2:height - 3, 3:width - 2] = True                              # one interior hole
    corner = torch.zeros(height, width, dtype=torch.bool)
    corner[: height // 3, : width // 3] = True                           # ~10 %, in a corner
    ring = torch.ones(height, width, dtype=torch.bool)
    ring[2:-2, 2:-2] = False                                             # the image border
    kept_corner = torch.ones(height, width, dtype=torch.bool)
    kept_corner[-height // 3:, -width // 3:] = False                     # ~90 %, kept only in a corner
    top = torch.zeros(height, width, dtype=torch.bool)
    top[: height * 7 // 10] = True                                       # the top rows, 70 %
    blobs = F.interpolate(torch.rand(1, 1, 3, 3, generator=generator), size=(height, width), mode="bilinear")[0, 0]
    smooth = [blobs > blobs.quantile(q) for q in (0.2, 0.6)]             # as a ROAD mask of a smooth map
    return torch.stack(masks + [rows, columns, block, corner, ring, kept_corner, top] + smooth)


def test_conjugate_gradients_match_the_exact_solve():
    g = torch.Generator().manual_seed(5)
    for height, width in ((24, 24), (17, 30)):
        removed = hard_masks(height, width, g)
        shares = removed.flatten(1).double().mean(1)
        assert shares.min() < 0.15 and shares.max() > 0.85
        images = torch.rand(removed.shape[0], 3, height, width, generator=g, dtype=torch.float64)
        exact = linear_imputation(images, removed, solver="lu")
        imputed, iterations = conjugate_gradient_imputation(images, removed, NEIGHBOURS)
        assert 0 < iterations
        assert (imputed - exact).abs().max() < 1e-6
        assert torch.equal(imputed[~removed[:, None].expand_as(images)], images[~removed[:, None].expand_as(images)])
        alone, _ = conjugate_gradient_imputation(images[1:2], removed[1:2], NEIGHBOURS)
        assert torch.allclose(alone, imputed[1:2], rtol=0, atol=1e-12)      # no value depends on the batch
        float32 = linear_imputation(images.float(), removed, solver="cg")
        assert float32.dtype == torch.float32 and (float32.double() - exact).abs().max() < 1e-6


def test_conjugate_gradients_refuse_to_return_an_unconverged_solve():
    g = torch.Generator().manual_seed(6)
    removed = hard_masks(20, 20, g)[[2]]
    with pytest.raises(RuntimeError, match="did not reach relative residual .* in 5 iterations.*solver='lu'"):
        conjugate_gradient_imputation(torch.rand(1, 3, 20, 20, generator=g), removed, NEIGHBOURS, max_iterations=5)


def test_auto_picks_conjugate_gradients_on_cuda_only():
    assert chosen_solver("auto", torch.device("cuda")) == "cg"
    assert chosen_solver("auto", torch.device("cuda", 1)) == "cg"
    assert chosen_solver("auto", torch.device("cpu")) == "lu"
    assert chosen_solver("lu", torch.device("cuda")) == "lu" and chosen_solver("cg", torch.device("cpu")) == "cg"
    with pytest.raises(ValueError, match=r"^option solver of metric 'road' must be one of 'auto', 'lu', 'cg', "
                                         r"got 'qr'$"):
        get_metric("road").compute(None, solver="qr")


def test_road_curves_are_the_same_with_either_solver(monkeypatch):
    """On a stubbed CUDA device, ``auto`` goes through conjugate gradients, and the curves match the LU ones."""
    g = torch.Generator().manual_seed(7)
    images, maps = torch.randn(3, 3, 12, 12, generator=g), torch.rand(3, 3, 3, generator=g)
    targets, model = torch.tensor([0, 2, 1]), Linear(144)
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape[0])
        return conjugate_gradient_imputation(*args, **kwargs)

    monkeypatch.setattr(road_module, "conjugate_gradient_imputation", spy)
    plain = dict(pixel_mean=MEAN, pixel_std=STD, fractions=(0.1, 0.5, 0.9), batch_size=4, seed=3)
    with torch.no_grad():
        exact = road(model, images, maps, targets, solver="lu", **plain)
        assert not calls
        monkeypatch.setattr(road_module, "_on_cuda", lambda device: True)
        automatic = road(model, images, maps, targets, **plain)
        assert sum(calls) == 2 * 3 * 3                                   # every imputation, both orders
        road(model, images, maps, targets, solver="lu", **plain)
        assert sum(calls) == 2 * 3 * 3                                   # "lu" is never overridden
    for key in ("morf", "lerf"):
        assert torch.allclose(automatic[key], exact[key], rtol=0, atol=1e-6)
        assert not torch.allclose(automatic[key][:, 0], automatic[key][:, -1], atol=1e-3)   # the curves move


class Linear(nn.Module):
    def __init__(self, pixels, classes=4):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(classes, 3 * pixels, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return x.flatten(1) @ self.weight.T


def plain_road(model, images, maps, targets, fractions, noise, seed):
    """ROAD as the authors' loop: per image, order and fraction, rank the pixels (ties: raster order),
    un-normalise, impute, add the noise, normalise, score."""
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    jitter = noise * torch.randn(images.shape[1:], generator=torch.Generator().manual_seed(seed))
    curves = {"morf": [], "lerf": []}
    for image, raw, target in zip(images, maps, targets):
        up = F.interpolate(raw[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False)[0, 0].flatten()
        values = ((up - up.min()) / (up.max() - up.min())).tolist()
        n = len(values)
        for order, key in (("morf", lambda p: (-values[p], p)), ("lerf", lambda p: (values[p], p))):
            ranked = sorted(range(n), key=key)
            row = []
            for f in fractions:
                count = int(n * f) if order == "morf" else n - int(n * (1 - f))
                removed = torch.zeros(n, dtype=torch.bool)
                removed[ranked[:count]] = True
                removed = removed.view(image.shape[-2:])
                pixels = dense_imputation(image * std + mean, removed).float() + jitter * removed
                row.append(model(((pixels - mean) / std)[None]).softmax(-1)[0, target].item())
            curves[order].append(row)
    return {key: torch.tensor(rows) for key, rows in curves.items()}


def test_road_matches_a_plain_loop_whatever_the_batch_size():
    g = torch.Generator().manual_seed(2)
    images, maps = torch.randn(3, 3, 8, 8, generator=g), torch.rand(3, 4, 4, generator=g)
    targets = torch.tensor([0, 3, 1])
    model = Linear(64)
    fractions = (0.1, 0.25, 0.5, 0.9)
    with torch.no_grad():
        expected = plain_road(model, images, maps, targets, fractions, noise=0.05, seed=4)
        for batch_size in (5, 64):
            values = road(model, images, maps, targets, pixel_mean=MEAN, pixel_std=STD, fractions=fractions, noise=0.05,
                          batch_size=batch_size, seed=4)
            for key in ("morf", "lerf"):
                assert torch.allclose(values[key], expected[key], rtol=0, atol=1e-5)


def spots():
    """A 2-class model reading 4 bright pixels of a dark 8 x 8 image, and that image."""
    weights = torch.zeros(64)
    weights[[10, 21, 42, 53]] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    images = torch.zeros(1, 3, 8, 8)
    images.view(1, 3, 64)[..., weights > 0] = 1.0
    return WeightedPixels(weights.tolist(), constant=2.0), images, weights.view(1, 8, 8)


def test_a_perfect_map_beats_its_reverse():
    model, images, weights = spots()
    plain = dict(pixel_mean=(0.0,) * 3, pixel_std=(1.0,) * 3, fractions=(0.05, 0.1, 0.5), noise=0.01)
    perfect = road(model, images, weights, torch.tensor([0]), **plain)
    reverse = road(model, images, -weights, torch.tensor([0]), **plain)
    assert (perfect["morf"] < reverse["morf"]).all() and (perfect["lerf"] > reverse["lerf"]).all()
    assert reduce_road(perfect)["lerf_minus_morf"] > reduce_road(reverse)["lerf_minus_morf"]
    reported = reduce_road(perfect)
    assert reported["morf"] == pytest.approx(perfect["morf"].double().mean().item())
    assert reported["lerf_minus_morf"] == pytest.approx(reported["lerf"] - reported["morf"])


def test_the_registered_metric_works_in_the_batch_normalisation():
    model, images, weights = spots()
    batch = EvalBatch(images=images, maps=weights, targets=torch.tensor([0]), labels=torch.tensor([0]), explain=None,
                      logits=model, ids=["a"], mean=MEAN, std=STD)
    values = get_metric("road").compute(batch, fractions=[0.5], seed=1)
    expected = road(model, images, weights, torch.tensor([0]), pixel_mean=MEAN, pixel_std=STD, fractions=(0.5,), seed=1)
    assert all(torch.equal(values[key], expected[key]) for key in ("morf", "lerf"))
    with pytest.raises(ValueError, match="fractions"):
        get_metric("road").check_options({"fractions": [0.5, 1.0]})
    with pytest.raises(ValueError, match="solver"):
        get_metric("road").check_options({"solver": "qr"})
    cg = get_metric("road").compute(batch, fractions=[0.5], seed=1, solver="cg")
    assert all(torch.allclose(cg[key], expected[key], rtol=0, atol=1e-6) for key in ("morf", "lerf"))
    assert get_metric("road").passes({"fractions": [0.1, 0.5]}, 1) == 4
