"""What a model family description says, and the defaults most Vision Transformers share.

A :class:`Family` is the one place that knows how one kind of model is laid out: which model classes it describes,
where its blocks are and what each holds (a :class:`~.stack.Stack`, read as
:class:`~vitexplain.instrumentation.blocks.BlockParts`), how many prefix tokens lead the sequence, how the output
reads the last tokens (:class:`Readout` kind and, for an attention-pooling head, :class:`ProbeParts`), where the
patch and position embeddings are (for LRP), how to run the model from its token embeddings on (token subsets), and
its tiny example models. Most of it is declared as data on the class; recognition, refusal reasons and block parts
follow from the declaration, and a family writes as functions only what truly differs. Recording, token subsets and
LRP rules all read it; adding a family is writing one of these in a module of this package, decorated with
:func:`register_family` (the registry imports every module here before its first lookup).
"""
from __future__ import annotations

import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Literal

import torch
from torch import Tensor, nn

from ...registry import Registry
from ..attention import AttentionInput, AttentionParts
from ..blocks import BlockParts
from .cascade import Cascade, Level
from .errors import UnsupportedModelError as UnsupportedModelError  # where the families and the package read it
from .examples import Example
from .stack import Stack, at


@dataclass(frozen=True)
class ProbeParts:
    """An attention-pooling head (MAP): learnt queries attending to the last block's tokens.

    Attributes:
        module: the pooling module; its ``forward`` is replaced while instrumented.
        attention: its attention (queries from ``attention.latent``).
        position: callable giving a position embedding added to the tokens first, or None.
        norm, mlp: the residual feed-forward after the attention (x + mlp(norm(x))), or None.
        pool: how the latent outputs become one vector: ``token`` (the first) or ``avg`` (their mean),
            or None when there is one latent.
        activation: the feed-forward's element-wise activation (LRP places its rule there).
    """

    module: nn.Module
    attention: AttentionParts
    position: Callable[[], Tensor] | None = None
    norm: nn.Module | None = None
    mlp: nn.Module | None = None
    pool: str | None = None
    activation: nn.Module | None = None


@dataclass(frozen=True)
class EmbeddingParts:
    """Where the patch and position embeddings are, for the LRP rules.

    Attributes:
        patch_embedding: the module whose output is the patch tokens (before prefix tokens and positions).
        convolution: the patch convolution (its input is the image), or None; or a Linear of the flattened
            patches, with ``as_pixels``.
        position_module: the module right after the position-embedding add (the add's rule is placed on
            its output), or None when the family adds no absolute position embedding.
        as_pixels: for a Linear patch projection, ``as_pixels(values, grid)`` lays values shaped as its input
            [B, h·w, P·P·C] out as the image it was cut from, [B, C, h·P, w·P] (padding included).
        channels_first: the patch embedding's output is laid out [B, C, h, w] (a bare convolution, flattened
            to tokens by the model's forward) rather than as tokens.
    """

    patch_embedding: nn.Module
    convolution: nn.Conv2d | nn.Linear | None
    position_module: nn.Module | None
    as_pixels: Callable[[Tensor, tuple[int, int]], Tensor] | None = None
    channels_first: bool = False


@dataclass
class TokenContext:
    """What the blocks need besides the tokens when a family runs them itself (token subsets).

    Attributes:
        rope: the rotary table of the patch tokens (family layout; rows = patches), or None.
        positions: sequence positions of the tokens present [B, N'] (prefix first), or None for all.
    """

    rope: Tensor | None = None
    positions: Tensor | None = None

    def select(self, rows: Tensor, positions: Tensor, num_prefix_tokens: int) -> TokenContext:
        """The context of sequences holding the tokens at ``positions`` [S, N'] of the inputs ``rows`` [S]."""
        rope = self.rope
        if rope is not None:
            patches = positions[:, num_prefix_tokens:] - num_prefix_tokens  # [S, K]
            rope = rope[..., patches, :].movedim(-3, 0)  # the patch axis gathered per sequence, batch first
            rope = rope.unsqueeze(-3) if rope.ndim == 3 else rope
        return replace(self, rope=rope, positions=positions)


class Family(ABC):
    """The description of one model family (see the module docstring).

    A subclass says where things are; everything here is the behaviour that follows from it. The
    defaults fit timm's ViT-style models (images in, a patch grid of tokens, ``forward`` returning logits).
    """

    #: human-readable name, used in messages and in the support matrix
    name: ClassVar[str] = ""
    #: where the family comes in lists (refusals, the support matrix's columns): lower first, then by name
    listing_order: ClassVar[int] = 50
    #: what the family's models read
    modality: ClassVar[Literal["image", "text"]] = "image"
    #: how the output reads the last block's tokens (per model; see :class:`Readout`)
    readout: Literal["token", "avg", "token_avg", "avgmax", "max", "map"] = "token"
    #: the attention-pooling head, for ``readout == "map"``
    probe: ProbeParts | None = None
    #: the caller's word on whether the outputs are class logits (None: decided from the model, :attr:`head_reason`)
    classes: bool | None = None
    #: the blocks take and return tokens sequence first, [N, B, C] (their ``inputs`` / ``output`` convert)
    sequence_first: bool = False

    # -- what a family declares ------------------------------------------------------------------
    #: the model classes described, as classes or "package.module.Class" (a package no model has imported is never
    #: imported to recognise a model)
    model_classes: ClassVar[tuple[str | type, ...]] = ()
    #: whether subclasses of :attr:`model_classes` are described too (False: exactly those classes, whose forward the
    #: family knows)
    subclasses: ClassVar[bool] = True
    #: classes among :attr:`model_classes`' subclasses that another family describes
    excluded_classes: ClassVar[tuple[str | type, ...]] = ()
    #: where the blocks are, which classes are described and where each keeps its parts
    stack: ClassVar[Stack | None] = None
    #: which parameters a model-randomisation cascade re-initialises, level by level: the head's modules (the blocks
    #: follow from :attr:`stack`, the embedding is the rest); None: the family's models are not randomised
    cascade: ClassVar[Cascade | None] = None
    #: what a recognised model must be, in order: each check gives the clause saying what it is not, or None
    refusals: ClassVar[tuple[Callable[[nn.Module], str | None], ...]] = ()
    #: the family's tiny example models (the support matrix's columns, the tests' models)
    example_models: ClassVar[tuple[Example, ...]] = ()
    #: module classes (or their "package.module.Class") that LRP's rules cover in the family's models, besides the
    #: model classes, blocks and attentions described; None: LRP is not placed on them
    lrp_modules: ClassVar[tuple[str | type, ...] | None] = None
    #: the dotted path (from the family) of the patch convolution, whose kernel is the patch and whose input channels
    #: are the images' (None: timm's ``model.patch_embed``)
    patch_convolution: ClassVar[str | None] = None
    #: the dotted path (from the family) of the one image size the model takes, a side or (h, w) (None: timm's
    #: ``model.patch_embed`` says which sizes)
    image_size: ClassVar[str | None] = None
    #: why the outputs are not class logits when the caller does not say (None: decided from the model's head)
    output_embedding: str | None = None

    def __init__(self, model: nn.Module):
        self.model = model
        self.blocks: list[BlockParts] = [self.block(module) for module in self.block_modules()]

    # -- what follows from the declaration ---------------------------------------------------------
    @classmethod
    def recognises(cls, model: nn.Module) -> bool:
        """Whether ``model`` is of the kind (the class) this family describes, whatever its settings: a
        refusal then gives this family's reason, not a list of every family's. A family that declares no
        :attr:`model_classes` recognises the models it describes."""
        if not cls.model_classes:
            return cls.unsupported_reason(model) is None
        classes = loaded_classes(cls.model_classes)
        ours = isinstance(model, classes) if cls.subclasses else type(model) in classes
        return ours and not isinstance(model, loaded_classes(cls.excluded_classes))

    @classmethod
    def unsupported_reason(cls, model: nn.Module) -> str | None:
        """For a model the family recognises: None when it describes it, else the first of its :attr:`refusals`
        (a clause: "its head pools with …", "block 0 is a …")."""
        return next((reason for check in cls.refusals if (reason := check(model)) is not None), None)

    @classmethod
    def examples(cls) -> dict[str, Callable[[], tuple[nn.Module, Any]]]:
        """Builders of the family's :attr:`example_models`, by label, each giving the model and an input batch: what
        the support matrix (:mod:`vitexplain.support`) runs every method on."""
        return {example.label: example.build for example in cls.example_models}

    def block_modules(self) -> Sequence[nn.Module]:
        """The Transformer blocks in order."""
        return self.stack.modules(self.model)

    def block(self, module: nn.Module) -> BlockParts:
        """Where one block keeps its parts (the :attr:`stack`'s, its attention's as :meth:`attention` reads them)."""
        return self.stack.block(module, self.attention)

    def randomisation_levels(self) -> list[Level]:
        """The model's levels of a model-randomisation cascade, top first (:class:`~.cascade.Cascade`): the parameters
        each re-initialises, as :attr:`cascade` declares them beside the blocks."""
        if self.cascade is None:
            raise UnsupportedModelError(f"model randomisation is not described for this {type(self.model).__name__} "
                                        f"({self.name}): its family declares no cascade of layers to re-initialise")
        return self.cascade.levels(self.model, self.block_modules(), self.stack.word)

    def attention(self, module: nn.Module) -> AttentionParts:
        """Where one block's attention module keeps its parts."""
        raise NotImplementedError(f"{type(self).__name__} reads its blocks' attention in its own block()")

    @property
    @abstractmethod
    def num_prefix_tokens(self) -> int: ...

    @property
    @abstractmethod
    def class_token_index(self) -> int | None: ...

    @property
    def head_reason(self) -> str | None:
        """None when the outputs are class logits; else why they are not (said when a class is asked of them)."""
        if self.classes is not None:
            return None if self.classes else "the caller said its outputs are not classes (classes=False)"
        if self.output_embedding is not None:
            return self.output_embedding
        if getattr(self.model, "num_classes", 1) == 0:
            return "this model has no classifier head (its output is an embedding)"
        return projection_head(self.model)

    @property
    def has_classes(self) -> bool:
        """Whether the output is class logits (else an embedding: no classifier head, or a projection head)."""
        return self.head_reason is None

    # -- images ----------------------------------------------------------------------------------
    @property
    def patch_size(self) -> tuple[int, int]:
        if self.patch_convolution is not None:
            return tuple(at(self, self.patch_convolution).kernel_size)
        return tuple(self.model.patch_embed.patch_size)

    @property
    def in_channels(self) -> int | None:
        """Channels of the images the model takes (None: not known, not checked): a patch convolution's."""
        if self.patch_convolution is not None:
            return at(self, self.patch_convolution).in_channels
        return getattr(self.model.patch_embed.proj, "in_channels", None)

    def grid_size(self, images: Tensor) -> tuple[int, ...]:
        """Patch grid (h, w) of a batch of images; raises on sizes the model cannot take."""
        if self.image_size is not None:
            size = at(self, self.image_size)
            return fixed_size_grid(images, (size, size) if isinstance(size, int) else size, self.patch_size)
        embed = self.model.patch_embed
        size = tuple(images.shape[-2:])
        dynamic = getattr(self.model, "dynamic_img_size", False)
        if getattr(embed, "strict_img_size", True) and not dynamic:
            if size != tuple(embed.img_size):
                raise ValueError(
                    f"this model takes {embed.img_size[0]}x{embed.img_size[1]} images, got {size[0]}x{size[1]}; "
                    "resize them, or build the model with dynamic_img_size=True")
        else:
            require_tiling(size, self.patch_size, getattr(embed, "dynamic_img_pad", False))
        if not dynamic:
            return tuple(embed.grid_size)
        if hasattr(embed, "dynamic_feat_size"):
            return tuple(embed.dynamic_feat_size(size))
        return tuple(side // patch for side, patch in zip(size, self.patch_size))  # a plain strided convolution

    def check_inputs(self, inputs: Any) -> Any:
        """What the user passed, checked (images [B, C, H, W] by default); the adapter moves it to the model."""
        return check_images(inputs, self.grid_size, self.in_channels)

    def forward(self, inputs: Any) -> Tensor:
        """The model's outputs [B, classes] (or [B, D]) on checked inputs."""
        return self.model(inputs)

    # -- running from the token embeddings (token subsets) ---------------------------------------
    def token_subsets_reason(self) -> str | None:
        """Why the family's models cannot run on token subsets (None when they can: it has :meth:`embed`)."""
        return f"{self.name} models cannot run on token subsets" if type(self).embed is Family.embed else None

    def embed(self, images: Tensor) -> tuple[Tensor, TokenContext]:
        """Tokens fed to the first block [B, N, C] (prefix first, positions added) and their context."""
        raise UnsupportedModelError(self.token_subsets_reason())

    def encode(self, tokens: Tensor, context: TokenContext) -> Tensor:
        """Run the blocks, the final norm and the head on tokens [B, N', C] -> outputs."""
        raise UnsupportedModelError(self.token_subsets_reason())

    # -- reading any block's output (LeGrad) -----------------------------------------------------
    def head(self, tokens: Any, *, final_norm: bool = True) -> Tensor:
        """The outputs the model computes from its last block's output ``tokens`` (as a block returns them):
        the final norm (unless ``final_norm`` is False), the pooling or attention-pooling head, the
        classifier. Given an earlier block's output, what the model would output if it ended there."""
        raise UnsupportedModelError(f"the head of {self.name} models is not described, so no block's output can "
                                    "be read through it")

    def observe_pooling(self, patch: Any, hand_over: Callable[[Tensor], None]) -> None:
        """For a head that pools by a per-channel maximum (``readout`` ``"avgmax"`` or ``"max"``): make the model,
        within ``patch`` (a :class:`~vitexplain.instrumentation.patching.ModelPatch`), hand each pooling's
        :func:`max_selection` of the tokens it pools to ``hand_over``. Other readouts need nothing."""

    # -- for LRP ---------------------------------------------------------------------------------
    def embedding(self) -> EmbeddingParts:
        """Where the patch and position embeddings are."""
        raise UnsupportedModelError(f"LRP rules are not placed on {self.name} models")

    def missing_dropouts(self) -> tuple[nn.Module, ...]:
        """Modules (MLP activations, a branch's last projection) after which timm's ViT has a dropout that this
        family lacks (absLRP puts its dropout rule there too, so that a network's relevance does not depend on the
        library holding it)."""
        return ()

    def head_without_dropout(self) -> tuple[nn.Module, ...]:
        """Classifier heads that timm's ViT precedes with a dropout that this family lacks (likewise)."""
        return ()

    def lrp_forward(self) -> tuple[Callable[[Any], Tensor], tuple[nn.Linear, ...]] | None:
        """For a model whose forward multiplies by a bare parameter where the rules need a Linear (open_clip's
        image-text projection ``@ proj``): the forward LRP runs in place of :meth:`forward`, computing that product
        through :class:`LinearView`\\ s, and those views (LRP places its Linear rules on them). None: the model's
        own forward, every Linear map a module of the model or of the attention's description."""
        return None

    def lrp_allowed(self) -> tuple[type, ...]:
        """The module classes whose computation the written-out blocks and the rules cover (the model classes, the
        blocks' and attentions' and :attr:`lrp_modules`); LRP refuses a model holding any other (beyond plain layers),
        naming it."""
        if self.lrp_modules is None:
            raise UnsupportedModelError(f"LRP rules are not placed on {self.name} models")
        described = [type(module) for parts in self.blocks for module in (parts.module, parts.attention.module)]
        return tuple(dict.fromkeys((*loaded_classes(self.model_classes), *loaded_classes(self.lrp_modules),
                                    *described)))


class ClassTokenFirst:
    """Mixin of a :class:`Family` whose sequences are one class token, then the patch tokens."""

    num_prefix_tokens = 1
    class_token_index = 0


class PatchTokensOnly:
    """Mixin of a :class:`Family` whose sequences hold no token before the patch tokens (no class token)."""

    num_prefix_tokens = 0
    class_token_index = None


def require_tiling(size: Sequence[int], patch: Sequence[int], pads: bool) -> None:
    """Raise unless ``patch``-sized patches tile an image of ``size`` (h, w), or the model ``pads`` it to a multiple."""
    if not pads and any(side % step for side, step in zip(size, patch)):
        raise ValueError(
            f"this model cuts images into {patch[0]}x{patch[1]} patches, which do not tile a "
            f"{size[0]}x{size[1]} image; resize or crop it to a multiple "
            "(or build the model with dynamic_img_pad=True)")


def fixed_size_grid(images: Tensor, size: Sequence[int], patch: Sequence[int]) -> tuple[int, int]:
    """The patch grid of ``images`` of the one ``size`` (h, w) the model takes, cut into ``patch``-sized patches;
    raises on any other size."""
    given = tuple(images.shape[-2:])
    if given != tuple(size):
        raise ValueError(f"this model takes {size[0]}x{size[1]} images, got {given[0]}x{given[1]}; resize them")
    return size[0] // patch[0], size[1] // patch[1]


def max_selection(tokens: Tensor) -> Tensor:
    """What a per-channel maximum over ``tokens`` [B, N, C] takes from each token, averaged over the channels -> [B, N]:
    the mean over channels c of ∂ max_i x_ic / ∂ x_jc (1 at the channel's maximum, shared equally among ties, as
    autograd's ``amax`` backward shares it); each row sums to one."""
    tokens = tokens.detach()
    at_peak = (tokens == tokens.amax(1, keepdim=True)).to(torch.float32)
    return (at_peak / at_peak.sum(1, keepdim=True)).mean(-1)


def loaded_class(module: str, name: str) -> type | None:
    """Class ``name`` of ``module``, or None when its package is not imported (a model of the class has imported it,
    so no other model makes vitexplain import the package)."""
    if module.split(".")[0] not in sys.modules:
        return None
    return getattr(importlib.import_module(module), name)


def loaded_classes(classes: Sequence[str | type]) -> tuple[type, ...]:
    """The ``classes`` given as classes or as "package.module.Class", those of packages not imported left out
    (:func:`loaded_class`)."""
    found = (given if isinstance(given, type) else loaded_class(*given.rsplit(".", 1)) for given in classes)
    return tuple(cls for cls in found if cls is not None)


def check_images(images: Any, grid_size: Callable[[Tensor], Any], channels: int | None = None) -> Tensor:
    """A float image batch [B, C, H, W] of the channels (when known) and size the model takes; a clear error
    otherwise."""
    if not isinstance(images, Tensor):
        hint = " (torch.from_numpy converts an array)" if type(images).__module__ == "numpy" else ""
        raise TypeError(f"images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}{hint}")
    if images.is_meta:
        raise ValueError("images are on the meta device, which holds shapes but no values: give them on a real "
                         "device (cpu, cuda ...)")
    if images.ndim != 4:
        raise ValueError(f"images must have shape [B, C, H, W], got shape {tuple(images.shape)}")
    if not images.dtype.is_floating_point:
        raise TypeError(f"images must be a preprocessed float tensor, got dtype {images.dtype}")
    if images.shape[0] == 0:
        raise ValueError("images is an empty batch")
    if channels is not None and images.shape[1] != channels:
        raise ValueError(wrong_channels(channels, images.shape))
    finite = torch.isfinite(images).flatten(1).all(1)
    if not finite.all():
        bad = ", ".join(str(i) for i in (~finite).nonzero()[:, 0].tolist())
        raise ValueError(f"NaN or infinite values in the batch's image(s) {bad} (counted from 0)")
    if images.dtype == torch.float64 and bool((images.abs() > torch.finfo(torch.float32).max).any()):
        raise ValueError("images hold values beyond float32's range (|value| > 3.4e38), in which the model sees "
                         "them: preprocess them (normalised pixel values)")
    grid_size(images)
    return images


def wrong_channels(channels: int, shape: Sequence[int], known_from: str = "") -> str:
    """The message for images [B, C, H, W] of ``shape`` given to a model that takes ``channels`` channels."""
    return (f"this model takes {channels}-channel images{known_from}, got {shape[1]} channel(s) in shape "
            f"{tuple(shape)}; convert them (e.g. grey to RGB, or drop an alpha channel)")


#: words of a timm architecture name or pretrained tag that mark an image-text tower: CLIP (and MetaCLIP,
#: DFN, EVA-CLIP …), SigLIP, Perception Encoder core
IMAGE_TEXT_TOWERS = ("clip", "siglip", "pe_core")


def projection_head(model: nn.Module) -> str | None:
    """Why ``model``'s head projects to an image-text embedding instead of scoring classes, or None.

    timm keeps a CLIP-style tower's projection as its ``head`` (``num_classes`` = the embedding width). The
    head is taken for one when the model still has the output width of the weights its pretrained config
    names, that config is of an image-text tower (its architecture or tag names one of
    :data:`IMAGE_TEXT_TOWERS`), and that width is no label set timm knows (ImageNet-1k, -12k, -21k …):
    towers fine-tuned on classes, and heads a user built for their own classes, stay classifiers.
    """
    config = getattr(model, "pretrained_cfg", None)
    if not isinstance(config, Mapping) or not config.get("num_classes"):
        return None
    width = config["num_classes"]
    name = f"{config.get('architecture') or ''}.{config.get('tag') or ''}"
    if getattr(model, "num_classes", None) != width or not any(word in name.lower() for word in IMAGE_TEXT_TOWERS):
        return None
    from timm.data import infer_imagenet_subset

    if infer_imagenet_subset(config) is not None:
        return None
    return f"its head projects to the {width}-d image-text embedding of {name} (a CLIP-style tower), not to classes"


class LinearView(nn.Linear):
    """A Linear map the model computes from bare parameters (a packed projection's rows, a projection matrix
    multiplied in its forward) as a Linear module of the description: ``weight`` and ``bias`` are read from the
    model's parameters at each call (so gradients and precision changes reach them), and LRP's Linear rules act
    on it as on any Linear. It holds no parameters; the model owns them."""

    def __init__(self, weight: Callable[[], Tensor], bias: Callable[[], Tensor | None], in_features: int,
                 out_features: int):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self._read = (weight, bias)

    @property
    def weight(self) -> Tensor:
        return self._read[0]()

    @property
    def bias(self) -> Tensor | None:
        return self._read[1]()


__all__ = ["AttentionInput", "Cascade", "ClassTokenFirst", "EmbeddingParts", "Family", "LinearView", "PatchTokensOnly",
           "ProbeParts", "TokenContext", "UnsupportedModelError", "at", "check_images", "fixed_size_grid",
           "loaded_class", "loaded_classes", "max_selection", "projection_head", "require_tiling", "wrong_channels"]


#: the families a model is described by, registered by their modules (see :func:`served_families`)
FAMILY_REGISTRY: Registry[type[Family]] = Registry("model family", "vitexplain.instrumentation.families")


def register_family(family: type[Family]) -> type[Family]:
    """Class decorator: ``family`` describes models (a family only recognises models of its own kind)."""
    FAMILY_REGISTRY.add(family.name, family)
    return family


def served_families() -> list[type[Family]]:
    """Every registered family, in listing order."""
    return sorted((FAMILY_REGISTRY.get(name) for name in FAMILY_REGISTRY.names()),
                  key=lambda family: (family.listing_order, family.name))


def catalogue() -> dict[str, Example]:
    """Every registered family's examples by label, families in listing order."""
    return {example.label: example for family in served_families() for example in family.example_models}
