"""Shared fixtures: tiny timm Vision Transformers built in the tests (nothing is downloaded)."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

# one thread per pytest-xdist worker (scripts/test.sh runs two on the 2-core machine: more threads than cores only
# wait for each other); two in a single process
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, mlp_ratio=2.0, num_classes=10)

#: The model families the foundation must serve, as constructor keyword arguments.
FAMILIES = {
    "vit": dict(),
    "deit_distilled": dict(distilled=True),
    "registers": dict(reg_tokens=2, class_token=True),
    "dynamic": dict(dynamic_img_size=True),
    "layerscale_qkvbias": dict(init_values=0.5, qkv_bias=True),
}


def make_vit(seed: int = 0, distilled: bool = False, **overrides) -> torch.nn.Module:
    """A tiny randomly initialised timm ViT in eval mode; ``distilled`` builds DeiT with a distillation token."""
    torch.manual_seed(seed)
    config = {**TINY, **overrides}
    cls = VisionTransformerDistilled if distilled else VisionTransformer
    model = cls(**config)
    # random init leaves the head near zero; scale it so classes really differ
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("head"):
                p.normal_(0, 0.5)
    return model.eval()


@pytest.fixture
def tiny_vit():
    return make_vit()


@pytest.fixture(params=sorted(FAMILIES))
def family_model(request):
    return request.param, make_vit(**FAMILIES[request.param])


@pytest.fixture
def images():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 32, 32, generator=g)


@contextlib.contextmanager
def module_from_source(folder: Path, name: str, source: str):
    """``source`` written to ``folder/name.py`` and imported (a user's own module: a plug-in), then forgotten."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)
