"""GradToken's tables (Cheng et al., Neural Networks 2024)."""
from __future__ import annotations

from ..recipe import Column, DataSpec, MetricUse, Row, Setting, TableRecipe, register_recipes
from ._common import (
    CHEFER_LRP,
    CHEFER_LRP_NOTE,
    CHEFER_NOTES,
    IMAGENET_CHEFER,
    IMAGENET_SEG,
    SEG_BEST,
    SEG_MEAN,
    perturbation_settings,
)

VOC = DataSpec("voc", "voc", "chefer", 1449, {"split": "val"}, per_class=True)
MOVIE_REVIEWS = DataSpec("movie_reviews", "movies", "tokenizer", 200, {"split": "test"})

GRADTOKEN = "GradToken (Cheng et al., Neural Networks 2024)"
GRADTOKEN_LITERATURE = ("Rollout", "RawAtten", "GradCAM", "LRP", "PLRP", "TransAttrib")
TRANSPOSED = " (transposed)"


def _with_transposed(rows: tuple[Row, ...]) -> tuple[Row, ...]:
    """Each GradToken row with matrix propagation, followed by its twin under vitexplain's transposed reading."""
    twins = []
    for row in rows:
        twins.append(row)
        if row.method == "gradtoken" and row.options.get("propagation", "matmul") == "matmul":
            twins.append(Row(row.label + TRANSPOSED, row.method, {**row.options, "transpose": True}))
    return tuple(twins)


GRADTOKEN_ROWS = _with_transposed((
    Row("Rollout", "rollout", {"start_layer": 1}),
    Row("RawAtten", "raw_attention"),
    Row("GradCAM", "attn_gradcam"),
    Row("LRP", "lrp", CHEFER_LRP),
    Row("PLRP", "partial_lrp", CHEFER_LRP),
    Row("TransAttrib", "transformer_attribution", {"start_layer": 1}),
    Row("AttCAT", "attcat"),
    Row("ViT-CX", "vitcx"),
    Row("absLRP", "abs_lrp"),
    Row("AGCAM", "agcam"),
    Row("GradToken", "gradtoken"),
))
GRADTOKEN_NOTES = CHEFER_NOTES[:1] + (CHEFER_LRP_NOTE,) + (
    "Sec. 4.1.1: ViT-B/16 for vision = vit_base_patch16_224.orig_in21k_ft_in1k, the weights of Chefer et al.'s "
    "code, whose settings the paper follows.",
    "GradCAM is Chefer et al.'s attention Grad-CAM (attn_gradcam): Sec. 3.5.3 describes gradients with respect "
    "to the attention map, one weight per head.",
    "GradToken rows are the method as printed (Eq. 13 / 16, Algorithm 1: M = A M, the rows of A as queries); the "
    "rows marked '(transposed)' are vitexplain's variant M = A^T M (transpose=True, docs/decisions/gradtoken.md), "
    "which the paper does not print: both are run so that the table shows which reading reproduces the published "
    "numbers.",
)
GRADTOKEN_SEG_NOTE = ("Segmentation with GradToken's protocol (Sec. 4.2.1): predicted class explained, maps "
                      "normalised and binarised at the best threshold of 0, 0.1, ..., 0.9 'for each method': one "
                      "threshold per method and dataset, the one with the highest mIoU, PAcc and mIoU both "
                      "reported at it (a footnote names it); metric_options={'segmentation': {'threshold': "
                      "'best_per_metric'}} picks PAcc's own best threshold instead.")
IMAGENET_SEG_COLUMNS = (
    Column("imagenet_seg/pixel_accuracy", ("ImageNet-Segmentation", "PAcc"), "imagenet_seg", "segmentation",
           "pixel_accuracy"),
    Column("imagenet_seg/map", ("ImageNet-Segmentation", "mAP"), "imagenet_seg", "segmentation", "map"),
    Column("imagenet_seg/miou", ("ImageNet-Segmentation", "mIoU"), "imagenet_seg", "segmentation", "miou"),
)
ABLATION_SEG_COLUMNS = tuple(Column(c.key.split("/")[1], c.header[1:], c.group, c.metric, c.number)
                             for c in IMAGENET_SEG_COLUMNS)
ABLATION_SEG_SETTING = (Setting("imagenet_seg", "imagenet_seg", "vit_base", IMAGENET_SEG, "predicted", SEG_BEST),)
ABLATION_NOTES = GRADTOKEN_NOTES + (GRADTOKEN_SEG_NOTE,)

GRADTOKEN_RECIPES = (
    TableRecipe("gradtoken-table1", GRADTOKEN, "Table 1: Segmentation performance (%) on the ImageNet-Segmentation and "
           "VOC validation datasets", GRADTOKEN_ROWS,
           IMAGENET_SEG_COLUMNS + (
               Column("voc/pixel_accuracy", ("VOC", "PAcc"), "voc", "segmentation", "pixel_accuracy"),
               Column("voc/miou", ("VOC", "mIoU"), "voc", "segmentation", "miou")),
           (Setting("imagenet_seg_literature", "imagenet_seg", "vit_base", IMAGENET_SEG, "predicted", SEG_MEAN,
                    GRADTOKEN_LITERATURE),
            Setting("imagenet_seg", "imagenet_seg", "vit_base", IMAGENET_SEG, "predicted", SEG_BEST),
            Setting("voc", "voc", "vit_voc", VOC, "label", SEG_BEST)),
           notes=GRADTOKEN_NOTES + (
               GRADTOKEN_SEG_NOTE,
               "The ImageNet-Segmentation numbers of Rollout, RawAtten, GradCAM, LRP, PLRP and TransAttrib are "
               "copied from Chefer et al. (CVPR 2021), who threshold at each map's mean: those cells are "
               "reproduced with Chefer et al.'s protocol (mean threshold), the others with GradToken's.",
               "VOC (Sec. 4.2.1: 'the ground truth class labels are chosen as the targets'): one item per "
               "(val image, class present), the map explaining that class, its pixels as foreground, best "
               "threshold. The paper names no VOC classifier: give a ViT-B/16 fine-tuned on VOC as a "
               "checkpoint. VOC's void border pixels are left out of every count, as Chefer et al.'s VOC code "
               "does.")),
    TableRecipe("gradtoken-table2", GRADTOKEN,
                "Table 2: AUC scores (%) in the perturbation experiments on the ImageNet "
           "validation set",
           tuple(row for row in GRADTOKEN_ROWS if row.label not in ("absLRP", "AGCAM")),
           tuple(Column(f"{direction}/{group}", (title, name), group, "perturbation", f"{direction}_auc")
                 for direction, title in (("positive", "Positive ↓"), ("negative", "Negative ↑"))
                 for group, name in (("predicted", "Label Unknown"), ("label", "Label Known"))),
           perturbation_settings("vit_base", IMAGENET_CHEFER,
                                  ("GradCAM", "LRP", "PLRP", "TransAttrib", "AttCAT", "ViT-CX", "GradToken",
                                   "GradToken" + TRANSPOSED)),
           notes=GRADTOKEN_NOTES + (
               "Perturbation test of Chefer et al. on the 50,000 validation images: 10 % of the pixels removed "
               "per step, AUC in %; 'Label Unknown' explains the predicted class, 'Label Known' the ground "
               "truth. The paper omits Rollout and RawAtten under 'Label Known' (class-agnostic methods); "
               "those cells are not run.",)),
    TableRecipe("gradtoken-fig6", GRADTOKEN, "Fig. 6: Token-F1 scores on the Movie Reviews dataset (top-k tokens)",
           _with_transposed((Row("GradToken", "gradtoken"), Row("RawAttn", "raw_attention"), Row("Rollout", "rollout"),
                             Row("GradCAM", "attn_gradcam"), Row("LRP", "lrp", CHEFER_LRP),
                             Row("PLRP", "partial_lrp", CHEFER_LRP),
                             Row("TransAttrib", "transformer_attribution"))),
           tuple(Column(f"k={k}", (f"k = {k}",), "movie_reviews", "rationale_f1", f"f1@{k}")
                 for k in range(10, 90, 10)),
           (Setting("movie_reviews", "movie_reviews", "bert_movies", MOVIE_REVIEWS, "predicted",
                    (MetricUse("rationale_f1", "rationale_f1", {"ks": tuple(range(10, 90, 10))}),)),),
           notes=(
               "Sec. 4.2.3: BERT trained on the Movie Reviews training set; token-F1 between the top-k tokens "
               "of each explanation and the human rationales on the test set, k = 10, 20, ..., 80 (ERASER, "
               "DeYoung et al. 2020, as Chefer et al. 2021).",
               "The paper names GradToken and 'six other methods'; the text mentions RawAttn, GradCAM, LRP and "
               "Rollout: the six are taken to be the set of Chefer et al.'s Movie Reviews experiment (raw "
               "attention, rollout, GradCAM, LRP, partial LRP, transformer attribution). The predicted class "
               "is explained (the paper does not say). Reviews are tokenised word by word and truncated to 512 "
               "word pieces, as Chefer et al.'s pipeline.",
               CHEFER_LRP_NOTE,
               "Fig. 6 is a line plot: its values are not printed, so no published number is stored.")),
    TableRecipe("gradtoken-table3", GRADTOKEN, "Table 3: Effect of different aggregation and propagation schemes on "
           "segmentation performance (%)",
           _with_transposed((
               Row("GradToken-0", "gradtoken", {"propagation": "none"}),
               Row("GradToken-1", "gradtoken", {"aggregation": "rollout", "propagation": "elementwise"}),
               Row("GradToken-2", "gradtoken", {"aggregation": "rollout", "propagation": "matmul"}),
               Row("GradToken-3", "gradtoken", {"aggregation": "average", "propagation": "elementwise"}),
               Row("GradToken-4", "gradtoken", {"aggregation": "average", "propagation": "matmul"}))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING, notes=ABLATION_NOTES),
    TableRecipe("gradtoken-table4", GRADTOKEN, "Table 4: Effect of different multi-head relevance integration schemes "
           "on segmentation performance (%)",
           _with_transposed((Row("GradToken-i", "gradtoken", {"heads": "mean"}),
                             Row("GradToken-ii", "gradtoken", {"heads": "relu_mean"}))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING, notes=ABLATION_NOTES),
    TableRecipe("gradtoken-fig11", GRADTOKEN, "Fig. 11: The effect of class relevance back-propagation depths on "
           "segmentation performances",
           (Row("12", "gradtoken", {"start_layer": 11}),)    # no propagation: nothing to transpose
           + _with_transposed(tuple(Row(str(layer), "gradtoken", {"start_layer": layer - 1})
                                    for layer in range(11, 0, -1))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING,
           notes=ABLATION_NOTES + (
               "Rows are the paper's 1-based layer numbers: relevance propagated down to layer n = start_layer n - 1; "
               "'12' is no propagation.",
               "Fig. 11 is a plot: the published numbers are the maxima annotated in it (Sec. 4.4.3) and the "
               "two configurations printed in Tables 1 and 3 (layer 1 = GradToken, layer 12 = GradToken-0).")),
)

register_recipes(*GRADTOKEN_RECIPES)
