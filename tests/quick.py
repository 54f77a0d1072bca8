"""Small settings of the sampling methods and protocols, one table for every test file that runs many of them at
once (the method contract, models known by their outputs, transformers models, the metric contract, seeding): enough
samples for each check to mean something, few enough to keep the suite fast. A method or protocol not named runs at its
defaults."""
from __future__ import annotations

from typing import Any

METHODS: dict[str, dict[str, Any]] = {
    "tis": {"n_masks": 8}, "rise": {"n_masks": 12, "batch_size": 16}, "integrated_gradients": {"n_steps": 4},
    "smoothgrad": {"n_samples": 3}, "tam": {"n_steps": 3}, "bt_token": {"n_steps": 3}, "bt_head": {"n_steps": 3},
    "occlusion": {"window": 16, "stride": 8}, "expected_gradients": {"n_samples": 4}, "deeplift_shap": {"n_samples": 2},
    "lime": {"patch_size": 8}, "kernel_shap": {"patch_size": 8},
}

METRICS: dict[str, dict[str, Any]] = {
    "insertion_deletion": {"n_steps": 6}, "max_sensitivity": {"n_samples": 3}, "road": {"fractions": [0.2, 0.7]},
    "srg": {"patch_size": 8, "n_steps": 4}, "region_perturbation": {"patch_size": 8, "n_regions": 5},
    "selectivity": {"patch_size": 16}, "irof": {"n_segments": 6}, "smooth_mprt": {"n_samples": 2, "cascade": False},
    "avg_sensitivity": {"n_samples": 3}, "local_lipschitz_estimate": {"n_samples": 3}, "continuity": {"n_steps": 2},
    "non_sensitivity": {"patch_size": 8}, "relative_input_stability": {"n_samples": 2},
    "relative_output_stability": {"n_samples": 2}, "relative_representation_stability": {"n_samples": 2},
    "faithfulness_correlation": {"n_samples": 4, "subset_size": 64}, "faithfulness_estimate": {"patch_size": 16},
    "monotonicity_correlation": {"patch_size": 16, "n_samples": 2}, "pixel_flipping": {"n_steps": 6},
    "infidelity": {"n_samples": 3}, "naopc": {"patch_size": 16, "beam_size": 1},
}


def method_options(name: str) -> dict[str, Any]:
    return dict(METHODS.get(name, {}))


def metric_options(name: str) -> dict[str, Any]:
    return dict(METRICS.get(name, {}))
