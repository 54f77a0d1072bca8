"""Noise resilience of the metrics (MetaQuantus, Hedström et al., TMLR 2023; docs/decisions/metric-trust.md): a model
entry may be a copy of another under minor multiplicative weight noise, and each number of the original then says
whether every method's score, and the methods' ranking, stayed as they were on the copy."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.bench.cache import fingerprint
from vitexplain.bench.config import MINOR_WEIGHT_NOISE, ModelEntry
from vitexplain.bench.runner import _load_model
from vitexplain.bench.store import ShardStore
from vitexplain.models import load_model
from vitexplain.uncertainty import MIN_IMAGES

IMAGES = MIN_IMAGES          # the fewest images with an interval, so with leaders and trust records
METHODS = ["gae", "rollout", "random_baseline"]
DATASET = {"name": "digits", "options": {"split": "test", "n": 40}}


def _config(models, output_dir, metrics=("sparseness",)):
    return BenchConfig(models=models, methods=METHODS, metrics=list(metrics), dataset=DATASET, limit=IMAGES,
                       batch_size=IMAGES, output_dir=output_dir, progress=False, device="cpu", gallery=0)


def test_the_copy_multiplies_every_weight_by_noise_of_the_stated_spread():
    original, _ = load_model("digits_vit", device="cpu")
    models = [ModelEntry("digits_vit"), ModelEntry("copy", noise_of="digits_vit", weight_noise=0.01, seed=3)]
    copy, _ = _load_model(models[1], torch.device("cpu"), models)
    again, _ = _load_model(models[1], torch.device("cpu"), models)
    other, _ = _load_model(ModelEntry("other", noise_of="digits_vit", weight_noise=0.01, seed=4),
                           torch.device("cpu"), models)
    ratios = []
    for (name, before), after in zip(original.named_parameters(), copy.parameters()):
        nonzero = before != 0
        ratios.append((after[nonzero].double() / before[nonzero].double() - 1).flatten())
    ratios = torch.cat(ratios)
    assert ratios.numel() > 300_000                                   # every parameter of the 0.34 M-parameter model
    assert ratios.std().item() == pytest.approx(0.01, rel=0.01) and abs(ratios.mean().item()) < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(copy.parameters(), again.parameters()))       # seeded
    assert not all(torch.equal(a, b) for a, b in zip(copy.parameters(), other.parameters()))
    zero, _ = _load_model(ModelEntry("zero", noise_of="digits_vit", weight_noise=0), torch.device("cpu"), models)
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), zero.state_dict().values()))


def test_a_copy_is_checked_and_takes_the_minor_noise_and_the_run_seed_by_default(tmp_path):
    config = BenchConfig(models=["digits_vit", {"name": "noisy", "noise_of": "digits_vit"}], methods=["gae"],
                         metrics=["sparseness"], dataset=DATASET, seed=7, output_dir=tmp_path)
    assert (config.models[1].weight_noise, config.models[1].seed) == (MINOR_WEIGHT_NOISE, 7) == (0.001, 7)
    refused = {"is not another model of this run": [{"name": "noisy", "noise_of": "digits_deit"}],
               "belong to a noisy copy": [{"name": "noisy", "source": "digits_vit", "weight_noise": 0.01}],
               "takes no source or arch": [{"name": "noisy", "noise_of": "digits_vit", "source": "digits_vit"}],
               "finite number >= 0": [{"name": "noisy", "noise_of": "digits_vit", "weight_noise": -0.1}],
               "itself a noisy copy": [{"name": "a", "noise_of": "digits_vit"}, {"name": "b", "noise_of": "a"}],
               "more than one noisy copy": [{"name": "a", "noise_of": "digits_vit"},
                                            {"name": "b", "noise_of": "digits_vit"}]}
    for message, copies in refused.items():
        with pytest.raises(ValueError, match=message):
            BenchConfig(models=["digits_vit", *copies], methods=["gae"], metrics=["sparseness"], dataset=DATASET,
                        output_dir=tmp_path)


def _stored(output_dir, folder: str, method: str) -> torch.Tensor:
    """The per-image sparseness the cache holds for one model folder and method, in dataset order."""
    (directory,) = (output_dir / "cache" / folder).glob(f"*/target-predicted/{method}-*/metrics/sparseness-*")
    store = ShardStore(directory)
    indices = sorted(store.scan())
    return store.read(indices)["sparseness"].double()


def test_minor_noise_on_a_model_object_leaves_it_and_its_cache_as_they_were(tmp_path):
    model, _ = load_model("digits_vit", device="cpu")
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    result = run_benchmark(_config([ModelEntry("orig", model), {"name": "orig~minor", "noise_of": "orig"}],
                                   tmp_path / "out"))
    assert not result.errors
    assert all(torch.equal(weights[name], tensor) for name, tensor in model.state_dict().items())
    folders = sorted(path.name for path in (tmp_path / "out" / "cache").iterdir())
    assert f"orig-{fingerprint(model)}" in folders and len(folders) == 2        # the folder a run without a copy uses
    copy_folder = next(name for name in folders if name.startswith("orig_minor-"))
    assert copy_folder != f"orig_minor-{fingerprint(model)}"                    # the copy's own weights

    noise = result.trust["orig"]["sparseness"]["sparseness"]["noise_resilience"]
    assert (noise["copy"], noise["weight_noise"], noise["seed"]) == ("orig~minor", 0.001, 0)
    assert [row["method"] for row in noise["methods"]] == ["gae", "rollout"]    # the control left out
    assert noise["of"] == 2 and noise["unchanged"] == sum(row["resilient"] for row in noise["methods"])
    for row in noise["methods"]:
        # the paired percentile bootstrap computed plainly from the cache's per-image values
        before = _stored(tmp_path / "out", f"orig-{fingerprint(model)}", row["method"])
        after = _stored(tmp_path / "out", copy_folder, row["method"])
        differences = (after - before).numpy()
        generator = np.random.default_rng(0)                                     # the run's seed
        means = [differences[generator.integers(0, IMAGES, IMAGES)].mean() for _ in range(1000)]
        low, high = np.percentile(means, [2.5, 97.5])
        value, found_low, found_high = row["difference"]
        assert value == pytest.approx(differences.mean(), rel=1e-9, abs=1e-15)
        assert (found_low, found_high) == (pytest.approx(low, rel=1e-9, abs=1e-15),
                                           pytest.approx(high, rel=1e-9, abs=1e-15))
        assert row["resilient"] == (low <= 0 <= high)
        assert value != 0                                                        # the copy did change the maps
    assert "noise_resilience" not in result.trust["orig~minor"]["sparseness"]["sparseness"]


def test_no_noise_keeps_every_score_and_the_ranking(tmp_path):
    result = run_benchmark(_config(["digits_vit", {"name": "digits_vit~same", "noise_of": "digits_vit",
                                                   "weight_noise": 0.0, "seed": 1}], tmp_path / "out",
                                   metrics=("sparseness", "segmentation")))
    assert not result.errors
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    for label, numbers in saved["trust"]["digits_vit"].items():
        for number, trust in numbers.items():
            noise = trust["noise_resilience"]
            assert noise["unchanged"] == noise["of"] == 2 and noise["ranking"] == 1.0
            assert all(row["difference"] == [0.0, 0.0, 0.0] and row["resilient"] for row in noise["methods"])
    lead = next(lead for lead in result.summary("digits_vit") if lead.number == "sparseness")
    assert lead.trust_text().endswith("; unchanged under minor weight noise: 2/2, ranking kept ρ 1.00")
    copy_lead = next(lead for lead in result.summary("digits_vit~same") if lead.number == "sparseness")
    assert "minor weight noise" not in copy_lead.trust_text()
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "copy − original under minor weight noise (95 %)" in markdown
    assert f"gae: 0.00 [0.00, 0.00] ({IMAGES}) unchanged" in markdown
    assert "unchanged under minor weight noise: 2/2" in (tmp_path / "out" / "report.html").read_text()
