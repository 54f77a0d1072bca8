"""What every evaluation protocol receives and returns, and the registry that names them.

A protocol never sees the model object: the batch carries the model's forward (``logits``), the
method under test (``explain``), as Captum's metrics take ``forward_func`` and ``explanation_func``, and a
way to change the model for the length of a block (``modified``: randomised layers, rounded weights).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

from torch import Tensor, nn

from ..maps import check_finite
from ..options import check_options, checking, option_defaults, seeded
from ..registry import Registry, checked_reference, registering

#: the ground truth the built-in protocols read, by the name a dataset gives it in
#: :attr:`EvalBatch.truth` (and declares in its ``provides``); a plug-in may add names of its own
TRUTH = {
    "masks": "foreground masks [B, H, W] (bool)",
    "boxes": "per image, boxes [k, 4] (x0, y0, x1, y1) in pixels of the preprocessed image",
    "ignore": "pixels no protocol should count [B, H, W] (bool), e.g. VOC's void borders",
    "second": "on two-object images, the other object: {'targets': [B], 'masks': [B, H, W], 'boxes': list}",
    "word_index": "for text, the 1-based number of the word each token belongs to [B, T] (0: special / padding)",
    "rationale_spans": "for text, per review the annotated rationales as word spans [k, 2], [start, end)",
}


@dataclass
class EvalBatch:
    """One batch of explained images, with whatever ground truth the dataset has.

    Attributes:
        images: preprocessed images [B, 3, H, W] on the model's device.
        maps: raw explanation maps for ``targets`` [B, h, w].
        targets: class each map explains [B].
        labels: ground-truth class [B] (-1 where unknown).
        explain: re-runs the same method with the same options: (images, targets) -> maps; called as
            (images, targets, seed=s), a randomised method runs with seed s instead of its own (a
            deterministic method ignores it); called as (images, targets, copy=k), the images are the k-th
            perturbed copy (k ≥ 1) that a stability protocol compares with :attr:`maps`, and a control unrelated to
            its image (``random_baseline``, registered ``fresh_per_copy``) draws afresh for each k, every other
            method ignores it (a protocol passes ``copy`` through :func:`._common.explain_copy`, which leaves it
            out for a callable that does not take it). None when the maps came from elsewhere: a protocol that
            re-explains then refuses the batch.
        logits: the model's forward: images -> logits [B, classes], batched, in eval mode, without
            gradients (the bench passes its adapter's :meth:`~vitexplain.instrumentation.ModelAdapter.logits`).
        ids: an identifier per image (file name or dataset index).
        truth: the ground truth, by name, as the dataset fills it (see :data:`TRUTH` for the names the
            built-in protocols read); a protocol names what it needs in :attr:`Metric.requires`.
        mean, std: per channel, the normalisation the images were preprocessed with (what a black
            pixel is in the preprocessed space), or None when unknown.
        modified: ``change -> context manager``: within ``with batch.modified(change):`` the model has
            ``change(model)`` applied in place (its weights, buffers), so :attr:`explain` and :attr:`logits`
            run the changed model; on exit, also after an exception, everything (parameters and buffers with
            their values, dtype and ``requires_grad``, hooks, train / eval) is as it was
            (:func:`vitexplain.instrumentation.modifying.modified`). ``change`` gets the model object; the
            protocol itself never holds it. None when no model is at hand: a protocol that requires
            ``"model"`` then refuses the batch.
        features: images -> the representation the model's classifier reads [B, D] (float32, eval mode, no gradients:
            :meth:`~vitexplain.instrumentation.ModelAdapter.features`), for a protocol that compares representations
            (relative representation stability); None when not at hand: a protocol that requires ``"features"`` then
            refuses the batch.
        randomised: whether :attr:`explain` draws random numbers, so that another ``seed`` gives another map (the
            method's :attr:`~vitexplain.registry.MethodSpec.randomised`); False when unknown (a callable, maps from
            elsewhere). The model-randomisation protocol picks its noise floor by it.
    """

    images: Tensor
    maps: Tensor
    targets: Tensor
    labels: Tensor
    explain: Callable[[Tensor, Tensor], Tensor] | None
    logits: Callable[[Tensor], Tensor]
    ids: list[str]
    truth: Mapping[str, Any] = field(default_factory=dict)
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    modified: Callable[[Callable[[nn.Module], None]], ContextManager[None]] | None = None
    features: Callable[[Tensor], Tensor] | None = None
    randomised: bool = False

    def __post_init__(self) -> None:
        check_finite(self.maps, self.ids)


#: the kinds of protocol, each with what it rewards (one line, shown beside its leaders in the reports); a
#: bench summarises each kind on its own, as their numbers measure different things
GROUPS = {
    "faithfulness": "maps whose top-ranked pixels the model's score depends on: removing them first lowers it most, "
                    "keeping them keeps it",
    "localisation": "maps that agree with the annotated object (masks, boxes, rationales), whether or not the model "
                    "used it",
    "robustness": "maps that change little when the image changes a little (a map that never changes wins; the "
                  "random control is drawn afresh for every perturbed copy, the least stable map there is)",
    "randomisation": "maps that change when the model's weights are randomised (a map that does not depend on the "
                     "model fails)",
    "complexity": "peaky maps, relevance on few pixels (a faithful map of a large object can score low)",
    "class sensitivity": "maps that follow the class asked for: "
                         "on two-object images, each class's map on its own object",
    "other": "protocols registered without a group",
}


@dataclass(frozen=True)
class Curves:
    """What a metric's per-image curves ([B, S] values) plot, so the reports draw them at the true x.

    ``x(options, points)`` gives, for the effective options, the x of each of the ``points`` (a share of
    the pixels removed, inserted or grouped: the steps the metric really took, not ``linspace(0, 1)``);
    ``xlabel`` says what x is, ``ylabels`` per value key what is plotted.
    """

    x: Callable[[dict[str, Any], int], list[float]]
    xlabel: str
    ylabels: dict[str, str]


def even_steps(first: int, points: int, steps: int) -> list[float]:
    """``k / steps`` for k = first ... first + points - 1: the shares of evenly spaced steps."""
    return [k / steps for k in range(first, first + points)]


def alternatives(need: str | tuple[str, ...]) -> tuple[str, ...]:
    """The names any one of which meets an entry of :attr:`Metric.requires`: ``"masks"`` -> ``("masks",)``,
    ``("boxes", "masks")`` -> itself."""
    return (need,) if isinstance(need, str) else tuple(need)


def describe_need(need: str | tuple[str, ...], names: Mapping[str, str] | None = None) -> str:
    """An entry of :attr:`Metric.requires` in words: its names (through ``names`` where it has one) joined by "or"."""
    return " or ".join((names or {}).get(name, name) for name in alternatives(need))


@dataclass(frozen=True)
class Metric:
    """A registered evaluation protocol.

    Attributes:
        name: registry name, e.g. ``"insertion_deletion"``.
        compute: ``(batch, **options) -> dict[str, Tensor]`` of per-image values ([B] or [B, S]); its
            keyword-only parameters are the metric's options, checked against their annotations on every call
            (:func:`~vitexplain.options.checking`), so the function registered checks none by hand.
        reduce: per-image values of the whole dataset (concatenated) -> reported numbers; it may take
            some of the options as keywords (segmentation's ``threshold``), see :meth:`report`.
        requires: what the images must come with: names of :attr:`EvalBatch.truth` (see :data:`TRUTH`),
            ``"labels"`` for a ground-truth class on every image, ``"explain"`` for a protocol that runs the
            method again (:attr:`EvalBatch.explain`), ``"model"`` for one that changes the model for a while
            (:attr:`EvalBatch.modified`; with ``"explain"``, to explain the changed model), ``"features"`` for one that
            reads the model's representation (:attr:`EvalBatch.features`). An entry that is a
            tuple of names is met by any one of them: the pointing game's ``("boxes", "masks")`` (see
            :func:`alternatives`, :func:`describe_need`).
        higher_is_better: for every reported number, whether higher is better (drives the arrows and
            the bold best value of the tables).
        cost: model passes per image given the effective options and the explanation method's own passes
            per image (a metric that re-explains, such as max-sensitivity, pays the method again), for
            planning (``vitexplain reproduce --list``).
        group: what kind of protocol it is, a key of :data:`GROUPS` (the reports compare methods within
            a group, never across).
        curves: what its per-image curves plot (:class:`Curves`; None: it has none, or the reports draw
            them over their step numbers).
        carried: per-image values that only ``reduce`` reads and that are neither numbers nor curves (sufficiency
            carries each image's map, to compare it with the other images' maps); the reports never draw them.
        reference: the other implementations of the protocol, names of :data:`vitexplain.registry.REFERENCES`
            (``("latec", "quantus")``); empty: none of them has it.
        departures: where this implementation departs from those (their settings, their arithmetic), in one to three
            plain sentences, shown in the catalogue (docs/catalogue/protocols.md); required with ``reference``.
    """

    name: str
    compute: Callable[..., dict[str, Tensor]]
    reduce: Callable[[dict[str, Tensor]], dict[str, float]]
    requires: tuple[str | tuple[str, ...], ...] = ()
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    cost: Callable[[dict[str, Any], float], float] = lambda options, method_passes: 0.0
    group: str = "other"
    curves: Curves | None = None
    carried: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    departures: str = ""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"metric {self.name!r}: group must be one of {', '.join(GROUPS)}, got {self.group!r}")
        reference = checked_reference(f"metric {self.name!r}", self.reference, self.departures)
        object.__setattr__(self, "reference", reference)
        object.__setattr__(self, "departures", " ".join(self.departures.split()))
        needs = (self.requires,) if isinstance(self.requires, str) else tuple(self.requires)
        needs = tuple(need if isinstance(need, str) else tuple(need) for need in needs)
        if not all(isinstance(need, str) or (need and all(isinstance(name, str) for name in need)) for need in needs):
            raise ValueError(f"metric {self.name!r}: requires must list names, or tuples of names any one of which "
                             f"will do, e.g. ('labels', ('boxes', 'masks')); got {self.requires!r}")
        object.__setattr__(self, "requires", needs)
        # the one place a metric's options are checked, whichever way it is called: evaluate and the bench check
        # them at their door (check_options), a direct compute(batch, **options) here; no module checks its own
        object.__setattr__(self, "compute", checking(f"metric {self.name!r}", self.compute))

    @property
    def options(self) -> dict[str, Any]:
        """Option names and their defaults: the keyword-only parameters of ``compute``."""
        return option_defaults(self.compute)

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse unknown options (listing the valid ones) and values outside their annotated type."""
        check_options(f"metric {self.name!r}", self.compute, options)

    def report(self, values: dict[str, Tensor], options: dict[str, Any] | None = None) -> dict[str, float]:
        """The reported numbers of ``values``: ``reduce`` given those of the metric's options (defaults
        updated with ``options``) that it takes as keywords; the others only concern ``compute``."""
        return self.reporter(options)(values)

    def reporter(self, options: dict[str, Any] | None = None) -> Callable[[dict[str, Tensor]], dict[str, float]]:
        """:meth:`report` with ``options`` resolved once, for a bootstrap that reduces a thousand resamples; ``options``
        are checked as :meth:`check_options` checks them (``reduce`` checks none by hand)."""
        self.check_options(dict(options or {}))
        accepted = inspect.signature(self.reduce).parameters
        chosen = {key: value for key, value in {**self.options, **(options or {})}.items() if key in accepted}
        return functools.partial(self.reduce, **chosen)

    def passes(self, options: dict[str, Any], method_passes: float) -> float:
        """Model passes per image with ``options`` over the defaults (see :attr:`cost`)."""
        return self.cost({**self.options, **options}, method_passes)

    def bind(self, options: dict[str, Any] | None = None, *, seed: int | None = None,
             label: str | None = None) -> BoundMetric:
        """This protocol with ``options`` (checked here, once) over its defaults and, when it draws noise and they
        give no seed, ``seed`` (:func:`~vitexplain.options.seeded`): what the callers after the door carry."""
        given = dict(options or {})
        self.check_options(given)
        return BoundMetric(self, {**self.options, **seeded(self.options, given, seed)}, label or self.name)


@dataclass(frozen=True, eq=False)
class BoundMetric:
    """A protocol resolved where a user named it (``evaluate``, a bench config) with its effective options
    (:meth:`Metric.bind`): scoring, cache keys, results and reports carry it, never the name again.

    Attributes:
        metric: the registered protocol.
        options: every option it computes with (its defaults filled in), checked.
        label: how tables and reports name it (a bench entry's label; else the protocol's name).
    """

    metric: Metric
    options: dict[str, Any]
    label: str

    @property
    def name(self) -> str:
        return self.metric.name


METRICS: Registry[Metric] = Registry("metric", "vitexplain.metrics")


def register_metric(name: str | Callable[..., dict[str, Tensor]] | Metric | None = None, /, **metadata: Any) -> Any:
    """Decorator that registers an evaluation protocol: the decorated function is its ``compute``, ``metadata`` its
    other :class:`Metric` fields (``reduce`` is required; ``requires``, ``higher_is_better``, ``cost``, ``group``,
    ``curves``, ``reference`` and ``departures``), its name the function's unless ``name`` is given:
    ``@register_metric("aopc", reduce=...)``.

    A :class:`Metric` built beforehand, ``register_metric(Metric(...))`` (the shape plug-ins were written in),
    is registered as it is and returned.
    """
    if isinstance(name, Metric):
        return METRICS.add(name.name, name)
    return registering(lambda key, compute: METRICS.add(key, Metric(key, compute, **metadata)), name)


def available_metrics() -> list[str]:
    return METRICS.names()


def get_metric(name: str) -> Metric:
    return METRICS.get(name)

