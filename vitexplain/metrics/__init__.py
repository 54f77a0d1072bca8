"""Evaluation protocols, one module each, registered by name (the metric registry imports every module
here before its first lookup)."""
from ._perturb import SharedForwards
from .base import EvalBatch, Metric, available_metrics, get_metric, register_metric

__all__ = ["EvalBatch", "Metric", "SharedForwards", "available_metrics", "get_metric", "register_metric"]
