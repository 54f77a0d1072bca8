"""Evaluation protocols of the three papers, one module each, registered by name."""
import importlib
import pkgutil

from .base import EvalBatch, Metric, available_metrics, get_metric, register_metric

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base",) and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["EvalBatch", "Metric", "available_metrics", "get_metric", "register_metric"]
