"""vitexplain: explain Vision Transformer predictions with heatmaps, and measure the explanations.

The public names are imported on first use, so ``import vitexplain`` (and the command line's
``--help``) does not load torch until something needs it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

#: public name -> the submodule that defines it
_EXPORTS = {
    "explain": "api",
    "explain_files": "file_explanations",
    "explain_files_with_texts": "file_explanations",
    "UnsupportedModelError": "instrumentation",
    "adapter_for": "instrumentation",
    "find_register_neurons": "instrumentation.test_time_registers",
    "test_time_registers": "instrumentation.test_time_registers",
    "available_methods": "registry",
    "get_method": "registry",
    "register_method": "registry",
    "explain_texts": "text_prompts",
    "text_embeddings": "text_prompts",
    "plot": "viz",
    "evaluate": "evaluation",
    "Scores": "evaluation",
    "load_model": "models",
    "load_plugin": "plugins",
    "ExplorerPage": "explorer",
    "explorer_items": "explorer",
}

__all__ = ["ExplorerPage", "Scores", "UnsupportedModelError", "adapter_for", "available_methods", "evaluate", "explain",
           "explain_files", "explain_files_with_texts", "explain_texts", "explorer_items", "find_register_neurons",
           "get_method", "load_model", "load_plugin", "plot", "register_method", "test_time_registers",
           "text_embeddings", "__version__"]

if TYPE_CHECKING:
    from .api import explain
    from .evaluation import Scores, evaluate
    from .explorer import ExplorerPage, explorer_items
    from .file_explanations import explain_files, explain_files_with_texts
    from .instrumentation import UnsupportedModelError, adapter_for
    from .instrumentation.test_time_registers import find_register_neurons, test_time_registers
    from .models import load_model
    from .plugins import load_plugin
    from .registry import available_methods, get_method, register_method
    from .text_prompts import explain_texts, text_embeddings
    from .viz import plot


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
