"""The package as a user installs it: the sdist and the wheel hold what vitexplain needs, and the wheel, installed
into a fresh virtual environment, explains an image and runs a bench from outside the source tree (issue 33.4).

No network: the sdist is built by setuptools' own build backend (what ``python -m build --no-isolation`` calls)
from a copy of the checkout, the wheel by pip from that sdist (so a file the sdist misses is missing from the wheel
too), and the wheel is installed with ``--no-index --no-deps`` into a venv made with ``--system-site-packages``, where
torch, timm and the rest are already there. That venv also sees the editable install of this checkout (its
``.pth`` finder runs after the path finder, so the venv's copy wins); the tests check that every vitexplain module
a command imports comes from the venv, not from here.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
VERSION = next(node.value.value for node in ast.parse((REPO / "vitexplain" / "_version.py").read_text()).body
               if isinstance(node, ast.Assign) and node.targets[0].id == "__version__")

#: what must ship inside the package, in both the wheel and the sdist
PACKAGE_DATA = ["vitexplain/py.typed", "vitexplain/assets/models/digits_vit.json",
                "vitexplain/assets/models/digits_vit.safetensors", "vitexplain/assets/models/digits_deit.json",
                "vitexplain/assets/models/digits_deit.safetensors", "vitexplain/assets/models/README.md",
                "vitexplain/assets/support.md", "vitexplain/bench/default_digits.yaml",
                "vitexplain/bench/latec_digits.yaml",
                "vitexplain/reproduce/published/gradtoken.yaml", "vitexplain/reproduce/published/tis.yaml",
                "vitexplain/reproduce/published/tokentm.yaml", "vitexplain/explorer/explorer.js",
                "vitexplain/explorer/explorer.css", "vitexplain/explorer/template.html"]

#: not copied from the checkout to build from: version control, caches, build and run outputs
SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
                              ".ruff_cache", ".venv", "vitexplain-out", "vitexplain-bench", "bench-out")

SDIST = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"

#: run by the venv's python: where the package, its distribution and its data come from
WHERE = """
import importlib.metadata, json, sys, sysconfig
import vitexplain
from vitexplain.bench import DEFAULT_CONFIG
from vitexplain.cli import main
from vitexplain.models import ASSETS, load_model
from vitexplain.reproduce.published import PUBLISHED_DIR
load_model("digits_vit")
print(json.dumps({
    "version": vitexplain.__version__, "metadata_version": importlib.metadata.version("vitexplain"),
    "purelib": sysconfig.get_paths()["purelib"], "file": vitexplain.__file__,
    "distribution": str(importlib.metadata.distribution("vitexplain")._path),
    "modules": sorted({str(getattr(module, "__file__", None) or "") for name, module in list(sys.modules.items())
                       if name == "vitexplain" or name.startswith("vitexplain.")} - {""}),
    "data": [str(DEFAULT_CONFIG), str(ASSETS), str(PUBLISHED_DIR)],
}))
"""


def _run(args: list, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    # PYTHONPATH could put this checkout before the venv's copy
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    result = subprocess.run([str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (f"{args} exited {result.returncode}:\n{result.stdout[-3000:]}\n"
                                    f"{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist (from a copy of the checkout) and the wheel (from the sdist), in a temporary folder."""
    folder = tmp_path_factory.mktemp("dist")
    source = folder / "source"
    shutil.copytree(REPO, source, ignore=SKIP)
    out = folder / "out"
    out.mkdir()
    sdist = out / _run([sys.executable, "-c", SDIST, out], cwd=source).stdout.strip().splitlines()[-1]
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-w", out, sdist],
         cwd=folder)
    (wheel,) = out.glob("vitexplain-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> dict[str, Path]:
    """A fresh venv seeing the system's packages, with the wheel installed; a working folder outside the checkout."""
    folder = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", folder / "env"], cwd=folder)
    python = folder / "env" / "bin" / "python"
    # the system's pip, run by the venv's python, installs into the venv; --ignore-installed: the editable
    # install outside the venv is neither uninstalled nor taken as the requirement already met
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", built["wheel"]], cwd=folder)
    work = folder / "work"
    work.mkdir()
    return {"python": python, "script": folder / "env" / "bin" / "vitexplain", "work": work}


def test_sdist_holds_the_licence_readme_changelog_and_package_data(built):
    assert built["sdist"].name == f"vitexplain-{VERSION}.tar.gz"
    with tarfile.open(built["sdist"]) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "vitexplain/__init__.py",
            "vitexplain/_version.py", *PACKAGE_DATA} <= names
    assert not {name for name in names if name.startswith("tests/") or "__pycache__" in name}


def test_wheel_holds_the_package_data_licence_and_metadata(built):
    assert built["wheel"].name == f"vitexplain-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"vitexplain-{VERSION}.dist-info/METADATA").decode()
        entry_points = archive.read(f"vitexplain-{VERSION}.dist-info/entry_points.txt").decode()
    assert set(PACKAGE_DATA) <= names
    assert f"vitexplain-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not {name for name in names if name.startswith("tests/") or "__pycache__" in name}
    assert f"\nVersion: {VERSION}\n" in metadata and "\nLicense-Expression: MIT\n" in metadata
    assert "vitexplain = vitexplain.cli.main:main" in entry_points


def test_installed_wheel_is_what_the_venv_imports_with_the_version_file_s_version(venv):
    version = _run([venv["python"], "-c", "import vitexplain; print(vitexplain.__version__)"], cwd=venv["work"])
    assert version.stdout.strip() == VERSION
    cli = _run([venv["script"], "--version"], cwd=venv["work"])
    assert cli.stdout.strip() == f"vitexplain {VERSION}"

    found = json.loads(_run([venv["python"], "-c", WHERE], cwd=venv["work"]).stdout.strip().splitlines()[-1])
    purelib = Path(found["purelib"])
    assert found["version"] == found["metadata_version"] == VERSION
    assert Path(found["file"]) == purelib / "vitexplain" / "__init__.py"
    assert Path(found["distribution"]) == purelib / f"vitexplain-{VERSION}.dist-info"
    assert len(found["modules"]) > 10  # the command line, models, bench and their imports
    outside = [path for path in found["modules"] + found["data"] if not Path(path).is_relative_to(purelib)]
    assert not outside, f"imported from outside the venv {purelib}: {outside}"
    assert (purelib / "vitexplain" / "py.typed").is_file()


def test_installed_wheel_explains_an_image_and_runs_a_bench_outside_the_source_tree(venv):
    work = venv["work"]
    assert not work.resolve().is_relative_to(REPO)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)).save(work / "digit.png")

    _run([venv["script"], "explain", "--model", "digits_vit", "--method", "gae,tokentm", "--html", "--no-progress",
          "--device", "cpu", "-o", "out", "digit.png"], cwd=work)
    for name in ("digit.gae.npy", "digit.tokentm.npy", "digit.all.png", "explorer.html"):
        assert (work / "out" / name).stat().st_size > 0, name
    assert np.load(work / "out" / "digit.gae.npy").shape == (14, 14)

    # the shipped default bench (its YAML read from the venv: every method, every protocol) on 2 images; the
    # robustness protocols, which explain each image again per sample, with one sample, ROAD at one fraction, the
    # removal curves at two steps (SaCo's through `all`) and the sampling methods with few samples (the suite's
    # time: what is checked here is the installed package)
    quick = {"method": ["rise.n_masks=16", "tis.n_masks=16", "smoothgrad.n_samples=2",
                        "integrated_gradients.n_steps=2", "tam.n_steps=2", "bt_token.n_steps=2", "bt_head.n_steps=2"],
             "metric": ["max_sensitivity.n_samples=1", "smooth_mprt.n_samples=1", "road.fractions=[0.5]",
                        "insertion_deletion.n_steps=2", "perturbation.n_steps=2", "srg.n_steps=2", "saco.n_groups=2"]}
    options = [arg for kind, values in quick.items() for value in values for arg in (f"--{kind}-option", value)]
    bench = _run([venv["script"], "bench", "--limit", "2", "--no-progress", "--device", "cpu", *options], cwd=work)
    assert "report.html" in bench.stdout
    assert (work / "vitexplain-bench" / "report.html").stat().st_size > 0
    found = json.loads((work / "vitexplain-bench" / "results.json").read_text())
    assert found["errors"] == []
    protocols = set(found["settings"]["metrics"])
    assert {"segmentation", "perturbation", "aopc", "insertion_deletion", "road", "saco", "srg", "max_sensitivity",
            "class_sensitivity", "smooth_mprt"} <= protocols
    assert list(found["scores"]) == ["digits_vit"]
    for model in found["scores"]:
        rows = found["scores"][model]
        assert len(rows) > 25 and {"tokentm", "gradtoken", "tis", "random_baseline"} <= set(rows)
        assert all(set(per_metric) == protocols for per_metric in rows.values())
        assert set(found["images"][model]["tokentm"].values()) == {2}
