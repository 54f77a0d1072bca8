"""The benchmark harness behind ``vitexplain bench``: models x methods x metrics on a dataset.

Modules, each importing only those listed before it: :mod:`~.config` (what a run is),
:mod:`~.data` (which images, batches), :mod:`~.distributed` (torchrun), :mod:`~.store` (checksummed
files), :mod:`~.cache` (which folder holds what), :mod:`~.randomisation` (the randomisation check's
verdict), :mod:`~.tables` (tables as data and text), :mod:`~.result` (the result model),
:mod:`~.findings` (one process's findings), :mod:`~.plots`, :mod:`~.html`, :mod:`~.writers` (the
reports), :mod:`~.gallery`, :mod:`~.runner` (the loop).

>>> from vitexplain.bench import BenchConfig, run_benchmark
>>> result = run_benchmark(BenchConfig.from_yaml("bench.yaml"))      # doctest: +SKIP
>>> print(result.text())                                              # doctest: +SKIP
>>> result = run_benchmark(DEFAULT_CONFIG)       # what `vitexplain bench` runs   # doctest: +SKIP
"""
from .config import SHIPPED_CONFIGS, BenchConfig, DatasetSpec, MethodEntry, MetricEntry, ModelEntry, SanityCheck
from .result import BenchResult
from .runner import run_benchmark

#: the default benchmark (``vitexplain bench`` without arguments): copy it to make your own
DEFAULT_CONFIG = SHIPPED_CONFIGS["default"]

__all__ = ["DEFAULT_CONFIG", "BenchConfig", "BenchResult", "DatasetSpec", "MethodEntry", "MetricEntry", "ModelEntry",
           "SanityCheck", "run_benchmark"]
