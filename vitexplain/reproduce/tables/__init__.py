"""The papers' tables as recipes: one module per paper, each registering its tables with
:func:`~vitexplain.reproduce.recipe.register_recipes` (found by the recipe registry; nothing to list)."""
