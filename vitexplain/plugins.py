"""Plug-ins: methods, metrics, datasets and model families that live outside the package.

A plug-in is a Python module that registers entries when imported (``@register_method``,
``register_metric``, ``@register_dataset``, ``@register_family``), exactly as a built-in module does. It
reaches vitexplain three ways:

* a file or an importable module named on the command line (``--plugin my_method.py``, repeatable, on
  every subcommand) or in a bench config (``plugins: [my_method.py]``, paths relative to the config file);
* :func:`load_plugin` from Python;
* an entry point in the ``vitexplain.plugins`` group of an installed distribution (its ``pyproject.toml``:
  ``[project.entry-points."vitexplain.plugins"] my_methods = "my_package.methods"``), imported the first
  time any registry is looked up.

A plug-in is imported once however often it is named. One that cannot be imported, or registers a name
that is taken (a built-in's included: a registry's built-ins are loaded before a plug-in adds to it), is a
:class:`PluginError` of one line naming the plug-in and the problem.
"""
from __future__ import annotations

import contextvars
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from types import ModuleType

#: the entry-point group an installed distribution declares its plug-in modules in
ENTRY_POINT_GROUP = "vitexplain.plugins"


class PluginError(RuntimeError):
    """A plug-in could not be imported, or registered a name already taken."""


#: plug-ins imported so far, by resolved file path or module name
_LOADED: dict[str, ModuleType] = {}
_ENTRY_POINTS_LOADED = False
#: set while a plug-in is being imported: a registry it adds to loads its built-ins first
_IMPORTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("vitexplain_plugin", default=None)


def importing_plugin() -> bool:
    """Whether a plug-in's import is under way (see :meth:`vitexplain.registry.Registry.add`)."""
    return _IMPORTING.get() is not None


def is_file_plugin(spec: str | Path) -> bool:
    """Whether ``spec`` names a file (a ``.py`` path) rather than a module (a dotted name)."""
    text = str(spec)
    return isinstance(spec, Path) or text.endswith(".py") or "/" in text or "\\" in text


def load_plugin(spec: str | Path, base: str | Path | None = None) -> ModuleType:
    """Import the plug-in ``spec``: a ``.py`` file (relative to ``base``, default the working directory) or a
    dotted module name on ``sys.path``; the module, imported once."""
    if is_file_plugin(spec):
        path = (Path(base or ".") / Path(spec).expanduser()).resolve()
        if path.suffix != ".py" or not path.is_file():
            raise PluginError(f"plugin {spec}: no such Python file ({path})")
        key = str(path)
        if key not in _LOADED:
            digest = hashlib.sha256(key.encode()).hexdigest()[:8]
            _LOADED[key] = _import_file(path, f"vitexplain_plugin_{path.stem}_{digest}", str(spec))
        return _LOADED[key]
    name = str(spec)
    if name not in _LOADED:
        with _describing(name):
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as error:
                if error.name is None or not name.startswith(error.name):
                    raise
                raise PluginError(f"plugin {name}: no module named {error.name!r} on the Python path "
                                  f"(give a .py file, or install the package that holds it)") from None
        _LOADED[name] = module
    return _LOADED[name]


def load_plugins(specs: Iterable[str | Path], base: str | Path | None = None) -> list[ModuleType]:
    """:func:`load_plugin` for each of ``specs``, in order."""
    return [load_plugin(spec, base) for spec in specs]


def load_entry_point_plugins() -> None:
    """Import every module the installed distributions declare in :data:`ENTRY_POINT_GROUP` (once)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda found: found.name):
        if entry.value in _LOADED:
            continue
        owner = f" of {entry.dist.name}" if getattr(entry, "dist", None) is not None else ""
        with _describing(f"{entry.name} ({entry.value}, entry point{owner})"):
            _LOADED[entry.value] = entry.load()


def _import_file(path: Path, name: str, given: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {given}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # so that what it defines (dataclasses, pickled classes) finds its module
    try:
        with _describing(given):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@contextmanager
def _describing(plugin: str) -> Iterator[None]:
    """Turn what importing ``plugin`` raises into one line naming it (a SyntaxError with its line)."""
    token = _IMPORTING.set(plugin)
    try:
        yield
    except PluginError:
        raise
    except SyntaxError as error:
        raise PluginError(f"plugin {plugin}: line {error.lineno}: {error.msg}") from None
    except Exception as error:  # noqa: BLE001 - whatever a plug-in raises is reported the same way
        detail = " ".join(str(error).split()) or type(error).__name__
        raise PluginError(f"plugin {plugin}: {type(error).__name__}: {detail}") from error
    finally:
        _IMPORTING.reset(token)
