"""The package's version, in this one place: ``vitexplain.__version__`` and the build (pyproject.toml's
``[tool.setuptools.dynamic]``) both read it."""

__version__ = "0.1.0"
