"""A method registered from a module of its own reaches every part of vitexplain, with no other file touched:
``explain``, the bench (tables, gallery, sanity check), the reproduce cost estimates and ``vitexplain methods``."""
from __future__ import annotations

import pytest
import torch

from vitexplain import explain, get_method
from vitexplain.bench import BenchConfig, run_benchmark
from vitexplain.registry import METHODS
from vitexplain.reproduce.cost import FORWARDS_PER_SECOND, estimate_gpu_hours
from vitexplain.reproduce.recipe import Column, MetricUse, Row, Setting, TableRecipe
from vitexplain.reproduce.tables.tis import TIS_RECIPES

from cli import run_python_many
from conftest import make_vit, module_from_source
from test_bench_fakes import RandomImages

PLUGIN = '''
"""A plug-in: the attention the class token pays in the first block, scaled."""
from typing import Literal

from vitexplain import register_method
from vitexplain.options import PositiveInt


@register_method(class_specific=False, cost=lambda options: 2 * options["n_steps"])
def plugin_first_attention(adapter, images, target=None, *, n_steps: PositiveInt = 3,
                           fusion: Literal["mean", "max"] = "mean"):
    """First block's attention from the readout, fused over heads, times n_steps."""
    record = adapter.record(images, target, fields=("attn",), blocks=(0,))
    attn = record.blocks[0].attn
    fused = attn.mean(1) if fusion == "mean" else attn.amax(1)
    return n_steps * record.geometry.readout_row(fused)
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    with module_from_source(folder, "my_plugin", PLUGIN) as module:
        try:
            yield module, folder
        finally:
            METHODS.remove("plugin_first_attention")


def test_explain_runs_it_with_its_options_checked(plugin):
    model, images = make_vit(), torch.randn(2, 3, 32, 32)
    maps = explain(model, images, "plugin_first_attention", n_steps=2)
    assert maps.shape == (2, 4, 4)
    torch.testing.assert_close(maps, 2 * explain(model, images, "plugin_first_attention", n_steps=1))
    with pytest.raises(ValueError,
                       match="option fusion of method 'plugin_first_attention' must be one of 'mean', 'max'"):
        explain(model, images, "plugin_first_attention", fusion="min")


def test_the_bench_shows_it_in_tables_gallery_and_sanity_check(plugin, tmp_path):
    config = BenchConfig(models={"tiny": make_vit(depth=2)}, methods=["plugin_first_attention", "gae"],
                         dataset=RandomImages(4, masks=True), metrics=["segmentation"], batch_size=4,
                         output_dir=tmp_path, progress=False, device="cpu", gallery=2, sanity={"images": 2})
    result = run_benchmark(config)
    assert not result.errors
    assert "plugin_first_attention" in result.scores["tiny"] and "plugin_first_attention" in result.markdown()
    assert result.galleries[0].maps["plugin_first_attention"] is not None
    assert "plugin_first_attention" in result.sanity["tiny"]["methods"]
    assert "plugin_first_attention" in (tmp_path / "report.html").read_text()


def test_reproduce_cost_estimates_read_its_cost(plugin):
    template = TIS_RECIPES[0]
    setting = Setting("s", "g", "vit_base", template.settings[0].data, "label", (MetricUse("pg", "pointing_game"),))
    recipe = TableRecipe("plugin", "paper", "table", (Row("P", "plugin_first_attention", {"n_steps": 5}),),
                    (Column("pg", ("PG",), "g", "pg", "accuracy"),), (setting,))
    images = template.settings[0].data.subset
    assert get_method("plugin_first_attention").passes({"n_steps": 5}) == 10
    assert estimate_gpu_hours(recipe) == pytest.approx(images * 10 / FORWARDS_PER_SECOND / 3600)


def test_vitexplain_methods_lists_it(plugin):
    _, folder = plugin
    # a user's entry point that imports their plug-in, then runs the command line
    (result,) = run_python_many(["-c", "import sys, my_plugin; from vitexplain.cli.main import main; "
                                       "sys.exit(main(['methods']))"], cwd=folder)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("plugin_first_attention"))
    assert "[token, image]" in line and "First block's attention" in line
    assert "n_steps=3, fusion='mean'" in result.stdout
