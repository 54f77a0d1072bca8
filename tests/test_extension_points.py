"""A metric, a dataset and a model family added from a module of their own reach `explain`, the bench and
`vitexplain methods` with no project file edited (a method does too: tests/test_plugin_method.py), and a
bench config that says `all` takes every registered method and metric, new ones included. A family written from
scratch (no subclass of a family vitexplain has) is enrolled by its declared example in the family-wide tests — the
method contract, the precision check, the support matrix — with no list edited."""
from __future__ import annotations

import pytest
import torch

from vitexplain import explain, support
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.datasets.base import DATASETS
from vitexplain.instrumentation import family_of, served_families
from vitexplain.instrumentation.families.base import FAMILY_REGISTRY
from vitexplain.metrics.base import METRICS
from vitexplain.registry import METHODS, available_methods

from cli import run_python_many
from conftest import module_from_source
from test_method_contract import contract_inputs, keeps_the_contract
from test_precision import keeps_its_precision
from zoo import enrolled

EXTENSION = '''
"""Throwaway extensions: a metric, a dataset, a model family and a method, each registered where it is defined."""
import timm
import torch
from torch import nn
from torch.utils.data import Dataset

from vitexplain import register_method
from vitexplain.datasets import register_dataset
from vitexplain.instrumentation.attention import AttentionParts
from vitexplain.instrumentation.families import register_family
from vitexplain.instrumentation.families.base import ClassTokenFirst, EmbeddingParts, Family, TokenContext
from vitexplain.instrumentation.families.examples import Example
from vitexplain.instrumentation.families.stack import Parts, Stack
from vitexplain.instrumentation.families.timm_vit import TimmViT
from vitexplain.metrics import register_metric


@register_metric(reduce=lambda values: {"share": values["share"].mean().item()}, requires=("masks",),
                 higher_is_better={"share": True})
def throwaway_share(batch):
    """Per image, the share of the map's positive mass inside the mask (a toy protocol)."""
    masks = batch.truth["masks"]
    maps = torch.nn.functional.interpolate(batch.maps[:, None].float(), size=masks.shape[-2:])[:, 0].clamp(min=0)
    return {"share": (maps * masks).flatten(1).sum(1) / maps.flatten(1).sum(1).clamp(min=1e-12)}


@register_dataset("throwaway_squares")
class Squares(Dataset):
    """Bright squares on noise, the square as the mask and its corner as the label."""

    splits = ("test",)

    def __init__(self, split: str = "test", n: int = 4, preprocess=None):  # made at the model's size
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        image = 0.1 * torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(index))
        mask = torch.zeros(32, 32, dtype=torch.bool)
        row, col = divmod(index % 4, 2)
        mask[16 * row:16 * row + 16, 16 * col:16 * col + 16] = True
        image[:, mask] += 1.0
        return {"image": image, "label": index % 4, "mask": mask, "id": f"square-{index}"}


class ThrowawayViT(timm.models.vision_transformer.VisionTransformer):
    """A model class of its own, described by the family below."""


@register_family
class ThrowawayFamily(TimmViT):
    """ThrowawayViT, read as timm's ViT is."""

    name = "throwaway ViT"
    listing_order = 0

    @classmethod
    def recognises(cls, model):
        return isinstance(model, ThrowawayViT)


class TinyAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(batch, tokens, width))


class TinyBlock(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(width), TinyAttention(width, heads), nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """A Vision Transformer written from scratch: 8 px patches, a class token, learnt positions, pre-norm blocks."""

    def __init__(self, image_size=32, width=24, depth=2, heads=2, classes=4):
        super().__init__()
        self.image_size, self.patches = image_size, nn.Conv2d(3, width, 8, stride=8)
        self.cls_token = nn.Parameter(0.2 * torch.randn(1, 1, width))
        self.positions = nn.Parameter(0.2 * torch.randn(1, 1 + (image_size // 8) ** 2, width))
        self.blocks = nn.ModuleList(TinyBlock(width, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def tokens(self, images):
        patches = self.patches(images).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(len(images), -1, -1), patches], 1) + self.positions

    def forward(self, images):
        x = self.tokens(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


@register_family
class TinyViTFamily(ClassTokenFirst, Family):
    """TinyViT declared: its class, its blocks and their parts, its example; its attention, head, token subsets and
    embedding (for LRP) written out."""

    name = "tiny ViT (written from scratch)"
    model_classes = (TinyViT,)
    stack = Stack("blocks", {"TinyBlock": "pre_norm"}, "a TinyBlock", parts=Parts(activation="mlp.1"))
    refusals = (stack.reason,)
    example_models = (Example("tiny ViT written from scratch", TinyViT),)
    patch_convolution = "model.patches"
    image_size = "model.image_size"
    lrp_modules = ()

    def attention(self, attn):
        head_dim = attn.proj.in_features // attn.heads
        return AttentionParts(module=attn, num_heads=attn.heads, head_dim=head_dim, scale=head_dim ** -0.5,
                              proj=attn.proj, qkv=attn.qkv)

    def head(self, tokens, *, final_norm=True):
        return self.model.head((self.model.norm(tokens) if final_norm else tokens)[:, 0])

    def embed(self, images):
        return self.model.tokens(images), TokenContext()

    def encode(self, tokens, context):
        for block in self.model.blocks:
            tokens = block(tokens)
        return self.head(tokens)

    def embedding(self):
        return EmbeddingParts(self.model.patches, self.model.patches, None, channels_first=True)


@register_method(class_specific=False, cost=1)
def throwaway_first_row(adapter, images, target=None):
    """The readout's row of the first block's head-averaged attention."""
    record = adapter.record(images, target, fields=("attn",), blocks=(0,))
    return record.geometry.readout_row(record.blocks[0].attn.mean(1))
'''


@pytest.fixture(scope="module")
def extension(tmp_path_factory):
    folder = tmp_path_factory.mktemp("extension")
    with module_from_source(folder, "my_extension", EXTENSION) as module:
        try:
            yield module, folder
        finally:
            METRICS.remove("throwaway_share")
            DATASETS.remove("throwaway_squares")
            FAMILY_REGISTRY.remove("throwaway ViT")
            FAMILY_REGISTRY.remove("tiny ViT (written from scratch)")
            METHODS.remove("throwaway_first_row")


def tiny(module):
    torch.manual_seed(0)
    return module.ThrowawayViT(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2, num_classes=4).eval()


def test_the_family_describes_its_models_and_explain_runs_on_them(extension):
    module, _ = extension
    model = tiny(module)
    assert family_of(model).name == "throwaway ViT"
    images = torch.randn(2, 3, 32, 32)
    maps = explain(model, images, "gae")
    assert maps.shape == (2, 4, 4) and torch.isfinite(maps).all()


def test_a_family_written_from_scratch_is_enrolled_by_its_example_in_the_family_wide_tests(extension):
    """Its declared example reaches the method contract's and the precision check's enrolment and the support
    matrix's examples, and keeps the contract for every image method (or is refused in one line)."""
    module, _ = extension
    family = module.TinyViTFamily
    assert not [other for other in served_families() if other is not family and issubclass(family, other)]
    label = "tiny ViT written from scratch"
    assert enrolled()[label] == (family, family.example_models[0]) and label in support.examples()
    model, inputs = support.examples()[label]()
    assert family_of(model).name == family.name
    x, first, second = contract_inputs(model, inputs)
    for method in available_methods("image"):
        keeps_the_contract(method, model, x, first, second)
    keeps_its_precision(model, inputs)


def test_all_in_a_bench_config_takes_new_methods_and_metrics_and_exclude_leaves_them_out(extension):
    common = dict(models={"tiny": torch.nn.Identity()}, dataset={"name": "throwaway_squares"}, progress=False)
    config = BenchConfig(methods=["all"], metrics=["all"], **common)
    assert [entry.name for entry in config.methods] == available_methods("image")
    assert "throwaway_first_row" in [entry.name for entry in config.methods]
    assert "throwaway_share" in [entry.name for entry in config.metrics]
    fewer = BenchConfig(methods=["gae", "all"], metrics=["all"], exclude_methods=["throwaway_first_row"],
                        exclude_metrics=["throwaway_share"], **common)
    assert [entry.name for entry in fewer.methods][0] == "gae"
    assert "throwaway_first_row" not in [entry.name for entry in fewer.methods]
    assert "throwaway_share" not in [entry.name for entry in fewer.metrics]
    with pytest.raises(ValueError, match="exclude_methods names 'no_such_method', which are not registered methods"):
        BenchConfig(methods=["all"], metrics=["all"], exclude_methods=["no_such_method"], **common)


def test_the_bench_runs_the_new_method_metric_dataset_and_family_together(extension, tmp_path):
    module, _ = extension
    config = BenchConfig(models={"tiny": tiny(module)}, methods=["throwaway_first_row", "gae"],
                         metrics=["throwaway_share"], dataset={"name": "throwaway_squares", "options": {"n": 4}},
                         batch_size=4, output_dir=tmp_path, progress=False, device="cpu", gallery=0)
    result = run_benchmark(config)
    assert not result.errors
    shares = {method: result.scores["tiny"][method]["throwaway_share"]["share"]
              for method in ("throwaway_first_row", "gae")}
    assert all(0.0 <= share <= 1.0 for share in shares.values())


def test_vitexplain_methods_lists_the_new_method_and_family(extension):
    _, folder = extension
    (result,) = run_python_many(["-c", "import sys, my_extension; from vitexplain.cli.main import main; "
                                       "sys.exit(main(['methods']))"], cwd=folder)
    assert result.returncode == 0, result.stderr
    assert any(line.startswith("throwaway_first_row") for line in result.stdout.splitlines())
