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

An installed plug-in that fails stops the lookup that loaded it (a plug-in the user installed silently
missing would change what a command computes), but its line says how to go on: it names the entry point and
its distribution, and ends with the fix: ``pip uninstall DIST``, or start without installed plug-ins. Every
entry point is tried (the working ones register), then one line names every broken one. The failure is
kept: every later lookup in the process raises the same line again, never silently without the plug-in.

The switch: ``VITEXPLAIN_PLUGINS=0`` in the environment (or ``--no-plugins`` on any subcommand, which sets it
for the command; :func:`without_entry_points` in Python) and no entry point is loaded; files and modules
named explicitly (``--plugin``, ``plugins:``, :func:`load_plugin`) still are. It is read at every lookup, so
setting it after an installed plug-in failed lets the next lookup go on with the built-ins (and the entries of
the entry points that did load). ``1`` (or unset) is the default: entry points load.
"""
from __future__ import annotations

import contextvars
import hashlib
import importlib
import importlib.util
import os
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
#: whether the entry points have been loaded (set when loading starts: a plug-in's own lookup does not restart it)
_ENTRY_POINTS_LOADED = False
#: the line of the entry points that failed, and what the first raised, raised again at every later lookup
_ENTRY_POINTS_FAILED: tuple[str, BaseException | None] | None = None
#: the environment variable that switches entry points off (``0``) or on (``1``, the default)
SWITCH = "VITEXPLAIN_PLUGINS"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")
#: how to go on past a broken installed plug-in, ending its line
_START_WITHOUT = f"or set {SWITCH}=0 (or pass --no-plugins) to start without installed plug-ins"
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


def entry_points_enabled() -> bool:
    """Whether installed plug-ins (entry points) are loaded: :data:`SWITCH` in the environment, read now."""
    value = os.environ.get(SWITCH, "")
    if value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    raise PluginError(f"{SWITCH}={value!r} is not a switch: set it to 0 to start without installed plug-ins "
                      f"(entry points), or to 1 or leave it unset to load them")


@contextmanager
def without_entry_points() -> Iterator[None]:
    """``VITEXPLAIN_PLUGINS=0`` while the block runs (what ``--no-plugins`` does for a command), then as before.
    Entry points loaded before the block stay loaded."""
    saved = os.environ.get(SWITCH)
    os.environ[SWITCH] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(SWITCH, None)
        else:
            os.environ[SWITCH] = saved


def load_entry_point_plugins() -> None:
    """Import every module the installed distributions declare in :data:`ENTRY_POINT_GROUP` (once), unless
    :func:`entry_points_enabled` says no. Every one is tried; those that fail are one :class:`PluginError`
    naming each and its distribution, with the fix, raised again, the same, at every later call."""
    global _ENTRY_POINTS_LOADED, _ENTRY_POINTS_FAILED
    if not entry_points_enabled():
        return
    if _ENTRY_POINTS_FAILED is not None:
        message, cause = _ENTRY_POINTS_FAILED
        raise PluginError(message) from cause
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    failed: list[tuple[str, str | None, PluginError]] = []
    try:
        for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda found: found.name):
            if entry.value in _LOADED:
                continue
            dist = getattr(getattr(entry, "dist", None), "name", None)
            owner = f" of distribution {dist}" if dist else ""
            try:
                with _describing(f"{entry.value} (entry point {entry.name!r}{owner})"):
                    _LOADED[entry.value] = entry.load()
            except PluginError as error:
                failed.append((entry.name, dist, error))
    except BaseException:              # interrupted (not a plug-in's error): the next lookup tries again
        _ENTRY_POINTS_LOADED = False
        raise
    if failed:
        _ENTRY_POINTS_FAILED = (_broken_line(failed), failed[0][2].__cause__)
        raise PluginError(_ENTRY_POINTS_FAILED[0]) from _ENTRY_POINTS_FAILED[1]


def _broken_line(failed: list[tuple[str, str | None, PluginError]]) -> str:
    """One line for the installed plug-ins that failed: each one's problem, then how to go on without them."""
    problems = "; ".join(str(error) for _, _, error in failed)
    dists = list(dict.fromkeys(dist for _, dist, _ in failed if dist))
    unknown = [name for name, dist, _ in failed if not dist]
    remedy = []
    if dists:
        remedy.append(f"pip uninstall {' '.join(dists)}")
    if unknown:
        remedy.append(f"uninstall the package that declares entry point {', '.join(unknown)}")
    return f"{problems}; to go on without {'it' if len(failed) == 1 else 'them'}: {', '.join(remedy)}, {_START_WITHOUT}"


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
