"""The command line starts fast and leaves the user's process alone; ``vitexplain methods`` says what each method is."""
import re

import pytest

from vitexplain.registry import METHODS

from cli import run_python_many

#: modules that take seconds to import (torch, timm) or that only some commands need
HEAVY = ("torch", "timm", "torchvision", "transformers", "matplotlib", "numpy", "PIL", "yaml")

QUICK = {
    "help": ["-m", "vitexplain.cli.main", "--help"],
    "version": ["-m", "vitexplain.cli.main", "--version"],
    "explain_help": ["-m", "vitexplain.cli.main", "explain", "--help"],
    "import": ["-c", "import vitexplain; print(vitexplain.__version__, sorted(vitexplain.__all__))"],
}

#: draws with vitexplain.viz after choosing a backend, as a notebook user does, then reports matplotlib's state
DRAW = """
import sys
import matplotlib
matplotlib.use("svg")
params = matplotlib.rcParams.copy()
import numpy, torch
from vitexplain.viz import save_grid, save_overlay
image = numpy.zeros((8, 8, 3), dtype=numpy.uint8)
save_overlay(sys.argv[1] + "/a.png", image, torch.rand(2, 2))
save_grid(sys.argv[1] + "/b.png", image, {"x": torch.rand(2, 2), "y": -torch.rand(2, 2)})
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, matplotlib.rcParams.copy() == params)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("startup")
    commands = {name: ["-X", "importtime", *args] for name, args in QUICK.items()}
    commands["draw"] = ["-c", DRAW, str(folder)]
    commands["methods"] = ["-m", "vitexplain.cli.main", "methods"]
    commands["bad_limit"] = ["-X", "importtime", "-m", "vitexplain.cli.main", "bench", "--limit", "0"]
    (folder / "taken").write_text("a file where the output folder should go")
    commands["bad_output"] = ["-X", "importtime", "-m", "vitexplain.cli.main", "bench", "-o", str(folder / "taken")]
    commands["metrics"] = ["-X", "importtime", "-m", "vitexplain.cli.main", "methods", "--metrics"]
    return dict(zip(commands, run_python_many(*commands.values())))


def _imported(result) -> set[str]:
    """The modules a run under ``-X importtime`` imported."""
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", result.stderr, flags=re.M))


@pytest.mark.parametrize("run", sorted(QUICK))
def test_help_version_and_import_load_nothing_heavy(runs, run):
    result = runs[run]
    assert result.returncode == 0, result.stderr
    imported = _imported(result)
    assert "vitexplain" in imported  # -X importtime reported
    assert not {name for name in imported if name.split(".")[0] in HEAVY}
    if run == "help":
        for command in ("bench", "explain", "explain-text", "methods", "reproduce", "train"):
            assert re.search(rf"^\s+{command}\s", result.stdout, flags=re.M)
    if run == "version":
        assert re.fullmatch(r"vitexplain \d+\.\d+\.\d+\n", result.stdout)
    if run == "explain_help":
        assert "-O KEY=VALUE" in result.stdout and "output names:" in result.stdout and "--no-progress" in result.stdout
    if run == "import":
        assert "'explain'" in result.stdout and "'adapter_for'" in result.stdout


def test_a_bad_flag_is_refused_before_torch_and_listing_protocols_loads_no_model_library(runs):
    for run, message in (("bad_limit", "argument --limit: expected an integer >= 1, got 0"),
                         ("bad_output", "taken is a file, not a folder")):
        refused = runs[run]
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert not {name for name in _imported(refused) if name.split(".")[0] in HEAVY}
    listed = runs["metrics"]
    assert listed.returncode == 0 and "insertion_deletion" in listed.stdout, listed.stderr
    imported = {name.split(".")[0] for name in _imported(listed)}
    assert "torch" in imported and not imported & {"timm", "torchvision", "captum", "transformers", "matplotlib"}
    assert "scipy.stats" not in _imported(listed)


def test_drawing_leaves_the_matplotlib_backend_and_settings_alone(runs):
    result = runs["draw"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "False", "True"]


def test_methods_are_listed_with_what_they_explain_and_whether_they_are_controls(runs):
    result = runs["methods"]
    assert result.returncode == 0, result.stderr
    tags = dict(re.findall(r"^(\w+)\s+\[([^\]]+)\]", result.stdout, flags=re.M))
    assert set(tags) == {name for name in METHODS.names()  # not the methods other tests register in this process
                         if METHODS.get(name).fn.__module__.startswith("vitexplain.methods.")}
    for name, tag in tags.items():
        spec = METHODS.get(name)
        expected = [spec.resolution, "+".join(spec.modalities)] + (["control"] if spec.control else [])
        assert tag.split(", ") == expected
    assert tags["gae"] == "token, image+text" and tags["random_baseline"] == "token, image, control"
    assert tags["rise"] == "pixel, image"
