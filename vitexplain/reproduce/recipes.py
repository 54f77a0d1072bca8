"""One recipe per published table: what the paper fixes (data, model, methods, protocol), as data.

A recipe is a grid of rows (the table's methods, each a registered method with the options the
paper's protocol used) and columns (the table's numbers). Every column belongs to a *group*; a
*setting* (one model, one dataset, one target mode, some metrics) computes the columns of its group
for the rows it lists. A table whose rows were produced under different protocols (GradToken
Table 1 copies six rows from Chefer et al.) therefore has one setting per protocol in the same group.
Where a paper is silent the recipe decides, and says so in its ``notes`` (also in
docs/decisions/reproduce.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    """A model of the papers.

    Attributes:
        source: timm name with its pretrained tag (weights from the local cache), or None when the
            paper's model has no public weights: the user then gives a checkpoint.
        arch: timm architecture of such a checkpoint (for a text model: what it should be).
        description: what the model is, for messages.
        text: a transformers text classifier, given as a local model directory with its tokenizer.
    """

    source: str | None
    arch: str
    description: str
    text: bool = False


@dataclass(frozen=True)
class DataInput:
    """A dataset the user provides: its command-line flag and what the path must hold."""

    flag: str
    description: str
    optional: bool = False


@dataclass(frozen=True)
class DataSpec:
    """How a setting reads its images.

    Attributes:
        input: key of :data:`DATA_INPUTS` (the user's path).
        dataset: registered dataset name (:func:`vitexplain.datasets.get_dataset`).
        preprocess: ``"chefer"`` (``Resize((224, 224))``, bilinear, the model's mean/std: Chefer et
            al.'s evaluation code), ``"tis"`` (ImageNet mean/std for every model, then ``Resize(256, 256)``
            of the normalised image, bilinear without antialiasing (OpenCV's ``INTER_LINEAR``), then
            ``CenterCrop(224)``: the TIS authors' albumentations transform) or ``"tokenizer"`` (text:
            the tokenizer of the model's directory).
        size: images in the paper's run (for the notes and the GPU estimate).
        options: further loader options (split, boxes).
        subset: a seeded random subset of this many images (drawn with the recipe's seed).
        indices_input: optional key of :data:`DATA_INPUTS` holding a published index list that
            replaces ``subset``.
        per_class: one item per (image, class present) with that class's mask (VOC).
    """

    input: str
    dataset: str
    preprocess: str
    size: int
    options: dict[str, Any] = field(default_factory=dict)
    subset: int | None = None
    indices_input: str | None = None
    per_class: bool = False


@dataclass(frozen=True)
class Row:
    """A table row: its label in the paper and the registered method and options behind it."""

    label: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricUse:
    """A registered metric with options, named ``label`` in the setting."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """One benchmark run: ``model`` (key of :data:`MODELS`) on ``data`` for ``rows`` (None: all rows)."""

    key: str
    group: str
    model: str
    data: DataSpec
    target: str
    metrics: tuple[MetricUse, ...]
    rows: tuple[str, ...] | None = None

    def covers(self, row: str) -> bool:
        return self.rows is None or row in self.rows


@dataclass(frozen=True)
class Column:
    """A table column: YAML key, header levels as in the paper, and the number of its group's setting."""

    key: str
    header: tuple[str, ...]
    group: str
    metric: str
    number: str


@dataclass(frozen=True)
class Recipe:
    """Everything needed to reproduce one published table."""

    name: str
    paper: str
    title: str
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    settings: tuple[Setting, ...]
    seed: int = 0
    notes: tuple[str, ...] = ()

    def setting_for(self, row: str, column: Column) -> Setting | None:
        """The setting that computes ``row`` in ``column``, or None when the paper has no such cell."""
        for setting in self.settings:
            if setting.group == column.group and setting.covers(row):
                return setting
        return None

    def models(self) -> list[str]:
        return list(dict.fromkeys(setting.model for setting in self.settings))

    def inputs(self) -> list[str]:
        keys = [key for s in self.settings for key in (s.data.input, s.data.indices_input) if key]
        return list(dict.fromkeys(keys))


# ------------------------------------------------------------------------------------ inputs, models

DATA_INPUTS = {
    "imagenet_seg": DataInput("--imagenet-seg", "ImageNet-Segmentation (Guillaumin et al., 2014): the folder holding "
                              "gtsegs_ijcv.mat (4,276 images), or the file itself"),
    "imagenet": DataInput("--imagenet", "the ImageNet (ILSVRC2012) validation set: 50,000 images with labels "
                          "(class folders, or flat files with LOC_val_solution.csv or the devkit ground truth) "
                          "and, for the pointing game, the boxes (Annotations/CLS-LOC/val/*.xml or the CSV)"),
    "tis_indices": DataInput("--tis-indices", "optional: the TIS authors' 5,000 image indices "
                             "(config/dataset/indices/sub5000.yaml of aenglebert/Transformer_Input_Sampling); "
                             "without it a seeded subset of our own is drawn", optional=True),
    "cifar10": DataInput("--cifar10", "the folder holding cifar-10-batches-py/ (the python pickles)"),
    "cifar100": DataInput("--cifar100", "the folder holding cifar-100-python/ (the python pickles)"),
    "voc": DataInput("--voc", "the folder holding VOCdevkit/VOC2012 (val split of the segmentation task)"),
    "movie_reviews": DataInput("--movie-reviews", "ERASER Movie Reviews (DeYoung et al., 2020): the test split "
                               "with its human rationales"),
}

MODELS = {
    "deit_base": ModelSpec("deit_base_patch16_224.fb_in1k", "deit_base_patch16_224",
                           "DeiT-B/16 trained on ImageNet-1k (Touvron et al.)"),
    "vit_base": ModelSpec("vit_base_patch16_224.orig_in21k_ft_in1k", "vit_base_patch16_224",
                          "ViT-B/16, ImageNet-21k pretraining, ImageNet-1k fine-tuning (the original JAX weights "
                          "Chefer et al. and the TIS authors load)"),
    "vit_large": ModelSpec("vit_large_patch16_224.augreg_in21k_ft_in1k", "vit_large_patch16_224",
                           "ViT-L/16 at 224, ImageNet-21k pretraining, ImageNet-1k fine-tuning"),
    "deit_cifar10": ModelSpec(None, "deit_base_patch16_224", "DeiT-B/16 fine-tuned on CIFAR-10 at 224 x 224 "
                              "(10 classes); TokenTM names no checkpoint"),
    "deit_cifar100": ModelSpec(None, "deit_base_patch16_224", "DeiT-B/16 fine-tuned on CIFAR-100 at 224 x 224 "
                               "(100 fine classes); TokenTM names no checkpoint"),
    "vit_voc": ModelSpec(None, "vit_base_patch16_224", "ViT-B/16 fine-tuned on PASCAL VOC 2012 (20 outputs in the "
                         "order of vitexplain.datasets.VOC_CLASSES); GradToken names no checkpoint"),
    "bert_movies": ModelSpec(None, "bert-base-uncased", "BERT-base fine-tuned on ERASER Movie Reviews "
                             "(sentiment: NEG, POS), a local transformers model directory with its tokenizer",
                             text=True),
}

# --------------------------------------------------------------------------------------------- data

IMAGENET_SEG = DataSpec("imagenet_seg", "imagenet_seg", "chefer", 4276)
IMAGENET_CHEFER = DataSpec("imagenet", "imagenet", "chefer", 50000)
CIFAR10 = DataSpec("cifar10", "cifar10", "chefer", 10000, {"split": "test"})
CIFAR100 = DataSpec("cifar100", "cifar100", "chefer", 10000, {"split": "test"})
VOC = DataSpec("voc", "voc", "chefer", 1449, {"split": "val"}, per_class=True)
IMAGENET_TIS = DataSpec("imagenet", "imagenet", "tis", 5000, subset=5000, indices_input="tis_indices")
IMAGENET_TIS_BOXES = DataSpec("imagenet", "imagenet", "tis", 5000, {"boxes": True}, subset=5000,
                              indices_input="tis_indices")
MOVIE_REVIEWS = DataSpec("movie_reviews", "movies", "tokenizer", 200, {"split": "test"})

SEG_MEAN = (MetricUse("segmentation", "segmentation", {"threshold": "mean"}),)
SEG_BEST = (MetricUse("segmentation", "segmentation", {"threshold": "best"}),)
PERTURBATION = (MetricUse("perturbation", "perturbation", {"direction": "both", "n_steps": 10}),)

# ------------------------------------------------------------------------------------------- TokenTM

TOKENTM = "TokenTM (Wu et al., CVPR 2024)"
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


def _perturbation_settings(model: str, data: DataSpec, rows_with_label: tuple[str, ...] | None = None) -> tuple[Setting, ...]:
    return (Setting("predicted", "predicted", model, data, "predicted", PERTURBATION),
            Setting("label", "label", model, data, "label", PERTURBATION, rows_with_label))


def _tokentm_perturbation(number: int, dataset: str, model: str, data: DataSpec, note: str) -> Recipe:
    return Recipe(
        f"tokentm-table{number}", TOKENTM, f"Table {number}: Results of Impact on Accuracy on {dataset}",
        TOKENTM_ROWS, _perturbation_columns("Predicted label", "GT label"), _perturbation_settings(model, data),
        notes=CHEFER_NOTES + (
            "Perturbation test of Chefer et al.: pixels removed (set to black) in 10 % steps from 0 to 90 %, "
            "top-1 accuracy against the ground-truth label, AUC in %; 'Predicted label' explains the "
            "prediction, 'GT label' the ground truth.", note))


TOKENTM_RECIPES = (
    Recipe("tokentm-table1", TOKENTM, "Table 1: Results of Localization Ability on ImageNet-Seg.", TOKENTM_ROWS,
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
    Recipe("tokentm-table5", TOKENTM, "Table 5: Results of Impact on Probability on more Vision Transformer models.",
           TOKENTM_ROWS,
           tuple(Column(f"{number}/{model}", (title, name), model, "aopc", number)
                 for number, title in (("aopc", "AOPC ↑"), ("log_odds", "LOdds ↓"))
                 for model, name in (("vit_base", "ViT-B"), ("vit_large", "ViT-L"))),
           tuple(Setting(model, model, model, IMAGENET_CHEFER, "predicted", (MetricUse("aopc", "aopc", {"n_steps": 10}),))
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
    Recipe("tokentm-table6", TOKENTM, "Table 6: Results of ablation study on the proposed components",
           (Row("Baseline", "tokentm", {"aggregate": False, "use_length": False, "use_necc": False}),
            Row("+ AF", "tokentm", {"use_length": False, "use_necc": False}),
            Row("+ AF + L", "tokentm", {"use_necc": False}),
            Row("+ AF + L + NECC", "tokentm")),
           TOKENTM_ABLATION_COLUMNS, TOKENTM_ABLATION_SETTINGS,
           notes=TOKENTM_ABLATION_NOTES + ("Variants as in docs/decisions/tokentm.md: Baseline = Eq. (8) on the "
                                           "input tokens (first MHSA alone), + AF = aggregation with C0 = I and "
                                           "W = I, + L adds the length ratio and C0 = diag(L(E0)), + NECC the full "
                                           "method.",)),
    Recipe("tokentm-table7", TOKENTM, "Table 7: Results of ablation study on the aggregation depth",
           tuple(Row(f"{n} layers", "tokentm", {"end_layer": n - 1}) for n in (3, 6, 9, 12)),
           TOKENTM_ABLATION_COLUMNS, TOKENTM_ABLATION_SETTINGS,
           notes=TOKENTM_ABLATION_NOTES + ("'n layers' aggregates the first n blocks, end_layer = n - 1 (each its MHSA and FFN "
                                           "update); 12 layers is the full ViT-B.",)),
)

# ----------------------------------------------------------------------------------------- GradToken

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
    Column("imagenet_seg/pixel_accuracy", ("ImageNet-Segmentation", "PAcc"), "imagenet_seg", "segmentation", "pixel_accuracy"),
    Column("imagenet_seg/map", ("ImageNet-Segmentation", "mAP"), "imagenet_seg", "segmentation", "map"),
    Column("imagenet_seg/miou", ("ImageNet-Segmentation", "mIoU"), "imagenet_seg", "segmentation", "miou"),
)
ABLATION_SEG_COLUMNS = tuple(Column(c.key.split("/")[1], c.header[1:], c.group, c.metric, c.number)
                             for c in IMAGENET_SEG_COLUMNS)
ABLATION_SEG_SETTING = (Setting("imagenet_seg", "imagenet_seg", "vit_base", IMAGENET_SEG, "predicted", SEG_BEST),)
ABLATION_NOTES = GRADTOKEN_NOTES + (GRADTOKEN_SEG_NOTE,)

GRADTOKEN_RECIPES = (
    Recipe("gradtoken-table1", GRADTOKEN, "Table 1: Segmentation performance (%) on the ImageNet-Segmentation and "
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
    Recipe("gradtoken-table2", GRADTOKEN, "Table 2: AUC scores (%) in the perturbation experiments on the ImageNet "
           "validation set",
           tuple(row for row in GRADTOKEN_ROWS if row.label not in ("absLRP", "AGCAM")),
           tuple(Column(f"{direction}/{group}", (title, name), group, "perturbation", f"{direction}_auc")
                 for direction, title in (("positive", "Positive ↓"), ("negative", "Negative ↑"))
                 for group, name in (("predicted", "Label Unknown"), ("label", "Label Known"))),
           _perturbation_settings("vit_base", IMAGENET_CHEFER,
                                  ("GradCAM", "LRP", "PLRP", "TransAttrib", "AttCAT", "ViT-CX", "GradToken",
                                   "GradToken" + TRANSPOSED)),
           notes=GRADTOKEN_NOTES + (
               "Perturbation test of Chefer et al. on the 50,000 validation images: 10 % of the pixels removed "
               "per step, AUC in %; 'Label Unknown' explains the predicted class, 'Label Known' the ground "
               "truth. The paper omits Rollout and RawAtten under 'Label Known' (class-agnostic methods); "
               "those cells are not run.",)),
    Recipe("gradtoken-fig6", GRADTOKEN, "Fig. 6: Token-F1 scores on the Movie Reviews dataset (top-k tokens)",
           _with_transposed((Row("GradToken", "gradtoken"), Row("RawAttn", "raw_attention"), Row("Rollout", "rollout"),
                             Row("GradCAM", "attn_gradcam"), Row("LRP", "lrp", CHEFER_LRP),
                             Row("PLRP", "partial_lrp", CHEFER_LRP),
                             Row("TransAttrib", "transformer_attribution"))),
           tuple(Column(f"k={k}", (f"k = {k}",), "movie_reviews", "rationale_f1", f"f1@{k}") for k in range(10, 90, 10)),
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
    Recipe("gradtoken-table3", GRADTOKEN, "Table 3: Effect of different aggregation and propagation schemes on "
           "segmentation performance (%)",
           _with_transposed((
               Row("GradToken-0", "gradtoken", {"propagation": "none"}),
               Row("GradToken-1", "gradtoken", {"aggregation": "rollout", "propagation": "elementwise"}),
               Row("GradToken-2", "gradtoken", {"aggregation": "rollout", "propagation": "matmul"}),
               Row("GradToken-3", "gradtoken", {"aggregation": "average", "propagation": "elementwise"}),
               Row("GradToken-4", "gradtoken", {"aggregation": "average", "propagation": "matmul"}))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING, notes=ABLATION_NOTES),
    Recipe("gradtoken-table4", GRADTOKEN, "Table 4: Effect of different multi-head relevance integration schemes "
           "on segmentation performance (%)",
           _with_transposed((Row("GradToken-i", "gradtoken", {"heads": "mean"}),
                             Row("GradToken-ii", "gradtoken", {"heads": "relu_mean"}))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING, notes=ABLATION_NOTES),
    Recipe("gradtoken-fig11", GRADTOKEN, "Fig. 11: The effect of class relevance back-propagation depths on "
           "segmentation performances",
           (Row("12", "gradtoken", {"start_layer": 11}),)    # no propagation: nothing to transpose
           + _with_transposed(tuple(Row(str(layer), "gradtoken", {"start_layer": layer - 1}) for layer in range(11, 0, -1))),
           ABLATION_SEG_COLUMNS, ABLATION_SEG_SETTING,
           notes=ABLATION_NOTES + (
               "Rows are the paper's 1-based layer numbers: relevance propagated down to layer n = start_layer n - 1; "
               "'12' is no propagation.",
               "Fig. 11 is a plot: the published numbers are the maxima annotated in it (Sec. 4.4.3) and the "
               "two configurations printed in Tables 1 and 3 (layer 1 = GradToken, layer 12 = GradToken-0).")),
)

# ----------------------------------------------------------------------------------------------- TIS

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


def _insertion_deletion_recipe(number: int, model: str, name: str) -> Recipe:
    baselines = (("mean", "Mean"), ("blur", "Blur"), ("black", "Black"), ("random", "Rand"))
    metrics = tuple(MetricUse(f"insertion_deletion[{baseline}]", "insertion_deletion",
                              {"baseline": baseline, "n_steps": 224}) for baseline, _ in baselines)
    columns = tuple(Column(f"{number_key}/{baseline}", (title, header), "all", f"insertion_deletion[{baseline}]", number_key)
                    for number_key, title in (("insertion", "Insertion ↑"), ("deletion", "Deletion ↓"),
                                              ("insertion_minus_deletion", "Insertion - Deletion ↑"))
                    for baseline, header in baselines)
    return Recipe(f"tis-table{number}", TIS, f"Table {number}: Results of the Insertion and Deletion metrics and their "
                  f"difference (Insertion - Deletion) for {name}", TIS_ROWS, columns,
                  (Setting(model, "all", model, IMAGENET_TIS, "label", metrics),), seed=12345,
                  notes=TIS_NOTES + ("Insertion / deletion as the TIS code: 224 steps, softmax probability, "
                                     "baselines made from the preprocessed image (black = zeros of the normalised "
                                     "tensor), AUC by RISE's trapezoid.",))


TIS_RECIPES = (
    _insertion_deletion_recipe(1, "vit_base", "ViT-Base"),
    _insertion_deletion_recipe(2, "deit_base", "DeiT-Base"),
    Recipe("tis-table3", TIS, "Table 3: Results of the Pointing Game metric for the ViT and DeiT model", TIS_ROWS_LONG,
           (Column("deit", ("DeiT",), "deit_base", "pointing_game", "accuracy"),
            Column("vit", ("ViT",), "vit_base", "pointing_game", "accuracy")),
           _tis_model_settings((MetricUse("pointing_game", "pointing_game", {"max_coverage": 0.5}),), IMAGENET_TIS_BOXES),
           seed=12345, notes=TIS_NOTES + ("Pointing game: images whose boxes cover 50 % or more of the image are "
                                          "excluded (the paper: 2,892 excluded, 2,108 kept).",)),
    Recipe("tis-table4", TIS, "Table 4: Results of the Max Sensitivity metric for the ViT and DeiT model", TIS_ROWS_LONG,
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

RECIPES: Registry[Recipe] = Registry("recipe", sort=False)
for _recipe in TOKENTM_RECIPES + GRADTOKEN_RECIPES + TIS_RECIPES:
    RECIPES.add(_recipe.name, _recipe)


def available_recipes() -> list[str]:
    """Names of every recipe, in paper and table order."""
    return RECIPES.names()


def get_recipe(name: str) -> Recipe:
    return RECIPES.get(name)
