"""What a recipe is: one published table as data (data, model, methods, protocol), and the registry of them.

A recipe is a grid of rows (the table's methods, each a registered method with the options the
paper's protocol used) and columns (the table's numbers). Every column belongs to a *group*; a
*setting* (one model, one dataset, one target mode, some metrics) computes the columns of its group
for the rows it lists. A table whose rows were produced under different protocols (GradToken
Table 1 copies six rows from Chefer et al.) therefore has one setting per protocol in the same group.
Where a paper is silent the recipe decides, and says so in its ``notes`` (also in
docs/decisions/reproduce.md). Each paper's tables live in a module of :mod:`vitexplain.reproduce.tables`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    """A model of the papers.

    Attributes:
        source: timm name with its pretrained tag (weights downloaded by timm, or from its cache), or None when the
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
class TableRecipe:
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


#: recipes by name: papers in the order of their modules' names, each paper's tables in its order
RECIPES: Registry[TableRecipe] = Registry("recipe", "vitexplain.reproduce.tables", sort=False)


def register_recipes(*recipes: TableRecipe) -> None:
    """Register a paper's tables (called by its module under :mod:`vitexplain.reproduce.tables`)."""
    for recipe in recipes:
        RECIPES.add(recipe.name, recipe)


def available_recipes() -> list[str]:
    """Names of every recipe, paper by paper, each paper's tables in order."""
    return RECIPES.names()


def get_recipe(name: str) -> TableRecipe:
    return RECIPES.get(name)
