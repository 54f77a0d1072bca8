"""Plug-ins from outside the package reach every registry and every command: a file or module named with
``--plugin`` or in a bench config's ``plugins:``, and a pip-installed distribution's ``vitexplain.plugins``
entry point. A plug-in that cannot be loaded is one line naming it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml
from PIL import Image

from vitexplain import plugins
from vitexplain.plugins import PluginError, load_plugin
from vitexplain.registry import METHODS

from cli import run_cli_many, run_python_many

#: registers one entry in each registry: a method, a metric, a dataset (made at the digits models' size) and a family,
#: in the shapes plug-ins were first written in (a name given first, a ready ``Metric``), which stay accepted
PLUGIN = '''
"""A researcher's own method, metric, dataset and model family."""
import torch
from torch.utils.data import Dataset

from vitexplain import register_method
from vitexplain.datasets import register_dataset
from vitexplain.instrumentation.families import register_family
from vitexplain.instrumentation.families.timm_vit import TimmViT
from vitexplain.metrics import Metric, register_metric


@register_method("{prefix}_last_attention", class_specific=False, cost=1)
def last_attention(adapter, images, target=None, *, scale: float = 1.0):
    """The readout's row of the last block's head-averaged attention."""
    record = adapter.record(images, target, fields=("attn",))
    return scale * record.geometry.readout_row(record.blocks[-1].attn.mean(1))


def _mass_in_mask(batch):
    masks = batch.truth["masks"].float()
    maps = torch.nn.functional.interpolate(batch.maps[:, None].clamp(min=0), size=masks.shape[-2:])[:, 0]
    return {{"mass": (maps * masks).flatten(1).sum(1) / maps.flatten(1).sum(1).clamp(min=1e-12)}}


register_metric(Metric("{prefix}_mass_in_mask", _mass_in_mask, lambda v: {{"mass": v["mass"].mean().item()}},
                       requires=("masks",), higher_is_better={{"mass": True}}, group="localisation"))


@register_dataset("{prefix}_squares")
class Squares(Dataset):
    """Bright squares on noise, the square as the mask."""

    splits = ("test",)
    provides = ("masks",)

    def __init__(self, split="test", n=3, preprocess=None):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        image = 0.1 * torch.randn(3, 112, 112, generator=torch.Generator().manual_seed(index))
        mask = torch.zeros(112, 112, dtype=torch.bool)
        mask[16 * index:16 * index + 48, 20:68] = True
        image[:, mask] += 1.0
        return {{"image": image, "label": index % 10, "mask": mask, "id": f"square-{{index}}"}}


class {prefix}ViT(torch.nn.Module):
    """A model class of its own (never built here: its family's registration is what is checked)."""


@register_family
class {prefix}Family(TimmViT):
    """{prefix}ViT, read as timm's ViT is."""

    name = "{prefix} ViT"

    @classmethod
    def recognises(cls, model):
        return isinstance(model, {prefix}ViT)
'''

REGISTRIES = ("from vitexplain.registry import available_methods; from vitexplain.metrics import available_metrics; "
              "from vitexplain.datasets import available_datasets; "
              "from vitexplain.instrumentation.families.base import served_families; "
              "print(sorted(n for n in available_methods() + available_metrics() + available_datasets() "
              "+ [f.name for f in served_families()] if n.startswith('{prefix}')))")


def _plugin(prefix: str) -> str:
    return textwrap.dedent(PLUGIN.format(prefix=prefix))


def _every_entry(prefix: str) -> list[str]:
    return sorted([f"{prefix}_last_attention", f"{prefix}_mass_in_mask", f"{prefix}_squares", f"{prefix} ViT"])


@pytest.fixture(scope="module")
def distribution(tmp_path_factory):
    """A plug-in distribution declaring the entry point, built and installed with pip (no network) into a folder
    that the commands below put on their Python path."""
    source = tmp_path_factory.mktemp("dist")
    (source / "lab_plugins").mkdir()
    (source / "lab_plugins" / "__init__.py").write_text(_plugin("lab"))
    (source / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "lab-plugins"
        version = "0.1"

        [project.entry-points."vitexplain.plugins"]
        lab = "lab_plugins"
        '''))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
                    "--no-deps", "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=300)
    assert list(target.glob("lab_plugins-*.dist-info")) or list(target.glob("lab_plugins*")), "not installed"
    return target


def _digit_image(path) -> None:
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((112, 112, 3)) * 255).astype(np.uint8)).save(path)


def test_an_installed_distribution_and_a_plugin_file_reach_every_registry_and_command(distribution, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(distribution))
    (tmp_path / "mine.py").write_text(_plugin("mine"))
    _digit_image(tmp_path / "digit.png")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bench.yaml").write_text(yaml.safe_dump({
        "plugins": ["../mine.py"], "models": ["digits_vit"],
        "methods": ["mine_last_attention", "lab_last_attention", "raw_attention"],
        "metrics": ["mine_mass_in_mask", "lab_mass_in_mask", "segmentation"],
        "dataset": {"name": "lab_squares", "options": {"n": 3}}, "gallery": 0, "device": "cpu",
        "output_dir": str(tmp_path / "bench")}))
    metrics, both_listed, explained, benched = run_cli_many(
        ["methods", "--metrics", "--plugin", "mine.py"],
        ["methods", "--plugin", "mine.py"],
        ["explain", "digit.png", "--model", "digits_vit", "--method", "lab_last_attention,mine_last_attention",
         "--plugin", "mine.py", "-o", "out", "--no-progress"],
        ["bench", "--config", "configs/bench.yaml", "--no-progress"], cwd=tmp_path)
    assert metrics.returncode == 0, metrics.stderr
    assert {"lab_mass_in_mask", "mine_mass_in_mask"} <= {line.split()[0] for line in metrics.stdout.splitlines()
                                                         if line and not line.startswith(" ")}
    assert both_listed.returncode == 0, both_listed.stderr
    listed = [line.split()[0] for line in both_listed.stdout.splitlines() if line and not line.startswith(" ")]
    assert {"lab_last_attention", "mine_last_attention", "gae"} <= set(listed)
    assert explained.returncode == 0, explained.stderr
    for method in ("lab_last_attention", "mine_last_attention"):
        assert np.load(tmp_path / "out" / f"digit.{method}.npy").shape == (14, 14)   # digits_vit: 8-px patches
    assert benched.returncode == 0, benched.stderr
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    scores = results["scores"]["digits_vit"]
    for method in ("mine_last_attention", "lab_last_attention", "raw_attention"):
        for metric in ("mine_mass_in_mask", "lab_mass_in_mask"):
            assert 0.0 <= scores[method][metric]["mass"] <= 1.0
        assert np.isfinite(scores[method]["segmentation"]["miou"])
    assert not results["errors"]

    (entries,) = run_python_many(["-c", REGISTRIES.format(prefix="lab")], cwd=tmp_path)
    assert entries.returncode == 0, entries.stderr
    assert eval(entries.stdout) == _every_entry("lab")       # all four registries, from the entry point alone


def test_a_plugin_that_cannot_load_is_one_line_naming_it(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\n\ndef oops(:\n    pass\n")
    (tmp_path / "clash.py").write_text("from vitexplain import register_method\n\n"
                                       "@register_method('gae')\ndef gae(adapter, images, target=None):\n"
                                       "    return images\n")
    (tmp_path / "failing.py").write_text("raise RuntimeError('no licence server')\n")
    runs = run_cli_many(["methods", "--plugin", "broken.py"], ["methods", "--plugin", "clash.py"],
                        ["explain", "x.png", "--model", "digits_vit", "--method", "gae", "--plugin", "failing.py"],
                        ["methods", "--plugin", "missing.py"], ["methods", "--plugin", "no_such_plugin_module"],
                        cwd=tmp_path)
    expected = ["plugin broken.py: line 3: invalid syntax",
                "plugin clash.py: ValueError: a explanation method named 'gae' is already registered",
                "plugin failing.py: RuntimeError: no licence server",
                "plugin missing.py: no such Python file",
                "plugin no_such_plugin_module: no module named 'no_such_plugin_module'"]
    for run, message in zip(runs, expected):
        assert run.returncode == 2 and run.stdout == ""
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vitexplain: error: ") and message in lines[0], run.stderr


def _installed(site, distribution: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """What ``pip install`` leaves of a distribution declaring ``entry_points`` (name -> module) in
    ``vitexplain.plugins``: its ``*.dist-info`` and the ``modules`` (name -> source), in the folder ``site``."""
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vitexplain.plugins]\n"
                                           + "".join(f"{name} = {module}\n" for name, module in entry_points.items()))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


#: what a broken installed plug-in stops a command with (``broken-lab``'s entry point ``broken``, below)
BROKEN = ("plugin ep_broken_plugin (entry point 'broken' of distribution broken-lab): ImportError: needs libfoo 2; "
          "to go on without it: pip uninstall broken-lab, or set VITEXPLAIN_PLUGINS=0 (or pass --no-plugins) to "
          "start without installed plug-ins")


def test_broken_installed_plugins_fail_every_lookup_alike_naming_their_distributions_and_the_fix(tmp_path, monkeypatch):
    """Every entry point is tried (the working one registers), then one line names each broken one, its
    distribution and the fix; the second and third lookups raise that line again, never silently go on without
    them. ``VITEXPLAIN_PLUGINS=0`` lets lookups go on; back at 1 the same line returns."""
    _installed(tmp_path, "broken-lab", {"a_works": "ep_works_plugin", "broken": "ep_broken_plugin"},
               {"ep_works_plugin": "from vitexplain import register_method\n\n"
                                   "@register_method(class_specific=False, cost=1, reads='output')\n"
                                   "def ep_works_method(adapter, images, target=None):\n    return images.mean(1)\n",
                "ep_broken_plugin": "raise ImportError('needs libfoo 2')\n"})
    _installed(tmp_path, "other-lab", {"missing": "ep_missing_module"}, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("VITEXPLAIN_PLUGINS", raising=False)
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))           # this test's entry points, then none
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_FAILED", None)
    expected = (BROKEN.partition("; to go")[0] + "; "
                "plugin ep_missing_module (entry point 'missing' of distribution other-lab): ModuleNotFoundError: No "
                "module named 'ep_missing_module'; to go on without them: pip uninstall broken-lab other-lab, or set "
                "VITEXPLAIN_PLUGINS=0 (or pass --no-plugins) to start without installed plug-ins")
    try:
        for lookup in (METHODS.names, lambda: METHODS.get("gae"), lambda: "gae" in METHODS):
            with pytest.raises(PluginError) as raised:
                lookup()
            assert str(raised.value) == expected
        monkeypatch.setenv("VITEXPLAIN_PLUGINS", "0")
        assert "gae" in METHODS.names() and METHODS.get("ep_works_method").passes() == 1   # the working one loaded
        monkeypatch.setenv("VITEXPLAIN_PLUGINS", "1")
        with plugins.without_entry_points():                                 # what --no-plugins does for a command
            assert "gae" in METHODS
        assert os.environ["VITEXPLAIN_PLUGINS"] == "1"                       # ... then undone
        with pytest.raises(PluginError) as raised:
            METHODS.get("gae")
        assert str(raised.value) == expected
        monkeypatch.setenv("VITEXPLAIN_PLUGINS", "maybe")
        with pytest.raises(PluginError, match=r"^VITEXPLAIN_PLUGINS='maybe' is not a switch: set it to 0 .*, or to 1"):
            METHODS.names()
    finally:
        if "ep_works_method" in METHODS._entries:
            METHODS.remove("ep_works_method")
        for module in ("ep_works_plugin", "ep_broken_plugin", "ep_missing_module"):
            sys.modules.pop(module, None)


def test_no_plugins_and_the_environment_switch_start_commands_without_a_broken_installed_plugin(tmp_path,
                                                                                                   monkeypatch):
    """A broken installed plug-in stops ``vitexplain methods`` with its one line; ``--no-plugins`` (after or before
    the command) and ``VITEXPLAIN_PLUGINS=0`` start without it, a ``--plugin`` file still loading."""
    _installed(tmp_path / "site", "broken-lab", {"broken": "ep_broken_plugin"},
               {"ep_broken_plugin": "raise ImportError('needs libfoo 2')\n"})
    (tmp_path / "mine.py").write_text(_plugin("mine"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.delenv("VITEXPLAIN_PLUGINS", raising=False)
    broken, flagged, leading = run_cli_many(["methods"], ["methods", "--no-plugins", "--plugin", "mine.py"],
                                            ["--no-plugins", "methods", "--datasets"], cwd=tmp_path)
    monkeypatch.setenv("VITEXPLAIN_PLUGINS", "0")
    (switched,) = run_cli_many(["methods", "--metrics", "--plugin", "mine.py"], cwd=tmp_path)
    assert broken.returncode == 2 and broken.stdout == "" and broken.stderr == f"vitexplain: error: {BROKEN}\n"
    listed = []
    for run in (flagged, leading, switched):
        assert run.returncode == 0 and run.stderr == "", run.stderr
        listed.append({line.split()[0] for line in run.stdout.splitlines() if line and not line.startswith(" ")})
    assert {"gae", "mine_last_attention"} <= listed[0]
    assert "digits" in listed[1]
    assert {"aopc", "mine_mass_in_mask"} <= listed[2]


def test_a_plugin_is_imported_once_and_a_bench_config_resolves_it_beside_itself(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "once.py").write_text(
        "from vitexplain import register_method\n\n"
        "@register_method('once_only', class_specific=False, cost=1, reads='output')\n"
        "def once_only(adapter, images, target=None):\n    return images.mean(1)\n")
    try:
        first = load_plugin(tmp_path / "sub" / "once.py")
        assert load_plugin("sub/once.py", base=tmp_path) is first        # same file: not imported twice
        assert "once_only" in METHODS
        from vitexplain.bench import BenchConfig

        (tmp_path / "sub" / "bench.yaml").write_text(yaml.safe_dump({
            "plugins": ["once.py"], "models": ["digits_vit"], "methods": ["once_only"], "metrics": ["sparseness"],
            "dataset": "digits"}))
        config = BenchConfig.from_yaml(tmp_path / "sub" / "bench.yaml")
        assert config.plugins == [str(tmp_path / "sub" / "once.py")]
        with pytest.raises(PluginError, match=r"^plugin nowhere\.py: no such Python file"):
            load_plugin("nowhere.py", base=tmp_path)
    finally:
        METHODS.remove("once_only")


def test_every_registry_takes_one_decorator_shape_whose_name_defaults_to_the_decorated_ones():
    """Bare, with metadata only, or with a name first; ``register_metric(Metric(...))`` is still taken as it is."""
    from torch.utils.data import Dataset

    from vitexplain.datasets.base import DATASETS, register_dataset
    from vitexplain.metrics.base import METRICS, Metric, register_metric
    from vitexplain.registry import register_method

    def shape_bare(adapter, images, target=None):
        return images.mean(1)

    def shape_costly(adapter, images, target=None):
        return images.mean(1)

    def compute(batch):
        return {}

    class ShapeData(Dataset):
        pass

    try:
        assert register_method(shape_bare) is shape_bare and METHODS.get("shape_bare").passes() == 3
        assert register_method(cost=1)(shape_costly) is shape_costly and METHODS.get("shape_costly").passes() == 1
        register_method("shape_named", cost=2)(shape_bare)
        assert METHODS.get("shape_named").fn is shape_bare and METHODS.get("shape_named").passes() == 2
        assert register_metric(reduce=dict, group="other")(compute) is compute
        # registered compute functions are checked on every call (options.checking): the function itself, wrapped
        assert METRICS.get("compute").compute.__wrapped__ is compute and METRICS.get("compute").reduce is dict
        register_metric("shape_metric", reduce=dict)(compute)
        ready = Metric("shape_ready", compute, dict)
        assert register_metric(ready) is ready and METRICS.get("shape_ready") is ready
        assert register_dataset(ShapeData) is ShapeData and DATASETS.get("ShapeData") is ShapeData
        register_dataset("shape_data")(ShapeData)
        assert DATASETS.get("shape_data") is ShapeData
        with pytest.raises(ValueError, match="named 'shape_bare' is already registered"):
            register_method(shape_bare)
    finally:
        for name in ("shape_bare", "shape_costly", "shape_named"):
            METHODS.remove(name)
        for name in ("compute", "shape_metric", "shape_ready"):
            METRICS.remove(name)
        for name in ("ShapeData", "shape_data"):
            DATASETS.remove(name)
