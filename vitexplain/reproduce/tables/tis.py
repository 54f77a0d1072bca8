"""TIS's tables (Englebert et al., ICCV 2023 workshops): insertion / deletion, pointing game, max-sensitivity."""
from __future__ import annotations

from ..recipe import Column, DataSpec, MetricUse, Row, Setting, TableRecipe, register_recipes

IMAGENET_TIS = DataSpec("imagenet", "imagenet", "tis", 5000, subset=5000, indices_input="tis_indices")
IMAGENET_TIS_BOXES = DataSpec("imagenet", "imagenet", "tis", 5000, {"boxes": True}, subset=5000,
                              indices_input="tis_indices")


TIS = "TIS (Englebert et al., ICCV 2023 workshops)"
TIS_METHODS = (
    ("TIS", "tis", {"n_masks": 1024, "ratio": 0.5}),
    ("ViT-CX", "vitcx", {}),
    ("TAM", "tam", {"start_layer": 0, "n_steps": 20}),
    ("Chefer1", "transformer_attribution", {"start_layer": 0}),
    ("Chefer2", "gae", {}),
    ("Att. Rollout", "rollout", {"head_fusion": "mean", "discard_ratio": 0.9}),
    ("BT H", "bt_head", {"start_layer": 0}),
    ("BT T", "bt_token", {"start_layer": 0}),
    ("RISE", "rise", {"n_masks": 4000, "grid_size": 8, "p1": 0.1, "score": "logit"}),
    ("IntegratedGrad", "integrated_gradients", {"n_steps": 50}),
    ("SmoothGrad", "smoothgrad", {"n_samples": 50}),
)
TIS_LONG_NAMES = {"Att. Rollout": "Attention Rollout", "IntegratedGrad": "Integrated Gradient"}
TIS_ROWS = tuple(Row(label, method, options) for label, method, options in TIS_METHODS)
TIS_ROWS_LONG = tuple(Row(TIS_LONG_NAMES.get(r.label, r.label), r.method, r.options) for r in TIS_ROWS)
TIS_NOTES = (
    "Sec. 4: 5,000 random ImageNet validation images; the authors' code (aenglebert/Transformer_Input_Sampling) "
    "explains the dataset label, seeds 12345, normalises with the ImageNet mean/std for both models, resizes the "
    "normalised image to 256 x 256 with OpenCV's INTER_LINEAR (albumentations; bilinear, no antialiasing) and "
    "centre-crops 224. Without --tis-indices the subset is our own seeded draw (seed 12345), "
    "not the authors' list.",
    "Models as the authors' configs: ViT = vit_base_patch16_224.orig_in21k_ft_in1k, DeiT = deit_base_patch16_224 "
    "(fb_in1k; the paper's text mentions a distillation token, its code loads the plain DeiT-B).",
    "Methods as Sec. 4 and the authors' configs: TIS 1024 masks, ratio 0.5; TAM 20 steps from block 0; BT from "
    "block 0 (their start_layer=1); Chefer1 = transformer attribution, Chefer2 = GAE; rollout with head mean and "
    "discard ratio 0.9 (vit-explain); RISE 4000 masks, s = 8, p1 = 0.1 on logits; IG 50 steps; SmoothGrad 50 "
    "samples (the paper's number).",
)


#: Table 4's rows by how the authors' wrapper hands the map to Captum: (setting key suffix, max_sensitivity
#: options, rows). Rows not named in the first three get the plain metric.
TIS_SENSITIVITY_PROTOCOLS = (
    ("/minmax_reseed", {"normalise": "minmax", "reseed": True}, ("TIS",)),
    ("/max", {"normalise": "max"}, ("Attention Rollout",)),
    ("/reseed", {"reseed": True}, ("ViT-CX", "SmoothGrad")),
    ("", {}, ("Chefer1", "Chefer2", "TAM", "BT H", "BT T", "RISE", "Integrated Gradient")),
)


def _tis_model_settings(metrics: tuple[MetricUse, ...], data: DataSpec) -> tuple[Setting, ...]:
    return tuple(Setting(model, model, model, data, "label", metrics) for model in ("deit_base", "vit_base"))


def _insertion_deletion_recipe(number: int, model: str, name: str) -> TableRecipe:
    baselines = (("mean", "Mean"), ("blur", "Blur"), ("black", "Black"), ("random", "Rand"))
    metrics = tuple(MetricUse(f"insertion_deletion[{baseline}]", "insertion_deletion",
                              {"baseline": baseline, "n_steps": 224}) for baseline, _ in baselines)
    columns = tuple(Column(f"{number_key}/{baseline}", (title, header), "all", f"insertion_deletion[{baseline}]",
                           number_key)
                    for number_key, title in (("insertion", "Insertion ↑"), ("deletion", "Deletion ↓"),
                                              ("insertion_minus_deletion", "Insertion - Deletion ↑"))
                    for baseline, header in baselines)
    return TableRecipe(f"tis-table{number}", TIS,
                       f"Table {number}: Results of the Insertion and Deletion metrics and their "
                  f"difference (Insertion - Deletion) for {name}", TIS_ROWS, columns,
                  (Setting(model, "all", model, IMAGENET_TIS, "label", metrics),), seed=12345,
                  notes=TIS_NOTES + ("Insertion / deletion as the TIS code: 224 steps, softmax probability, "
                                     "baselines made from the preprocessed image (black = zeros of the normalised "
                                     "tensor), AUC by RISE's trapezoid.",))


TIS_RECIPES = (
    _insertion_deletion_recipe(1, "vit_base", "ViT-Base"),
    _insertion_deletion_recipe(2, "deit_base", "DeiT-Base"),
    TableRecipe("tis-table3", TIS,
                "Table 3: Results of the Pointing Game metric for the ViT and DeiT model", TIS_ROWS_LONG,
           (Column("deit", ("DeiT",), "deit_base", "pointing_game", "accuracy"),
            Column("vit", ("ViT",), "vit_base", "pointing_game", "accuracy")),
           _tis_model_settings((MetricUse("pointing_game", "pointing_game", {"max_coverage": 0.5}),),
                               IMAGENET_TIS_BOXES),
           seed=12345, notes=TIS_NOTES + ("Pointing game: images whose boxes cover 50 % or more of the image are "
                                          "excluded (the paper: 2,892 excluded, 2,108 kept).",)),
    TableRecipe("tis-table4", TIS,
                "Table 4: Results of the Max Sensitivity metric for the ViT and DeiT model", TIS_ROWS_LONG,
           (Column("deit", ("DeiT",), "deit_base", "max_sensitivity", "max_sensitivity"),
            Column("vit", ("ViT",), "vit_base", "max_sensitivity", "max_sensitivity")),
           tuple(Setting(f"{model}{suffix}", model, model, IMAGENET_TIS, "label",
                         (MetricUse("max_sensitivity", "max_sensitivity",
                                    {"n_samples": 10, "radius": 0.02, **options}),), rows)
                 for model in ("deit_base", "vit_base") for suffix, options, rows in TIS_SENSITIVITY_PROTOCOLS),
           seed=12345, notes=TIS_NOTES + (
               "Max-sensitivity as the authors' pipeline computes it: Captum's sensitivity_max, 10 samples of "
               "uniform noise of radius 0.02, on what each method's wrapper returns. TIS's wrapper min-max "
               "normalises its maps (normalise='minmax') and vit-explain's rollout divides by the maximum "
               "(normalise='max'); the other wrappers return raw maps. TIS (k-means from new random points), "
               "ViT-CX and SmoothGrad (new noise) draw fresh randomness on every call, so each perturbed call "
               "gets its own seed (reseed); RISE's masks are drawn once per run, so it keeps one seed. The plain "
               "Captum definition stays the metric's default (docs/decisions/metrics.md).",)),
)

register_recipes(*TIS_RECIPES)
