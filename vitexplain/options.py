"""Option values checked, and parsed from text, by their type annotations.

Methods and metrics declare their options as keyword-only parameters with annotated types; the
registries check what a user passes against those annotations (so no method writes its own
``if not isinstance(...)`` checks), and the command line parses ``-O KEY=VALUE`` text into the
annotated type. Supported annotations: ``int``, ``float`` (an int is accepted), ``bool``, ``str``,
``None``, ``Literal[...]``, unions (``X | Y``), ``Sequence[X]`` / ``list[X]`` / ``tuple[X, ...]``,
``Annotated[X, Range(...)]`` for bounds, and anything else as an ``isinstance`` check (``Tensor``),
``Callable`` as ``callable``. The aliases below name the bounded types the library uses.
"""
from __future__ import annotations

import collections.abc
import difflib
import functools
import inspect
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Union


class InvalidOption(ValueError, TypeError):
    """An option value outside its annotated type: a wrong kind of value (TypeError) or one out of range
    (ValueError)."""


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``low <= value`` (``<`` when ``low_open``) and ``value <= high``
    (``<`` when ``high_open``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return " and ".join(parts)


@dataclass(frozen=True)
class Pixels:
    """Marks an option that counts pixels of the image: a length (``power`` 1: a window, a patch's side, a shift) or
    an area (``power`` 2: a number of pixels). A bench config's ``pixels_at`` scales such options, written for
    images of that size, to each model's input size (:func:`scale_pixels`)."""

    power: int


#: An integer >= 1 (counts: masks, samples, steps, batch sizes).
PositiveInt = Annotated[int, Range(low=1)]
#: A length in pixels >= 1 (a window, a patch's side, a shift), scaled with the image's side by ``pixels_at``.
PixelLength = Annotated[int, Range(low=1), Pixels(1)]
#: A number of pixels >= 1, scaled with the image's area by ``pixels_at``.
PixelArea = Annotated[int, Range(low=1), Pixels(2)]
#: An integer >= 2 (steps of a curve with both ends, samples of a correlation, groups of a partition).
AtLeastTwo = Annotated[int, Range(low=2)]
#: A number > 0 (radii, noise levels and tolerances that must not vanish).
Positive = Annotated[float, Range(low=0, low_open=True)]
#: A number >= 0 (noise levels, distances).
NonNegative = Annotated[float, Range(low=0)]
#: A share of something in (0, 1].
Share = Annotated[float, Range(low=0, high=1, low_open=True)]
#: A share in [0, 1).
OpenShare = Annotated[float, Range(low=0, high=1, high_open=True)]
#: A probability in (0, 1].
Probability = Share
#: A block index: 0-based, negative counts from the end (checked against the model by the method).
BlockIndex = int
#: What a method or metric differentiates or scores: the target's logit, softmax probability or its log.
Score = Literal["logit", "probability", "log_probability"]
#: what models run in while they are explained or benchmarked: ``float32`` (the papers'), ``tf32`` (TF32
#: products and convolutions), ``bfloat16`` / ``float16`` (autocast); see instrumentation/precision.py
Precision = Literal["float32", "tf32", "bfloat16", "float16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)


def _origin(annotation: Any) -> Any:
    return typing.get_origin(annotation)


def describe(annotation: Any) -> str:
    """The annotation in words, for error messages ("an integer >= 1", "one of 'a', 'b'")."""
    origin = _origin(annotation)
    if annotation is inspect.Parameter.empty or annotation is Any:
        return "anything"
    if annotation is type(None) or annotation is None:
        return "None"
    if origin is Annotated:
        base, *extras = typing.get_args(annotation)
        bounds = " and ".join(str(extra) for extra in extras if isinstance(extra, Range))
        return f"{describe(base)} {bounds}".strip()
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(describe(member) for member in typing.get_args(annotation))
    if origin in (list, tuple, collections.abc.Sequence):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        return f"a list of {describe(args[0]) if args else 'values'}"
    if origin is collections.abc.Callable or annotation is Callable:
        return "a callable"
    names = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
    return names.get(annotation, f"a {getattr(annotation, '__name__', str(annotation))}")


def conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is of the annotated type (bounds included)."""
    origin = _origin(annotation)
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if annotation is type(None) or annotation is None:
        return value is None
    if origin is Annotated:
        base, *extras = typing.get_args(annotation)
        return conforms(value, base) and all(extra.holds(value) for extra in extras if isinstance(extra, Range))
    if origin is Literal:
        return any(value == choice and type(value) is type(choice) for choice in typing.get_args(annotation))
    if origin in (Union, types.UnionType):
        return any(conforms(value, member) for member in typing.get_args(annotation))
    if origin in (list, tuple, collections.abc.Sequence):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
            return False
        return not args or all(conforms(item, args[0]) for item in value)
    if origin is collections.abc.Callable or annotation is Callable:
        return callable(value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def option_types(fn: Callable) -> dict[str, Any]:
    """The keyword-only parameters of ``fn`` (its options) and their annotations (resolved, bounds kept)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params = inspect.signature(fn).parameters.values()
    return {p.name: hints.get(p.name, inspect.Parameter.empty)
            for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def option_defaults(fn: Callable) -> dict[str, Any]:
    """The keyword-only parameters of ``fn`` and their defaults."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _pixel_power(annotation: Any) -> int | None:
    """The power of the :class:`Pixels` mark of an annotation (also inside ``X | None``), None without one."""
    if _origin(annotation) is Annotated:
        return next((extra.power for extra in typing.get_args(annotation)[1:] if isinstance(extra, Pixels)), None)
    if _origin(annotation) in (Union, types.UnionType):
        return next(filter(None, map(_pixel_power, typing.get_args(annotation))), None)
    return None


def scale_pixels(fn: Callable, options: dict[str, Any], ratio: float) -> tuple[dict[str, Any], list[str]]:
    """``options`` (with ``fn``'s defaults for those not given) with every option that counts pixels (:class:`Pixels`)
    scaled by ``ratio`` (the images' side over the side they were written for), and the changes in words
    ("window 50 → 25").

    A length is multiplied by ``ratio``, an area by its square, rounded to the nearest integer (ties to the even one,
    Python's ``round``) and kept >= 1; a None stays None. Options that count no pixels are returned as given."""
    scaled, changes = dict(options), []
    defaults = option_defaults(fn)
    for name, annotation in option_types(fn).items():
        power = _pixel_power(annotation)
        value = options.get(name, defaults[name])
        if power is None or value is None:
            continue
        new = max(1, round(value * ratio ** power))
        if new != value:
            scaled[name] = new
            changes.append(f"{name} {value} → {new}")
    return scaled, changes


def seeded(defaults: dict[str, Any], options: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``options`` with ``seed`` as their ``seed`` when their owner has a seed option (its ``defaults`` name one) and
    they give none: the one rule by which a caller's seed (a bench's, ``evaluate``'s) reaches randomised methods and
    metrics. ``seed`` None leaves them as given."""
    if seed is None or "seed" not in defaults or "seed" in options:
        return dict(options)
    return {**options, "seed": seed}


def similar_names(name: object, candidates: collections.abc.Iterable[str], n: int = 5) -> list[str]:
    """The one ranking of "did you mean" suggestions (registries, model names): up to ``n`` of ``candidates``
    like ``name``, the most alike first. Candidates that begin with ``name`` come first (the shortest first: a
    name cut short), then difflib's closest (ratio 0.6 or more); case is ignored."""
    typed = str(name).lower()
    by_lower: dict[str, str] = {}
    for candidate in candidates:
        by_lower.setdefault(candidate.lower(), candidate)
    extending = sorted((key for key in by_lower if typed and key.startswith(typed)),
                       key=lambda key: (len(key), key))
    close = difflib.get_close_matches(typed, by_lower, n=n)
    return [by_lower[key] for key in dict.fromkeys(extending[:n] + close)][:n]


def _refuse_unknown(owner: str, types_: dict[str, Any], names) -> None:
    unknown = sorted(set(names) - set(types_))
    if unknown:
        valid = ", ".join(sorted(types_)) or "none"
        raise TypeError(f"{owner} has no option {', '.join(map(repr, unknown))}; its options are: {valid}")


def _refuse(owner: str, types_: dict[str, Any], options: dict[str, Any]) -> None:
    _refuse_unknown(owner, types_, options)
    for name, value in options.items():
        if not conforms(value, types_[name]):
            raise InvalidOption(f"option {name} of {owner} must be {describe(types_[name])}, got {value!r}")


def check_options(owner: str, fn: Callable, options: dict[str, Any]) -> None:
    """Refuse unknown option names (listing the valid ones) and values outside their annotated type.

    ``owner`` names what the options belong to in messages, e.g. ``"method 'tis'"``.
    """
    _refuse(owner, option_types(fn), options)


def checking(owner: str, fn: Callable) -> Callable:
    """``fn`` checking, on every call, the options it is given by keyword (:func:`check_options`), so that a call
    that bypasses the registry's door (``metric.compute(batch, **options)``) is refused as the door refuses it and
    ``fn`` itself checks none. Its signature, annotations and docstring stay ``fn``'s (``functools.wraps``); the
    annotations are read once, at the first call. ``fn`` already checking is returned as it is."""
    if getattr(fn, "__checked_options__", False):
        return fn
    types_: dict[str, Any] = {}
    positional: set[str] = set()

    @functools.wraps(fn)
    def checked(*args: Any, **keywords: Any) -> Any:
        if not types_ and not positional:
            types_.update(option_types(fn))
            positional.update(name for name in inspect.signature(fn).parameters if name not in types_)
        _refuse(owner, types_, {key: value for key, value in keywords.items() if key not in positional})
        return fn(*args, **keywords)

    checked.__checked_options__ = True  # type: ignore[attr-defined]
    return checked


def parse_option(owner: str, fn: Callable, text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` as (key, value), the value typed by the option's annotation.

    The value is read as YAML (``3``, ``0.5``, ``true``, ``[0.25, 0.5]``, ``null``); for options that
    take strings the text is kept as written. The result is checked by :func:`check_options`.
    """
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"an option is written KEY=VALUE, got {text!r}")
    types_ = option_types(fn)
    _refuse_unknown(owner, types_, [key])
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    if not conforms(value, types_[key]) and conforms(raw, types_[key]):
        value = raw
    check_options(owner, fn, {key: value})
    return key, value


def block_index(option: str, value: int, num_blocks: int) -> int:
    """A block index option (0-based, negative counts from the end) as 0 … num_blocks-1, checked against the model."""
    if not -num_blocks <= value < num_blocks:
        raise ValueError(f"{option} must index one of the model's {num_blocks} blocks "
                         f"(-{num_blocks} … {num_blocks - 1}), got {value}")
    return value % num_blocks
