"""Scoring explanation maps from Python: the registered protocols on maps from any source, with intervals.

:func:`evaluate` is the front door, shaped like Quantus's ``metric(model, x, y, a, s)``: a model, its
preprocessed images, the maps to score, the metric(s), and optionally the explained classes and the
ground truth. :func:`score` is the one call that runs a protocol on a batch; the bench scores through it
too, so a number from Python and the bench's stored per-image value are the same computation.
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .datasets.base import move, take
from .instrumentation import ModelAdapter, adapter_for
from .instrumentation.adapter import Call, evaluation_mode
from .instrumentation.modifying import modifier
from .instrumentation.precision import float32_scope
from .maps import check_finite
from .metrics import EvalBatch, Metric, SharedForwards, get_metric
from .metrics.base import BoundMetric, alternatives, describe_need
from .options import PositiveInt, check_options
from .registry import BoundMethod, get_method
from .uncertainty import CONFIDENCE, TOO_FEW, bootstrap, has_interval, interval

#: requirement names that are not ground truth: a class on every image, a method to run again, and the model to
#: change for a while (:attr:`EvalBatch.modified`)
NOT_TRUTH_REQUIREMENTS = {"labels": "a ground-truth class on every image (labels=)",
                          "explain": "the method, to explain the images again (method=)",
                          "model": "the model, to change its weights for a while and restore them (model=)",
                          "features": "the representation the model's classifier reads (model=)"}


def missing_requirements(metric: Metric, batch: EvalBatch) -> list[str | tuple[str, ...]]:
    """What of ``metric.requires`` the batch lacks: ground truth by name, labels, a method to re-run, or the model
    (an entry naming alternatives, such as the pointing game's ``("boxes", "masks")``, when it has none of them)."""
    provided = {"labels": bool((batch.labels >= 0).all()), "explain": batch.explain is not None,
                "model": batch.modified is not None, "features": batch.features is not None}
    return [need for need in metric.requires
            if not any(provided.get(name, batch.truth.get(name) is not None) for name in alternatives(need))]


def score(metric: Metric | str, batch: EvalBatch, options: Mapping[str, Any] | None = None,
          model: nn.Module | None = None, *, call: Call | None = None) -> dict[str, Tensor]:
    """Per-image values of ``metric`` on ``batch`` with ``options`` over its defaults: ``{key: [B] or [B, S]}``.

    A requirement the batch lacks is a one-line ValueError naming it; so are values of the wrong shape
    (a plug-in metric's). The metric's own arithmetic runs in float32: in the float32 scope of ``call`` (the
    :func:`scoring` call whose forwards the batch carries), else in one of its own (``model``'s low-precision weights
    seen in float32); the call's forwards (:attr:`EvalBatch.logits`) run in the caller's precision.
    """
    metric = get_metric(metric) if isinstance(metric, str) else metric
    missing = missing_requirements(metric, batch)
    if missing:
        named = ", ".join(describe_need(need, NOT_TRUTH_REQUIREMENTS) for need in missing)
        raise ValueError(f"metric {metric.name!r} needs {named}, which these images do not have")
    with float32_scope(model, None if call is None else call.scope):
        values = metric.compute(batch, **{**metric.options, **(options or {})})
    count = len(batch.ids)
    if not isinstance(values, dict) or not all(isinstance(v, Tensor) for v in values.values()):
        raise TypeError(f"metric {metric.name!r} must return a dict of per-image tensors, got {type(values).__name__}")
    for key, value in values.items():
        if value.ndim not in (1, 2) or value.shape[0] != count:
            raise ValueError(f"metric {metric.name!r} returned {key!r} of shape {tuple(value.shape)}; "
                             f"expected [{count}] or [{count}, steps]")
    return values


@contextlib.contextmanager
def scoring(adapter: ModelAdapter) -> Iterator[Call]:
    """Where the protocols score one batch whose images the caller checked (:meth:`ModelAdapter.check_inputs`):
    yields the call whose forwards the batch carries (:func:`model_fields`), which trusts what the protocols derive
    from those images (perturbed and imputed copies, noisy inputs to explain again) instead of checking them for
    finite values at every forward (a wait for the device each time); its :attr:`~Call.shared` forward
    (:class:`~vitexplain.metrics.SharedForwards`) forwards each distinct perturbed image once."""
    with adapter.call(reads_target=False) as call:
        call.shared = SharedForwards(call.logits)
        yield call


def model_fields(call: Call, explain: Callable[..., Tensor] | None, modify: Callable[..., Any] | None
                 ) -> dict[str, Any]:
    """An :class:`EvalBatch`'s fields that run the model, within the :func:`scoring` ``call``: its shared forward,
    its features and ``explain`` / ``modify`` (:class:`RepeatedExplanations`)."""
    return {"logits": call.shared, "features": call.features, **RepeatedExplanations(explain, modify).batch_fields()}


def reexplainer(adapter: ModelAdapter, method: BoundMethod) -> Callable[..., Tensor]:
    """``(images, targets, seed=None, copy=None) -> maps``: ``method`` with its options again
    (:attr:`EvalBatch.explain`); a given ``seed`` replaces a randomised method's own. ``copy=k`` (k ≥ 1) says the
    images are a stability protocol's k-th perturbed copy: a ``fresh_per_copy`` control (``random_baseline``) then
    draws with :func:`~vitexplain.seeding.derived_seed` (its seed, k), every other method ignores it."""
    from .api import explain
    from .seeding import derived_seed

    spec = method.spec
    own_seed = method.effective.get("seed")

    def again(images: Tensor, targets: Tensor, seed: int | None = None, copy: int | None = None) -> Tensor:
        changes = {"seed": seed} if seed is not None and spec.randomised else {}
        if copy and spec.fresh_per_copy:
            changes["seed"] = derived_seed(own_seed if seed is None else seed, copy)
        return explain(adapter, images, method, target=targets, **changes)

    return again


class RepeatedExplanations:
    """One batch's :attr:`EvalBatch.explain` and :attr:`EvalBatch.modified`, where an explanation asked for again
    (the same images, targets, seed and copy, on the unchanged model) is computed once: the stability protocols draw
    the same seeded copies (the three relative stabilities; max- and avg-sensitivity at one radius and seed) and would
    each explain them anew. While a protocol has the model changed (``modified``: randomised layers, shifted inputs)
    nothing is answered from or added to what is kept, which is released with the batch."""

    def __init__(self, explain: Callable[..., Tensor] | None, modify: Callable[..., Any] | None):
        self._explain, self._modify = explain, modify
        self._known: dict[tuple, Tensor] = {}
        self._changed = 0

    def explain(self, images: Tensor, targets: Tensor, seed: int | None = None, copy: int | None = None) -> Tensor:
        keywords = {name: value for name, value in (("seed", seed), ("copy", copy)) if value is not None}
        if self._changed:
            return self._explain(images, targets, **keywords)
        key = (_digest(images), _digest(targets), seed, copy)
        if key not in self._known:
            self._known[key] = self._explain(images, targets, **keywords)
        return self._known[key].clone()

    @contextlib.contextmanager
    def modified(self, change: Callable[[nn.Module], None]) -> Iterator[None]:
        self._changed += 1
        try:
            with self._modify(change):
                yield
        finally:
            self._changed -= 1

    def batch_fields(self) -> dict[str, Any]:
        """``explain`` and ``modified`` for an :class:`EvalBatch` (None where the caller has none)."""
        return {"explain": None if self._explain is None else self.explain,
                "modified": None if self._modify is None else self.modified}


def _digest(tensor: Tensor) -> tuple:
    """What a tensor holds, as a key: its dtype, shape and a hash of its bytes."""
    data = tensor.detach().contiguous().cpu()
    return str(data.dtype), tuple(data.shape), hashlib.blake2b(data.view(torch.uint8).numpy().tobytes()).digest()


@dataclass
class Scores:
    """One metric's result on a set of images.

    Attributes:
        metric: its registry name.
        values: per image (rows in the order given), each value the metric computes [N] or [N, steps].
        numbers: the reported numbers (the metric's reduction of every image's values).
        intervals: per reported number, its 95 % percentile-bootstrap interval over the images; (NaN, NaN) on fewer
            than :data:`~vitexplain.uncertainty.MIN_IMAGES` images (too few for an interval: printed as such).
        images: how many images the numbers rest on.
        higher_is_better: per reported number, its direction (absent: not ranked).
    """

    metric: str
    values: dict[str, Tensor]
    numbers: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    images: int
    higher_is_better: dict[str, bool]

    def __str__(self) -> str:
        arrows = {True: " ↑", False: " ↓"}
        lines = [f"{self.metric} ({self.images} images, {CONFIDENCE:.0%} bootstrap intervals)"]
        for key, value in self.numbers.items():
            low, high = self.intervals.get(key, (float("nan"), float("nan")))
            shown = f"[{low:.4g}, {high:.4g}]" if has_interval(self.images) else f"[{TOO_FEW}]"
            lines.append(f"  {key}{arrows.get(self.higher_is_better.get(key), '')}: {value:.4g} {shown}")
        return "\n".join(lines)


def evaluate(model: nn.Module, images: Tensor, maps: Tensor | np.ndarray, metric: str | Sequence[str],
             targets: int | Sequence[int] | Tensor | None = None, truth: Mapping[str, Any] | None = None, *,
             labels: Sequence[int] | Tensor | None = None, method: str | Callable[..., Tensor] | None = None,
             method_options: Mapping[str, Any] | None = None, mean: Sequence[float] | None = None,
             std: Sequence[float] | None = None, ids: Sequence[str] | None = None, batch_size: PositiveInt = 32,
             seed: int = 0, progress: bool = False, **options) -> Scores | dict[str, Scores]:
    """Score explanation maps with one metric (a :class:`Scores`) or several (a dict of them by name).

    Args:
        model: the model the maps explain (any ``nn.Module`` mapping images to class scores); the protocols
            that explain it again with changed weights (smooth / efficient MPRT, numerical stability) change it
            only within a block and restore it exactly (:attr:`EvalBatch.modified`).
        images: its preprocessed input images [N, 3, H, W].
        maps: the maps to score, one per image [N, h, w] (token grid or pixels), from vitexplain or elsewhere: a
            tensor or a numpy array, of any real dtype, scored in float32 (values float32 cannot hold are refused).
        metric: a registered metric name (``vitexplain methods --metrics`` lists them), or a list of distinct ones.
        targets: the class each map explains: None (the model's prediction), one int, or one per image.
        truth: the ground truth by name, one entry per image: ``masks`` [N, H, W] (bool, or 0 / 1) at the
            images' size, ``boxes`` (a list
            of [k, 4] pixel boxes), ``ignore``, ``second`` ... (:data:`vitexplain.metrics.base.TRUTH`); a
            metric that needs what is absent is a one-line error naming it.
        labels: ground-truth classes (-1: unknown), for the protocols that need them.
        method: for the protocols that explain the images again (max-sensitivity, class sensitivity): a
            registered method name (run with ``method_options``) or ``(images, targets) -> maps``.
        mean, std: the normalisation of ``images`` per channel (what a black pixel is), when known.
        ids: a name per image (default: its position), used in error messages.
        batch_size: images scored at once.
        seed: the metrics' seed (those that draw noise) and the bootstrap's.
        progress: show a progress bar over the batches.
        **options: the metric's options (for several metrics, each takes those it has; an option none of
            them has is an error).

    Returns:
        :class:`Scores`: per-image values, reported numbers and their intervals, the image count.

    Everything is checked here, before any metric runs, each problem one ValueError or TypeError naming it:
    shapes, dtypes and devices (no meta tensors), finite images and maps, masks of the images' size, targets and
    labels among the model's classes, a metric named once, ``batch_size`` a positive integer.

    Example::

        maps = vitexplain.explain(model, images, "gae")
        print(vitexplain.evaluate(model, images, maps, "insertion_deletion"))
    """
    names = [metric] if isinstance(metric, str) else list(metric)
    _refuse_repeated(names)
    metrics = _bound_metrics([get_metric(name) for name in names], options, seed)
    check_options("vitexplain.evaluate", evaluate, {"batch_size": batch_size, "seed": seed, "progress": progress})
    adapter = adapter_for(model)
    count = _count(images, maps)
    device = images.device
    ids = [str(i) for i in (range(count) if ids is None else ids)]
    if len(ids) != count:
        raise ValueError(f"ids has {len(ids)} entries for {count} images")
    maps = check_finite(_float32_maps(maps).to(device), ids)
    method = _bound_method(method, method_options)
    randomised = isinstance(method, BoundMethod) and method.spec.randomised   # picks model_randomisation's floor
    targets, classes = _targets(adapter, images, targets, ids, device)
    labels = _per_image("labels", labels, count, device, fill=-1)
    _among_classes("labels", labels, classes, ids, unknown=True)
    truth = move(_check_truth(truth or {}, count, tuple(images.shape[-2:])), device)
    parts: dict[str, list[dict[str, Tensor]]] = {name: [] for name in names}
    modify = modifier(adapter.model)
    for start in tqdm(range(0, count, batch_size), desc="evaluate", unit="batch", disable=not progress):
        rows = list(range(start, min(start + batch_size, count)))
        adapter.check_inputs(take(images, rows))
        with scoring(adapter) as call:
            batch = EvalBatch(images=take(images, rows), maps=take(maps, rows), targets=take(targets, rows),
                              labels=take(labels, rows), ids=take(ids, rows), truth=take(truth, rows), mean=mean,
                              std=std, randomised=randomised, **model_fields(call, _again(method, call), modify))
            for entry in metrics:
                values = score(entry.metric, batch, entry.options, call=call)
                parts[entry.name].append({key: value.detach().cpu() for key, value in values.items()})
    found = {entry.name: _scores(entry.metric, parts[entry.name], entry.options, count, seed) for entry in metrics}
    return found[names[0]] if isinstance(metric, str) else found


def _refuse_repeated(names: list[str]) -> None:
    """A metric named twice would score the images twice, its rows counted twice in the numbers and intervals."""
    if not names:
        raise ValueError("metric is an empty list: name at least one metric")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"metric {', '.join(map(repr, repeated))} is named more than once: name each metric once")


def _refuse_meta(name: str, value: Any) -> None:
    if isinstance(value, Tensor) and value.is_meta:
        raise ValueError(f"{name} are on the meta device, which holds shapes but no values: give them on a real "
                         "device (cpu, cuda ...)")


def _count(images: Tensor, maps: Tensor | np.ndarray) -> int:
    if not isinstance(images, Tensor) or images.ndim != 4:
        hint = " (torch.from_numpy converts an array)" if isinstance(images, np.ndarray) else ""
        raise ValueError(f"images must be a tensor [N, C, H, W], got {_shape(images)}{hint}")
    _refuse_meta("images", images)
    if not isinstance(maps, (Tensor, np.ndarray)):
        raise TypeError(f"maps must be a torch tensor or a numpy array [N, h, w], got {type(maps).__name__}")
    _refuse_meta("maps", maps)
    if maps.ndim != 3 or maps.shape[0] != images.shape[0]:
        raise ValueError(f"maps must be [N, h, w] with one map per image ({images.shape[0]}), got {_shape(maps)}")
    return images.shape[0]


def _float32_maps(maps: Tensor | np.ndarray) -> Tensor:
    """``maps`` (a tensor or a numpy array of real numbers) as a float32 tensor, where the metrics score them; values
    that float32 cannot hold (beyond ±3.4e38, or so small that they would become 0) are refused, never rounded to
    infinity or zero."""
    if isinstance(maps, np.ndarray):
        if maps.dtype.kind not in "biuf":
            raise TypeError(f"maps must hold real numbers, got a numpy array of dtype {maps.dtype}")
        exact = maps.dtype.kind == "f" and maps.dtype.itemsize <= 8
        maps = torch.from_numpy(np.ascontiguousarray(maps if exact else maps.astype(np.float64)))
    if maps.is_complex():
        raise TypeError(f"maps must hold real numbers, got dtype {maps.dtype}")
    converted = maps.float()
    if maps.is_floating_point() and maps.dtype != torch.float32:
        lost = (torch.isinf(converted) & torch.isfinite(maps)) | ((converted == 0) & (maps != 0))
        if lost.any():
            raise ValueError(f"maps hold values that float32, in which they are scored, cannot hold (|value| above "
                             f"3.4e38 or below 1.4e-45, e.g. {maps[lost][0].item():.3g}): rescale them")
    return converted


def _shape(value: Any) -> str:
    return f"shape {tuple(value.shape)}" if hasattr(value, "shape") else type(value).__name__


def _bound_metrics(metrics: list[Metric], options: dict[str, Any], seed: int) -> list[BoundMetric]:
    """Each metric bound to the options it has (an option none has is refused) and ``seed`` where it draws noise."""
    unknown = sorted(key for key in options if not any(key in entry.options for entry in metrics))
    if unknown:
        offered = ", ".join(sorted({key for entry in metrics for key in entry.options})) or "none"
        raise ValueError(f"no chosen metric has an option {', '.join(map(repr, unknown))} (their options: {offered})")
    return [entry.bind({key: value for key, value in options.items() if key in entry.options}, seed=seed)
            for entry in metrics]


def _bound_method(method: str | Callable[..., Tensor] | None, options: Mapping[str, Any] | None
                  ) -> BoundMethod | Callable[..., Tensor] | None:
    """``method`` bound to its ``options`` when named; a callable or None as it is (then it takes no options)."""
    if isinstance(method, str):
        return get_method(method).bind(options)
    if options:
        raise ValueError("method_options are for a registered method given by name")
    return method


def _again(method: BoundMethod | Callable[..., Tensor] | None, call: Call) -> Callable[..., Tensor] | None:
    """What :attr:`EvalBatch.explain` calls within the :func:`scoring` ``call``: the bound method explaining again,
    a callable of the user's, or nothing."""
    if method is None:
        return None
    if isinstance(method, BoundMethod):
        return reexplainer(call, method)
    return lambda images, targets, seed=None, copy=None: method(images, targets)


def _targets(adapter: ModelAdapter, images: Tensor, targets: Any, ids: list[str],
             device: torch.device) -> tuple[Tensor, int]:
    """The class each map explains [N] (checked to be one of the model's) and how many classes the model has, from
    one forward: of every image for their predictions (``targets`` None), else of the first."""
    count = len(ids)
    if targets is not None and not (isinstance(targets, int) and not isinstance(targets, bool)):
        targets = _per_image("targets", targets, count, device)
    # as ModelAdapter.target computes the prediction (float32, eval mode), the outputs kept for their width
    with adapter.call(images if targets is None else images[:1], reads_target=targets is None) as call, \
            torch.no_grad(), evaluation_mode(adapter.model):
        outputs = adapter.forward(call.inputs)
    classes = outputs.shape[-1]
    if targets is None:
        return outputs.argmax(-1).to(device), classes
    if isinstance(targets, int):
        _among_classes("targets", torch.tensor([targets]), classes)
        return torch.full((count,), targets, dtype=torch.long, device=device), classes
    _among_classes("targets", targets, classes, ids)
    return targets, classes


def _among_classes(name: str, values: Tensor, classes: int, ids: Sequence[str] | None = None,
                   unknown: bool = False) -> None:
    """Refuse ``values`` [N] (of the images ``ids``; one for all when None) that are not classes of the model (-1,
    unknown, allowed when ``unknown``)."""
    low = -1 if unknown else 0
    bad = ((values < low) | (values >= classes)).nonzero().flatten()
    if len(bad):
        first = int(bad[0])
        allowed = f"{'-1 (unknown) or ' if unknown else ''}0 to {classes - 1}"
        image = "" if ids is None else f" (image {ids[first]})"
        raise ValueError(f"{name} {int(values[first])}{image} is not a class of the model: it has "
                         f"{classes} classes, so {name} must be {allowed}")


def _per_image(name: str, values: Any, count: int, device: torch.device, fill: int | None = None) -> Tensor:
    if values is None:
        return torch.full((count,), fill, dtype=torch.long, device=device)
    _refuse_meta(name, values)
    try:
        values = torch.as_tensor(values, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be {count} integers, one per image, got {type(values).__name__}") from None
    if values.shape != (count,) or values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"{name} must be {count} integers, one per image, got {_shape(values)} of {values.dtype}")
    return values.long()


#: the ground truth given per pixel of the images [N, H, W] (at any depth: ``second``'s ``masks`` too)
PIXEL_TRUTH = ("masks", "ignore")


def _check_truth(truth: Mapping[str, Any], count: int, size: tuple[int, int] | None = None,
                 where: str = "truth") -> dict[str, Any]:
    """``truth`` as tensors and lists, every entry (of a nested mapping too) checked to hold one item per image, and
    those of :data:`PIXEL_TRUTH` to be bool (or 0 / 1) [N, H, W] at the images' ``size`` (never resized here)."""
    checked: dict[str, Any] = {}
    for key, value in truth.items():
        if isinstance(value, Mapping):
            checked[key] = _check_truth(value, count, size, f"{where}[{key!r}]")
            continue
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value)) if value.dtype.kind in "biuf" else value
        elif isinstance(value, tuple):
            value = list(value)
        _refuse_meta(f"{where}[{key!r}]", value)
        if value is not None and (not isinstance(value, (Tensor, list)) or len(value) != count):
            raise ValueError(f"{where}[{key!r}] must have one entry per image ({count}), got {_shape(value)}")
        if key in PIXEL_TRUTH and value is not None and size is not None:
            value = _pixel_truth(f"{where}[{key!r}]", value, count, size)
        checked[key] = value
    return checked


def _pixel_truth(name: str, value: Any, count: int, size: tuple[int, int]) -> Tensor:
    """A mask per image, bool [N, H, W] at the images' size: 0 / 1 numbers are taken as False / True, anything else
    (another size, other values) refused."""
    if not isinstance(value, Tensor) or value.shape != (count, *size):
        raise ValueError(f"{name} must be a tensor [N, H, W] = {[count, *size]} at the images' size, got "
                         f"{_shape(value)}: resize and crop the masks as the images were (nearest neighbour)")
    if value.dtype != torch.bool:
        if value.is_complex() or not ((value == 0) | (value == 1)).all():
            raise ValueError(f"{name} must be bool (or 0 / 1 numbers), got other values of dtype {value.dtype}")
        value = value == 1
    return value


def _scores(metric: Metric, parts: list[dict[str, Tensor]], options: dict[str, Any], count: int,
            seed: int) -> Scores:
    values = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
    report = metric.reporter(options)
    numbers = {key: float(value) for key, value in report(values).items()}
    replicates = bootstrap(values, report, seed) if has_interval(count) else {}
    intervals = {key: interval(replicates[key]) if key in replicates else (float("nan"), float("nan"))
                 for key in numbers}
    return Scores(metric.name, values, numbers, intervals, count,
                  {key: value for key, value in metric.higher_is_better.items() if key in numbers})
