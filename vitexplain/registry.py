"""Things registered by name — explanation methods, metrics, datasets, reproduce recipes — in one kind of registry.

A :class:`Registry` maps names to entries, refuses a second entry under a taken name, and answers an
unknown name with the closest match and the full list. Built-in entries are found one way for every
kind: each lives in a module of the registry's package (methods in :mod:`vitexplain.methods`, metrics in
:mod:`vitexplain.metrics`, datasets in :mod:`vitexplain.datasets`, model families in
:mod:`vitexplain.instrumentation.families`, recipes in :mod:`vitexplain.reproduce.tables`), registers itself
when imported, and the registry imports every module of its package whose name does not start with ``_``
before its first lookup; adding one is adding a module. Entries from outside the package come as plug-ins
(:mod:`vitexplain.plugins`: a file, a module, or an installed distribution's entry point). Everything a
part of the library needs to know about an entry lives on the entry (for a method: its resolution, whether
it is class-specific, randomised or a control, which inputs it explains, what it costs), so adding one
touches no table elsewhere.

Every registry is added to one way (:func:`registering`): a decorator whose name defaults to the decorated
function's (or class's) and whose metadata are its keyword arguments: ``@register_method``,
``@register_method(resolution="pixel")``, ``@register_metric("aopc", reduce=...)``.

Explanation methods are functions ``fn(adapter, images, target, *, option=default, ...) -> Tensor
[B, h, w]`` decorated with :func:`register_method`. Their keyword-only parameters are their options,
checked by name and by annotated type (:mod:`vitexplain.options`).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import options as option_checks

if TYPE_CHECKING:
    from torch import Tensor

T = TypeVar("T")
#: what a registration decorator decorates: a function (methods, metrics) or a class (datasets)
Decorated = TypeVar("Decorated", bound=Callable[..., Any])

RESOLUTIONS = ("token", "pixel")
MODALITIES = ("image", "text")
#: what a method reads of a model, least first: only its ``output`` (and gradients with respect to the
#: inputs: any differentiable model), a Transformer block's ``tokens``, or its ``attention``
READS = ("output", "tokens", "attention")
#: the other implementations an entry (a method or a protocol) may say it also exists in (its ``reference``), by
#: the name the catalogue shows: LATEC (Klein et al., NeurIPS 2024 Datasets and Benchmarks, IML-DKFZ/latec) and
#: Quantus (Hedström et al., JMLR 2023; compared here at 0.6.0); the catalogue says where vitexplain departs from them
REFERENCES = {"latec": "LATEC", "quantus": "Quantus"}


def import_modules(package: str) -> None:
    """Import every module of ``package`` whose name does not start with ``_`` (in name order): the
    built-in entries of a registry register themselves on import."""
    found = importlib.import_module(package)
    for module in sorted(pkgutil.iter_modules(found.__path__), key=lambda info: info.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")


class Registry(Generic[T]):
    """Entries of one kind by name; the built-in ones are the modules of ``package`` (dotted name),
    imported before the first lookup.

    Names are listed sorted, or in registration order with ``sort=False`` (e.g. recipes in table order).
    """

    def __init__(self, kind: str, package: str | None = None, *, sort: bool = True):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._package = package
        self._sort = sort

    def _load(self) -> None:
        """The built-in entries, then every installed plug-in's (:mod:`vitexplain.plugins`)."""
        self._load_builtins()
        from .plugins import load_entry_point_plugins

        load_entry_point_plugins()

    def _load_builtins(self) -> None:
        if self._package is not None:
            package, self._package = self._package, None
            import_modules(package)

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name``; a taken name is a ValueError. A plug-in adding an entry finds the
        built-ins registered first, so its clash with one is reported against the plug-in."""
        from .plugins import importing_plugin

        if importing_plugin():
            self._load_builtins()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._entries:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Unregister ``name`` (for plug-ins and tests that register temporary entries)."""
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        self._load()
        if not isinstance(name, str) or name not in self._entries:
            close = option_checks.similar_names(name, self._entries, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; available: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Every registered name (sorted unless the registry keeps registration order)."""
        self._load()
        return sorted(self._entries) if self._sort else list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def registering(add: Callable[[str, Decorated], object], name: str | Decorated | None) -> Any:
    """The one registration shape: ``@register``, ``@register()`` or ``@register("name")``, the metadata as the
    register function's keyword arguments; ``add(name, decorated)`` registers. The name defaults to the decorated
    object's ``__name__``; given bare, ``name`` is the decorated object itself, registered at once."""
    if callable(name):
        return registering(add, None)(name)

    def decorate(decorated: Decorated) -> Decorated:
        add(decorated.__name__ if name is None else name, decorated)
        return decorated

    return decorate


def checked_reference(kind: str, reference: str | tuple[str, ...], departures: str) -> tuple[str, ...]:
    """An entry's ``reference`` as a tuple of :data:`REFERENCES` names, checked with its ``departures``: an entry that
    names a reference implementation says where it departs from it (``"none: as Quantus computes it"`` when it does
    not), and one that names none has no departures to state."""
    names = (reference,) if isinstance(reference, str) else tuple(reference)
    unknown = [name for name in names if name not in REFERENCES]
    if unknown:
        raise ValueError(f"{kind}: unknown reference {unknown[0]!r}; known: {', '.join(REFERENCES)}")
    if names and not departures.strip():
        raise ValueError(f"{kind}: reference {', '.join(names)} needs departures=, where this entry departs from it "
                         f"(or 'none: as ... computes it')")
    if departures.strip() and not names:
        raise ValueError(f"{kind}: departures= says where it departs from a reference implementation; name it with "
                         f"reference= (one of {', '.join(REFERENCES)})")
    return names


def fixed_cost(passes: float) -> Callable[[dict[str, Any]], float]:
    """A cost function for a method whose cost does not depend on its options."""
    return lambda options: float(passes)


@dataclass(frozen=True)
class MethodSpec:
    """A registered explanation method.

    Attributes:
        name: registry name, e.g. ``"rollout"``.
        fn: the implementation.
        resolution: ``"token"`` (maps on the patch grid) or ``"pixel"`` (maps at image size).
        class_specific: whether the map depends on the target class.
        modalities: the inputs it explains: ``"image"`` and, for methods that only read the recording
            (attention, q / k / v, the residual stream and its gradients), ``"text"``.
        control: a reference map, not an explanation (random / constant): shown for reference in
            reports, never counted as best, left out of ``--method all``.
        cost: model passes per input (a backward counts as two forwards) given the effective
            options, for planning (``vitexplain reproduce --list``).
        score_targets: whether it explains any score of the output (an embedding direction, a score
            function), not only a class (LRP starts from relevance on the class logits: it does not).
        precision_caveats: reduced precisions (named as
            :func:`~vitexplain.instrumentation.precision.precision_modes` names them) in which its maps were
            measured below r = 0.99 to the float32 ones, with the worst r measured; ``explain`` warns once.
        reads: what it reads of a model (one of :data:`READS`); ``explain`` refuses a model from which
            that cannot be read, naming it.
        zero_map_reason: why the method can return a map that is zero everywhere (e.g. its final ReLU);
            ``explain`` names it in the notice it gives when that happens.
        fresh_per_copy: a randomised control that stands for a map unrelated to its image (``random_baseline``):
            explained again for the k-th perturbed copy of an image (``copy=k`` of
            :attr:`~vitexplain.metrics.base.EvalBatch.explain`, as the stability protocols call it), it draws
            afresh, its seed derived from its own and k (:func:`~vitexplain.seeding.derived_seed`), so a stability
            protocol compares its map with an independent one: the least stable map there is
            (docs/decisions/metric-trust.md, "The control of a stability protocol").
        reference: the other implementations of the method, names of :data:`REFERENCES` (``("latec",)``); empty: none
            of them has it.
        departures: where this implementation departs from those (their settings, their arithmetic), in one to three
            plain sentences, shown in the catalogue (docs/catalogue/methods.md); required with ``reference``.
    """

    name: str
    fn: Callable[..., Tensor]
    resolution: str
    class_specific: bool
    modalities: tuple[str, ...]
    control: bool
    cost: Callable[[dict[str, Any]], float]
    score_targets: bool = True
    precision_caveats: Mapping[str, float] = field(default_factory=dict)
    reads: str = "attention"
    zero_map_reason: str = "no token carried relevance to the target as this method measures it"
    fresh_per_copy: bool = False
    reference: tuple[str, ...] = ()
    departures: str = ""

    @property
    def randomised(self) -> bool:
        """Whether the method draws random numbers (then it takes a ``seed`` option)."""
        return "seed" in self.options

    @property
    def options(self) -> dict[str, Any]:
        """Option names and their defaults."""
        return option_checks.option_defaults(self.fn)

    @property
    def option_types(self) -> dict[str, Any]:
        """Option names and their annotated types."""
        return option_checks.option_types(self.fn)

    @property
    def summary(self) -> str:
        return (inspect.getdoc(self.fn) or "").split("\n", 1)[0]

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse unknown options (listing the valid ones) and values outside their annotated type."""
        option_checks.check_options(f"method {self.name!r}", self.fn, options)

    def passes(self, options: dict[str, Any] | None = None) -> float:
        """Model passes per input with ``options`` over the defaults (see :attr:`cost`)."""
        return self.cost({**self.options, **(options or {})})

    def bind(self, options: Mapping[str, Any] | None = None, *, seed: int | None = None,
             label: str | None = None) -> BoundMethod:
        """This method with ``options`` (checked here, once) and, when it is randomised and they give no seed,
        ``seed`` (:func:`~vitexplain.options.seeded`): what the callers after the door carry."""
        given = dict(options or {})
        self.check_options(given)
        return BoundMethod(self, option_checks.seeded(self.options, given, seed), label or self.name)


@dataclass(frozen=True, eq=False)
class BoundMethod:
    """A method resolved where a user named it (``explain``, ``evaluate``, a bench config) with the options it runs
    with (:meth:`MethodSpec.bind`): re-explaining, cache keys and results carry it, never the name again.

    Attributes:
        spec: the registered method.
        options: the options it is called with, checked: the given ones and the caller's seed (defaults are not
            filled in: :attr:`effective` has them).
        label: how tables and reports name it (a bench entry's label; else the method's name).
    """

    spec: MethodSpec
    options: Mapping[str, Any]
    label: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def effective(self) -> dict[str, Any]:
        """The options with the method's defaults filled in (what its cache key covers)."""
        return {**self.spec.options, **self.options}

    def __call__(self, adapter: Any, images: Any, target: Any = None, **changes: Any) -> Tensor:
        """The maps of ``images`` for ``target``, ``changes`` (a re-explaining protocol's seed) over the options."""
        return self.spec.fn(adapter, images, target, **{**self.options, **changes})


METHODS: Registry[MethodSpec] = Registry("explanation method", "vitexplain.methods")


def register_method(name: str | Callable[..., Tensor] | None = None, /, *, resolution: str = "token",
                    class_specific: bool = True, modalities: tuple[str, ...] = ("image",), control: bool = False,
                    cost: float | Callable[[dict[str, Any]], float] = 3.0, score_targets: bool = True,
                    precision_caveats: Mapping[str, float] | None = None, reads: str = "attention",
                    zero_map_reason: str = MethodSpec.zero_map_reason, fresh_per_copy: bool = False,
                    reference: str | tuple[str, ...] = (), departures: str = "") -> Any:
    """Decorator that registers an explanation method (see :class:`MethodSpec`), under the function's name
    unless ``name`` is given: ``@register_method``, ``@register_method(cost=1)``, ``@register_method("x", ...)``.

    ``cost`` is a number of model passes, or a function of the effective options returning one; the
    default, 3, is one forward and one backward. ``reads`` defaults to the most a method can read, so
    that a method which does not say is never run on a model whose attention cannot be read. ``reference`` names
    the other implementations that have the method (:data:`REFERENCES`) and ``departures`` says where this one departs
    from them; the catalogue shows both.
    """
    if resolution not in RESOLUTIONS:
        raise ValueError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}, got {reads!r}")
    unknown = set(modalities) - set(MODALITIES)
    if not modalities or unknown:
        raise ValueError(f"modalities must be a non-empty subset of {MODALITIES}, got {modalities!r}")
    cost_fn = cost if callable(cost) else fixed_cost(cost)
    if fresh_per_copy and not control:
        raise ValueError("fresh_per_copy is for a control (a map unrelated to its image), not an explanation")

    def add(key: str, fn: Callable[..., Tensor]) -> None:
        spec = MethodSpec(key, fn, resolution, class_specific, tuple(modalities), control, cost_fn, score_targets,
                          dict(precision_caveats or {}), reads, zero_map_reason, fresh_per_copy,
                          checked_reference(f"method {key!r}", reference, departures), " ".join(departures.split()))
        if fresh_per_copy and not spec.randomised:
            raise ValueError(f"method {key!r}: fresh_per_copy needs a seed option to draw afresh with")
        METHODS.add(key, spec)

    return registering(add, name)


def available_methods(modality: str | None = None, *, controls: bool = True) -> list[str]:
    """Names of the registered explanation methods, sorted: all, or those explaining ``modality``
    (``"image"`` / ``"text"``), with or without the controls."""
    return [name for name in METHODS.names()
            if (modality is None or modality in METHODS.get(name).modalities)
            and (controls or not METHODS.get(name).control)]


def get_method(name: str) -> MethodSpec:
    """The registered method called ``name``; an unknown name gets the list of valid ones."""
    return METHODS.get(name)
