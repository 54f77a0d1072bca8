"""Reproduce the papers' tables with one call, side by side with the published numbers.

>>> from vitexplain.reproduce import run_recipe
>>> table = run_recipe("tokentm-table1", data={"imagenet_seg": "/data/imagenet-seg"})   # doctest: +SKIP
>>> print(table.markdown())                                                               # doctest: +SKIP

One recipe per table (:mod:`vitexplain.reproduce.tables`) fixes the dataset, model, methods and
protocol; the published numbers live in ``published/<paper>.yaml``; the benchmark harness
(:mod:`vitexplain.bench`) computes the reproduced ones.
"""
from .cost import estimate_gpu_hours
from .published import PublishedTable, load_published
from .recipe import DATA_INPUTS, MODELS, RECIPES, TableRecipe, available_recipes, get_recipe
from .runner import RecipeInputError, plan_recipe, run_recipe
from .table import Cell, ReproducedTable

__all__ = ["Cell", "DATA_INPUTS", "MODELS", "PublishedTable", "RECIPES", "RecipeInputError", "ReproducedTable",
           "TableRecipe", "available_recipes", "estimate_gpu_hours", "get_recipe", "load_published", "plan_recipe",
           "run_recipe"]
