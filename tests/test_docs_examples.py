"""Every code block of the documentation runs: each fenced ``python`` and ``bash`` block of README.md and of every
page of the site (``docs/**/*.md``, which ``mkdocs build --strict`` builds in scripts/test.sh; the design notes of
``docs/decisions/`` aside, see :data:`PAGES`), so no page can drift from the code.

How the blocks run
    Each page gets a folder of its own holding the files of :data:`FIXTURES`.

    * A block whose title is a file name (```` ```python title="my_method.py" ````, ```` ```yaml title="my.yaml" ````)
      *is* that file: it is written into the folder before anything runs, and is not run itself; another block of
      the page must use it.
    * ``python`` blocks run first, in order, in one namespace per page, in this process (the page's folder as the
      working directory; compiled with the page's path and line numbers, so a traceback points into the page).
    * ``bash`` blocks run next, in order, in the same folder, each in a ``bash -e -o pipefail`` subprocess whose
      ``python``, ``vitexplain`` and ``torchrun`` are this environment's. The pages' bash blocks run two pages at a
      time in the background while the next pages' Python runs.
    * Other fences (``console``, ``text``, ``yaml``, ``toml``) are not run: what they show is not runnable by nature
      (``pip install``, a fragment of a config) or is a file another block runs.

What differs from a user's machine
    Nothing is downloaded and no test needs a GPU. :data:`SUBSTITUTIONS` lists every change made to a block's text
    before it runs (each must still match some block, so the table cannot rot); :data:`FIXTURES` the files each
    page's folder holds; :data:`HUB` the repositories the stand-in Hugging Face Hub (tests/hub_server.py) serves
    under the real Hub ids the pages name, so ``load_model("google/vit-base-patch16-224")`` runs as written and
    downloads a tiny model of the same class into an empty cache.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import timm
import torch
from PIL import Image

from cli import python_env
from conftest import make_vit
from hub_server import HubServer

REPO = Path(__file__).resolve().parents[1]
#: the pages whose blocks run: the README and every page of the site but the design notes (docs/decisions/), which
#: record for maintainers what was decided and quote code as fragments (signatures, excerpts), not as examples
PAGES = ["README.md", *sorted(str(path.relative_to(REPO)) for path in (REPO / "docs").rglob("*.md")
                              if "decisions" not in path.relative_to(REPO / "docs").parts)]

#: (pattern, replacement, why): every change made to a block's text before it runs, applied to every block in order
SUBSTITUTIONS = [
    (r"bash scripts/(main|test)\.sh", r'test -f "$VITEXPLAIN_REPO/scripts/\1.sh"',
     "the set-up commands install the package and run the whole default benchmark or the whole test suite (this "
     "test among them): they are asserted to exist instead"),
    (r"vit_base_patch16_224(?:\.augreg2_in21k_ft_in1k)?\b", "test_vit",
     "ViT-B/16's weights are 340 MB: timm's own 0.37 M-parameter test ViT (the same VisionTransformer class) takes "
     "its place, its pretrained weights downloaded from the stand-in Hub (timm/test_vit.r160_in1k)"),
    (r"(--imagenet-seg data/imagenet-seg --limit 100)", r"\1 --model deit_base=my_deit.pth",
     "the recipe's DeiT-B is replaced by a tiny DeiT checkpoint, with the flag the page itself teaches"),
    (r"(vitexplain bench --config latec --limit 2 -o latec-bench)",
     r"\1 --method-option integrated_gradients.n_steps=2 --method-option expected_gradients.n_samples=2 "
     r"--method-option deeplift_shap.n_samples=2 --metric-option faithfulness_correlation.n_samples=2 "
     r"--metric-option faithfulness_estimate.patch_size=56 --metric-option monotonicity_correlation.n_samples=1 "
     r"--metric-option pixel_flipping.n_steps=2 --metric-option irof.n_segments=4 --metric-option road.fractions=[0.5] "
     r"--metric-option infidelity.n_samples=2 --metric-option naopc.patch_size=112 "
     r"--metric-option selectivity.patch_size=56 --metric-option non_sensitivity.patch_size=56 "
     r"--metric-option local_lipschitz_estimate.n_samples=1 "
     r"--metric-option max_sensitivity.n_samples=1 --metric-option avg_sensitivity.n_samples=1 "
     r"--metric-option continuity.n_steps=1 --metric-option relative_input_stability.n_samples=1 "
     r"--metric-option relative_output_stability.n_samples=1 "
     r"--metric-option relative_representation_stability.n_samples=1 --method-option occlusion.window=112 "
     r"--method-option occlusion.stride=112 --metric-option insertion_deletion.n_steps=2 "
     r"--metric-option region_perturbation.n_regions=2 --metric-option naopc.beam_size=1 && "
     r"""python -c "import json; r = json.load(open('latec-bench/results.json')); assert not r['errors'], """
     r"""r['errors']; assert all(set(m) == set(r['settings']['metrics']) """
     r"""for m in r['scores']['digits_vit'].values())" """,
     "the shipped LATEC config with its sample counts, steps and beams at their least and its patches and occlusion "
     "windows large, so that all of its methods and protocols run on 2 images in the suite's budget; then no pair of "
     "them may have failed, and every method has every protocol's score"),
    (r'"cuda"', '"cpu"', "no GPU here: the GPU page runs on the CPU"),
    (r"--device cuda\b", "--device cpu", "no GPU here"),
    (r"--nproc_per_node=4\b", "--nproc_per_node=2", "two CPU processes (gloo) stand in for four GPUs"),
    (r"from \._products import", "from vitexplain.methods._products import",
     "docs/architecture.md shows a module inside vitexplain/methods/ (relative imports)"),
    (r"from \.\.(\w+) import", r"from vitexplain.\1 import", "likewise"),
]

#: the files every page's folder holds (made once by the ``fixtures`` fixture), and what they are
FIXTURES = {
    "cat.jpg, dog.jpg": "two 224 x 224 photographs: digits canvases enlarged (any picture would do)",
    "my_images/*.jpg, my_masks/*.png": "four digits canvases and their masks: a user's folder dataset",
    "data/imagenet-seg/gtsegs_ijcv.mat": "three images in ImageNet-Segmentation's MATLAB layout",
    "my_vit.safetensors": "weights of timm's test_vit (what `--arch vit_base_patch16_224` becomes)",
    "my_deit.pth, my_deit.json": "a tiny DeiT (1,000 classes) with its model card, as a user's checkpoint",
}

#: the repositories the stand-in Hub serves: Hub id -> what stands in for it
HUB = {
    "timm/test_vit.r160_in1k": "timm's test_vit, random weights (the substitute for the ViT-B/16s)",
    "google/vit-base-patch16-224": "a transformers ViTForImageClassification of 2 blocks at 32 px, 3 labels",
    "openai/clip-vit-base-patch32": "a transformers CLIPModel of 2 blocks per tower at 32 px, with its tokenizer",
}

BASH_TIMEOUT = 300


@dataclass
class Block:
    page: str
    line: int          # the page's line of the block's first line of code
    language: str
    title: str | None
    code: str


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` (its indentation removed), with its language and title."""
    lines = (REPO / page).read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = re.match(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$", lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, info = len(opening["indent"]), opening["fence"], opening["info"].strip()
        end = index + 1
        while end < len(lines) and not re.match(rf"^ {{0,{indent}}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        title = re.search(r'title="([^"]+)"', info)
        code = "\n".join(line[indent:] for line in lines[index + 1:end]) + "\n"
        found.append(Block(page, index + 2, info.split()[0] if info else "", title and title[1], code))
        index = end + 1
    return found


def substituted(code: str) -> str:
    """``code`` as it runs here: every substitution of :data:`SUBSTITUTIONS` applied, in order."""
    for pattern, replacement, _ in SUBSTITUTIONS:
        code = re.sub(pattern, replacement, code)
    return code


def runnable(page: str) -> list[Block]:
    return [block for block in blocks(page) if block.language in ("python", "bash") or block.title]


RUNNABLE = [page for page in PAGES if any(block.language in ("python", "bash") for block in runnable(page))]


# ------------------------------------------------------------------------------------------------ fixtures

def _canvases(count: int):
    """Digits test canvases as uint8 pictures [H, W, 3] and their masks."""
    from vitexplain.datasets import get_dataset

    data = get_dataset("digits", n=count)
    samples = [data[i] for i in range(count)]
    pictures = [(sample["image"].clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
                for sample in samples]
    return pictures, [sample["mask"].numpy() for sample in samples]


def _write_fixtures(folder: Path) -> None:
    from test_datasets_files import seg_fixture, write_gtsegs

    pictures, masks = _canvases(6)
    for name, picture in zip(("cat.jpg", "dog.jpg"), pictures):
        Image.fromarray(picture).resize((224, 224), Image.BILINEAR).save(folder / name, quality=95)
    (folder / "my_images").mkdir()
    (folder / "my_masks").mkdir()
    for i, (picture, mask) in enumerate(zip(pictures[2:], masks[2:])):
        Image.fromarray(picture).save(folder / "my_images" / f"image{i}.jpg", quality=95)
        Image.fromarray(mask.astype(np.uint8) * 255).save(folder / "my_masks" / f"image{i}.png")
    (folder / "data" / "imagenet-seg").mkdir(parents=True)
    write_gtsegs(folder / "data" / "imagenet-seg" / "gtsegs_ijcv.mat", *seg_fixture(3))
    torch.manual_seed(0)
    safetensors.torch.save_file(timm.create_model("test_vit").state_dict(), str(folder / "my_vit.safetensors"))
    torch.save(make_vit(depth=2, num_classes=1000).state_dict(), folder / "my_deit.pth")
    kwargs = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=1000)
    (folder / "my_deit.json").write_text(json.dumps({"arch": "deit_base_patch16_224", "model_kwargs": kwargs}))


def _hub_repositories(root: Path) -> dict[str, Path]:
    """The folders the stand-in Hub serves (:data:`HUB`), built from tiny random models."""
    import transformers

    from test_two_tower import two_tower

    torch.manual_seed(0)
    timm.models.save_for_hf(timm.create_model("test_vit"), root / "timm", safe_serialization=True)
    labels = ["cat", "dog", "bird"]
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, intermediate_size=96, num_labels=len(labels),
                                    id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    transformers.ViTForImageClassification(config).save_pretrained(root / "vit")
    (root / "vit" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 32, "width": 32},
         "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    clip, tokenizer = two_tower("clip")
    clip.save_pretrained(root / "clip")
    tokenizer.save_pretrained(root / "clip")
    (root / "clip" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32}, "do_center_crop": True,
         "crop_size": {"height": 32, "width": 32}, "resample": 3,
         "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}))
    return dict(zip(HUB, (root / "timm", root / "vit", root / "clip")))


@dataclass
class Site:
    fixtures: Path
    pages: Path
    hub: HubServer
    hf_home: Path
    executor: ThreadPoolExecutor
    shells: dict[str, Future]             # page -> its bash blocks' run (a list of failures)
    python: dict[str, BaseException | None]  # page -> what its Python blocks raised

    def folder(self, page: str) -> Path:
        """The page's own folder: the fixtures (copied), then its file blocks."""
        folder = self.pages / re.sub(r"[^\w.-]", "_", page)
        if not folder.exists():
            shutil.copytree(self.fixtures, folder)
            for block in runnable(page):
                if block.title:
                    (folder / block.title).write_text(substituted(block.code))
        return folder

    def environment(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {**python_env(), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                "VITEXPLAIN_REPO": str(REPO), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",  # two run at once
                "HF_ENDPOINT": self.hub.url,
                "HF_HOME": str(self.hf_home), "HF_HUB_CACHE": str(self.hf_home / "hub"),
                "TORCH_HOME": str(self.hf_home / "torch"), "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_TOKEN_PATH": str(self.hf_home / "token"),
                "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-examples")
    fixtures = root / "fixtures"
    fixtures.mkdir()
    _write_fixtures(fixtures)
    repositories = _hub_repositories(root / "served")
    (root / "pages").mkdir()
    with HubServer() as hub, ThreadPoolExecutor(max_workers=2) as executor:
        for repo, folder in repositories.items():
            hub.add(repo, folder)
        yield Site(fixtures, root / "pages", hub, root / "hf", executor, {}, {})


def _run_shell(site: Site, page: str, folder: Path, codes: list[tuple[Block, str]]) -> list[str]:
    """Run the page's bash blocks in order; the failures, each with its block's line and output."""
    failures = []
    for block, code in codes:
        script = folder / f"block-{block.line}.sh"
        script.write_text(code)
        try:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", str(script)], cwd=folder, env=site.environment(),
                                  capture_output=True, text=True, timeout=BASH_TIMEOUT)
        except subprocess.TimeoutExpired:
            failures.append(f"{page}:{block.line}: bash block ran longer than {BASH_TIMEOUT} s:\n{code}")
            break
        if done.returncode != 0:
            failures.append(f"{page}:{block.line}: bash block exited {done.returncode}:\n{code}\n"
                            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}")
            break
    return failures


def _registries():
    from vitexplain.datasets.base import DATASETS
    from vitexplain.instrumentation.families.base import FAMILY_REGISTRY
    from vitexplain.metrics.base import METRICS
    from vitexplain.registry import METHODS
    from vitexplain.reproduce.recipe import RECIPES

    return (METHODS, METRICS, DATASETS, FAMILY_REGISTRY, RECIPES)


@pytest.fixture
def in_hub(site, monkeypatch):
    """This process pointed at the stand-in Hub and the module's cache, as the subprocesses are."""
    from test_hub_models import _point_at

    _point_at(monkeypatch, site.hub.url, site.hf_home)


# --------------------------------------------------------------------------------------------------- tests

def _run_page(page: str, site: Site, monkeypatch) -> None:
    """Run the page's Python blocks, in order, in one namespace; then start its bash blocks in the background
    (whatever became of the Python), leaving the registries and torch's global settings as they were. Once per
    page: a second call raises what the first raised."""
    if page in site.python:
        if site.python[page] is not None:
            raise site.python[page]
        return
    folder = site.folder(page)
    monkeypatch.chdir(folder)
    registries = _registries()
    before = [set(registry.names()) for registry in registries]
    precision, rng, threads = torch.get_float32_matmul_precision(), torch.get_rng_state(), torch.get_num_threads()
    torch.set_num_threads(1)      # the bash blocks of other pages run on the other cores meanwhile
    scope: dict = {"__name__": "__docs__"}
    try:
        for block in runnable(page):
            if block.language == "python" and not block.title:
                code = "\n" * (block.line - 1) + substituted(block.code)
                exec(compile(code, str(REPO / page), "exec"), scope)
        site.python[page] = None
    except BaseException as error:
        site.python[page] = error
        raise
    finally:
        for registry, names in zip(registries, before):
            for name in set(registry.names()) - names:
                registry.remove(name)
        torch.set_float32_matmul_precision(precision)
        torch.set_rng_state(rng)
        torch.set_num_threads(threads)
        shell = [(block, substituted(block.code)) for block in runnable(page)
                 if block.language == "bash" and not block.title]
        site.shells[page] = site.executor.submit(_run_shell, site, page, folder, shell)


@pytest.mark.parametrize("page", RUNNABLE)
def test_python_blocks(page, site, in_hub, monkeypatch):
    _run_page(page, site, monkeypatch)


@pytest.mark.parametrize("page", RUNNABLE)
def test_bash_blocks(page, site, in_hub, monkeypatch):
    """The page's bash blocks, started by its Python test (run here when that test was deselected)."""
    if page not in site.shells:     # its Python test was deselected, or runs later (random order)
        try:
            _run_page(page, site, monkeypatch)
        except Exception:  # noqa: BLE001 - the Python test reports it; the bash blocks run all the same
            pass
    failures = site.shells[page].result(timeout=BASH_TIMEOUT * 4)
    assert not failures, "\n\n".join(failures)


def test_the_tables_of_this_test_are_all_used():
    """Every substitution still matches a block (it is not a dead entry), every file block is used by another block
    of its page, and the set-up commands the substitution skips exist."""
    every = [block for page in PAGES for block in runnable(page)]
    used = {number for number, (pattern, _, _) in enumerate(SUBSTITUTIONS)
            if any(re.search(pattern, block.code) for block in every)}
    assert used == set(range(len(SUBSTITUTIONS))), [SUBSTITUTIONS[n][0] for n in set(range(len(SUBSTITUTIONS))) - used]
    for page in PAGES:
        page_blocks = blocks(page)
        for block in page_blocks:
            if block.title:
                assert any(block.title in other.code for other in page_blocks if other is not block), \
                    f"{page}:{block.line}: no block of the page uses the file {block.title}"
    for script in ("main.sh", "test.sh"):
        assert (REPO / "scripts" / script).is_file()


def test_the_pages_have_blocks_to_run():
    """The collector finds the blocks (a changed fence syntax would silently run nothing)."""
    assert {"README.md", "docs/getting-started.md", "docs/guides/explain.md", "docs/guides/benchmark.md",
            "docs/guides/extending.md"} <= set(RUNNABLE)
    readme = runnable("README.md")
    assert [block.language for block in readme].count("python") >= 3
    assert any('load_model("digits_vit")' in block.code for block in readme)
    assert [block.language for block in blocks("docs/architecture.md") if block.language] == ["python", "toml"]


def test_blocks_are_parsed_with_their_lines_titles_and_indentation(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent('''\
        # Title

        ```python title="my_file.py"
        x = 1
        ```

        * a list item:

          ```bash
          echo indented
          ```
        ````text
        ```python
        not a block
        ```
        ````
        '''))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = blocks("page.md")
    assert [(b.line, b.language, b.title, b.code) for b in found] == [
        (4, "python", "my_file.py", "x = 1\n"), (10, "bash", None, "echo indented\n"),
        (13, "text", None, "```python\nnot a block\n```\n")]


def test_the_readme_links_point_at_files():
    """The README is read on GitHub and PyPI, outside the site (whose links mkdocs checks): its links must hold."""
    links = re.findall(r"\]\(([^)\s#]+)[^)]*\)", (REPO / "README.md").read_text())
    assert "docs/getting-started.md" in links
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert not missing, missing
