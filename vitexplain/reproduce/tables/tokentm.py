"""TokenTM's tables (Wu et al., CVPR 2024): localisation, perturbation, ablations."""
from __future__ import annotations

from ..recipe import Column, DataSpec, MetricUse, Row, Setting, TableRecipe, register_recipes
from ._common import (
    CHEFER_LRP,
    CHEFER_NOTES,
    IMAGENET_CHEFER,
    IMAGENET_SEG,
    PERTURBATION,
    SEG_MEAN,
    perturbation_settings,
)

CIFAR10 = DataSpec("cifar10", "cifar10", "chefer", 10000, {"split": "test"})
CIFAR100 = DataSpec("cifar100", "cifar100", "chefer", 10000, {"split": "test"})

TOKENTM = "TokenTM (Wu et al., CVPR 2024)"

TOKENTM_ROWS = (
    Row("Grad-CAM", "attn_gradcam"),
    Row("LRP", "lrp", CHEFER_LRP),
    Row("Cons. LRP", "conservative_lrp"),
    Row("Trans. Attr.", "transformer_attribution", {"start_layer": 1}),
    Row("Raw Att.", "raw_attention"),
    Row("Rollout", "rollout", {"start_layer": 1}),
    Row("ATTCAT", "attcat"),
    Row("GAE", "gae"),
    Row("Ours", "tokentm"),
)
SEG_COLUMNS = (
    Column("pixel_accuracy", ("Pix. Acc. ↑",), "seg", "segmentation", "pixel_accuracy"),
    Column("map", ("mAP ↑",), "seg", "segmentation", "map"),
    Column("miou", ("mIoU ↑",), "seg", "segmentation", "miou"),
)


def _perturbation_columns(first: str, second: str) -> tuple[Column, ...]:
    """TokenTM Tables 2-4: (Predicted label | GT label) x (Neg. | Pos.)."""
    return tuple(Column(f"{group}/{direction}", (title, header), group, "perturbation", f"{direction}_auc")
                 for group, title in (("predicted", first), ("label", second))
                 for direction, header in (("negative", "Neg. ↑"), ("positive", "Pos. ↓")))


def _tokentm_perturbation(number: int, dataset: str, model: str, data: DataSpec, note: str) -> TableRecipe:
    return TableRecipe(
        f"tokentm-table{number}", TOKENTM, f"Table {number}: Results of Impact on Accuracy on {dataset}",
        TOKENTM_ROWS, _perturbation_columns("Predicted label", "GT label"), perturbation_settings(model, data),
        notes=CHEFER_NOTES + (
            "Perturbation test of Chefer et al.: pixels removed (set to black) in 10 % steps from 0 to 90 %, "
            "top-1 accuracy against the ground-truth label, AUC in %; 'Predicted label' explains the "
            "prediction, 'GT label' the ground truth.", note))


TOKENTM_RECIPES = (
    TableRecipe("tokentm-table1", TOKENTM, "Table 1: Results of Localization Ability on ImageNet-Seg.", TOKENTM_ROWS,
           SEG_COLUMNS, (Setting("seg", "seg", "deit_base", IMAGENET_SEG, "predicted", SEG_MEAN),),
           notes=CHEFER_NOTES + ("Sec. 5.2: DeiT on ImageNet-Segmentation, the predicted class explained, the mean "
                                 "of each map as threshold. DeiT = deit_base_patch16_224 (the paper names no size).",)),
    _tokentm_perturbation(2, "CIFAR-10", "deit_cifar10", CIFAR10,
                          "The DeiT fine-tuned on CIFAR-10 is not public: give it as a checkpoint. CIFAR images are "
                          "resized from 32 to 224 pixels (bilinear), all 10,000 test images."),
    _tokentm_perturbation(3, "CIFAR-100", "deit_cifar100", CIFAR100,
                          "The DeiT fine-tuned on CIFAR-100 is not public: give it as a checkpoint. CIFAR images are "
                          "resized from 32 to 224 pixels (bilinear), all 10,000 test images."),
    _tokentm_perturbation(4, "ImageNet", "deit_base", IMAGENET_CHEFER,
                          "DeiT-B/16 on all 50,000 ImageNet validation images (the paper names neither a size nor "
                          "a subset; Chefer et al.'s code runs the whole validation set)."),
    TableRecipe("tokentm-table5", TOKENTM,
                "Table 5: Results of Impact on Probability on more Vision Transformer models.",
           TOKENTM_ROWS,
           tuple(Column(f"{number}/{model}", (title, name), model, "aopc", number)
                 for number, title in (("aopc", "AOPC ↑"), ("log_odds", "LOdds ↓"))
                 for model, name in (("vit_base", "ViT-B"), ("vit_large", "ViT-L"))),
           tuple(Setting(model, model, model, IMAGENET_CHEFER, "predicted",
                         (MetricUse("aopc", "aopc", {"n_steps": 10}),))
                 for model in ("vit_base", "vit_large")),
           notes=CHEFER_NOTES + (
               "AOPC and LOdds w.r.t. the predicted label (Sec. 5.2); the paper gives no removal schedule: the "
               "pixel removal of its perturbation test (black, 0-90 % in 10 % steps) is used, AOPC = mean drop "
               "of the predicted class's probability, LOdds = mean log(p(x_k) / p(x)) over the same levels.",
               "ViT-B/16 = vit_base_patch16_224.orig_in21k_ft_in1k (Chefer et al.'s weights); ViT-L/16 = "
               "vit_large_patch16_224.augreg_in21k_ft_in1k (timm's only ImageNet-1k ViT-L/16 at 224); all "
               "50,000 validation images.")),
)

TOKENTM_ABLATION_SETTINGS = (
    Setting("seg", "seg", "vit_base", IMAGENET_SEG, "predicted", SEG_MEAN),
    Setting("perturbation", "perturbation", "vit_base", IMAGENET_CHEFER, "predicted", PERTURBATION),
)
TOKENTM_ABLATION_COLUMNS = tuple(Column(c.key, ("Segmentation", c.header[0]), c.group, c.metric, c.number)
                                 for c in SEG_COLUMNS) + (
    Column("negative", ("Perturbation Test", "Neg. ↑"), "perturbation", "perturbation", "negative_auc"),
    Column("positive", ("Perturbation Test", "Pos. ↓"), "perturbation", "perturbation", "positive_auc"),
)
TOKENTM_ABLATION_NOTES = CHEFER_NOTES + (
    "Sec. 5.4: 'experiments on ImageNet, based on ViT-B': the segmentation columns are taken on "
    "ImageNet-Segmentation (the ImageNet subset with masks) and the perturbation columns on the 50,000 "
    "ImageNet validation images, both with vit_base_patch16_224.orig_in21k_ft_in1k.",
    "The paper does not say which class the ablation's perturbation test explains: the predicted class.",
)
TOKENTM_RECIPES += (
    TableRecipe("tokentm-table6", TOKENTM, "Table 6: Results of ablation study on the proposed components",
           (Row("Baseline", "tokentm", {"aggregate": False, "use_length": False, "use_necc": False}),
            Row("+ AF", "tokentm", {"use_length": False, "use_necc": False}),
            Row("+ AF + L", "tokentm", {"use_necc": False}),
            Row("+ AF + L + NECC", "tokentm")),
           TOKENTM_ABLATION_COLUMNS, TOKENTM_ABLATION_SETTINGS,
           notes=TOKENTM_ABLATION_NOTES + ("Variants as in docs/decisions/tokentm.md: Baseline = Eq. (8) on the "
                                           "input tokens (first MHSA alone), + AF = aggregation with C0 = I and "
                                           "W = I, + L adds the length ratio and C0 = diag(L(E0)), + NECC the full "
                                           "method.",)),
    TableRecipe("tokentm-table7", TOKENTM, "Table 7: Results of ablation study on the aggregation depth",
           tuple(Row(f"{n} layers", "tokentm", {"end_layer": n - 1}) for n in (3, 6, 9, 12)),
           TOKENTM_ABLATION_COLUMNS, TOKENTM_ABLATION_SETTINGS,
           notes=TOKENTM_ABLATION_NOTES + ("'n layers' aggregates the first n blocks, end_layer = n - 1 "
                                           "(each its MHSA and FFN update); 12 layers is the full ViT-B.",)),
)

register_recipes(*TOKENTM_RECIPES)
