"""Protocol pieces several papers' tables share: the datasets as the papers read them, the metric settings
of Chefer et al.'s protocol, and its notes."""
from __future__ import annotations

from ..recipe import DataSpec, MetricUse, Setting

IMAGENET_SEG = DataSpec("imagenet_seg", "imagenet_seg", "chefer", 4276)
IMAGENET_CHEFER = DataSpec("imagenet", "imagenet", "chefer", 50000)

SEG_MEAN = (MetricUse("segmentation", "segmentation", {"threshold": "mean"}),)
SEG_BEST = (MetricUse("segmentation", "segmentation", {"threshold": "best"}),)
PERTURBATION = (MetricUse("perturbation", "perturbation", {"direction": "both", "n_steps": 10}),)

#: the LRP baselines as Chefer et al.'s ViT_orig_LRP computes them
CHEFER_LRP = {"linear_rule": "separate"}
CHEFER_LRP_NOTE = ("LRP and partial LRP run with the Linear rule of Chefer et al.'s layers_lrp.py "
                   "(linear_rule='separate': the x+ and x- parts normalised separately), the code behind the "
                   "ViT_orig_LRP baselines whose numbers the papers report; vitexplain's default is the "
                   "shared-denominator rule (docs/decisions/lrp.md).")
CHEFER_NOTES = (
    "Protocol of Chefer et al. (CVPR 2021, hila-chefer/Transformer-Explainability), which the paper follows: "
    "images resized to 224 x 224 without crop (bilinear), maps upsampled bilinearly and min-max normalised; "
    "rollout and transformer attribution start at block 1 (start_layer=1), as in that code.",
    "Grad-CAM is Chefer et al.'s Grad-CAM on the last block's attention (attn_gradcam), the one their "
    "protocol evaluates; LRP is full LRP to the pixels, Cons. LRP the conservative LRP of Ali et al. (2022).",
    CHEFER_LRP_NOTE,
)


def perturbation_settings(model: str, data: DataSpec,
                          rows_with_label: tuple[str, ...] | None = None) -> tuple[Setting, ...]:
    """Chefer et al.'s perturbation test on the predicted class and on the label (rows_with_label: the rows the
    paper reports with the label; None: all)."""
    return (Setting("predicted", "predicted", model, data, "predicted", PERTURBATION),
            Setting("label", "label", model, data, "label", PERTURBATION, rows_with_label))
