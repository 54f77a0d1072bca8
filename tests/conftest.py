"""Shared fixtures: tiny timm Vision Transformers built in the tests (nothing is downloaded)."""
from __future__ import annotations

import collections
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
# wait for each other), and in the commands a worker starts (the CLI runs, the docs' bash blocks, the installed
# wheel's bench: torch reads OMP_NUM_THREADS when it starts); two in a single process
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: the test files that take longest (a module fixture running many commands, a bench, a wheel built and installed:
#: the durations printed at the end of a run), longest first. scripts/test.sh hands whole files to two workers in
#: collection order (``--dist loadfile --no-loadscope-reorder``); these go first, the others after them by their
#: number of tests, so that no long file starts last and ends the run alone (docs/decisions/performance.md)
LONG_FILES = ("test_docs_examples.py", "test_wheel.py", "test_precision.py", "test_method_contract.py",
              "test_train.py", "test_cli_explain.py", "test_bench_cache.py", "test_default_bench.py",
              "test_bench_processes.py", "test_notebook.py", "test_support.py")

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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The files of :data:`LONG_FILES` first, in its order, then the others by their number of tests, most first (as
    pytest-xdist orders them by default); the tests of a file keep their order."""
    missing = [name for name in LONG_FILES if not (Path(__file__).parent / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: LONG_FILES names test files that do not exist: {missing}")
    count = collections.Counter(item.path.name for item in items)
    first = {name: index for index, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: (first.get(item.path.name, len(first)), -count[item.path.name]))
