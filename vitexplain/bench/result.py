"""What a benchmark found: per-image values reduced to the reported numbers with their uncertainty, and tables of
them."""
from __future__ import annotations

import math
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..registry import METHODS
from ..uncertainty import CONFIDENCE, MIN_IMAGES, RESAMPLES, TOO_FEW, Means, bootstrap, has_interval, interval
from .config import SANITY_LABEL, DatasetSpec
from .randomisation import VERDICT_RULE, summarise
from .ranks import Ranked, mean_ranks
from .tables import (
    Estimate,
    Lead,
    Table,
    cells_markdown,
    cells_text,
    ranks_cells,
    sanity_cells,
    score_markdown,
    score_text,
    summary_markdown,
    summary_text,
    trust_markdown,
    trust_text_lines,
)
from .uncertainty import Sample, leaders, paired_difference

#: what the reports say under LATEC's ranks
RANKS_NOTE = ("Each method's rank on every reported number of the kind (by its median over the images where the number "
              "is a mean of per-image values; ties share their mean rank), averaged over the numbers (their count in "
              "brackets in the header), as LATEC ranks (Klein et al., 2024); the interval is "
              "the 95 % bootstrap interval of the mean rank over resamples of the images. It mixes what the kind's "
              "numbers measure, which the summary above never does: read it beside the summary, not instead.")
#: what the reports say of a model no method has any score on, in place of its tables
NO_SCORES = "no scores: every method failed on every image (the errors below say why)"


@dataclass
class Share:
    """Per-image values of one (model, method, metric) for some images (one process's share)."""

    model: str
    method: str
    metric: str
    indices: list[int]
    values: dict[str, Tensor]


@dataclass
class Gallery:
    """A few images of one model with every method's map, for the overlays of report.html.

    Attributes:
        model: the model's name.
        ids: image ids.
        images: the images for display, [G, H, W, 3] in [0, 1] (preprocessing undone).
        labels: ground-truth class per image (-1 when unknown).
        predicted: the model's top-1 class per image, and ``probability`` its softmax probability.
        class_names: readable name of every class index.
        maps: method label -> its maps of the images [G, h, w] (None when they could not be made).
        top5: per image, the five most probable classes with their probabilities.
        grid: the model's patch grid (h, w), to read token-level maps by token.
    """

    model: str
    ids: list[str]
    images: Tensor
    labels: list[int]
    predicted: list[int]
    probability: list[float]
    class_names: list[str]
    maps: dict[str, Tensor | None]
    top5: list[list[tuple[int, float]]] = field(default_factory=list)
    grid: tuple[int, ...] | None = None


@dataclass
class BenchResult:
    """What a benchmark found.

    Attributes:
        dataset: the dataset's name.
        scores: model -> method -> metric label -> reported number -> value.
        intervals: the same keys -> [low, high], the number's 95 % bootstrap interval over the images
            (:mod:`vitexplain.bench.uncertainty`).
        images: model -> method -> metric label -> how many images the numbers are reduced from.
        curves: model -> metric label -> per-image value with steps -> method -> its mean over the images.
        axes: metric label -> per-image value with steps -> where its curves are drawn: ``x`` (the share of
            pixels each point removed, inserted or grouped), ``xlabel``, ``ylabel`` (:func:`curve_axes`).
        higher_is_better: metric label (in config order) -> reported number -> whether higher is better.
        leaders: model -> metric label -> reported number with a direction -> ``methods`` that lead it (one:
            better than every other method at 95 %, paired over the images; more: tied) and ``controls`` no
            leader is better than (:func:`vitexplain.bench.uncertainty.leaders`).
        errors: one entry per failed item: model, method, metric (None for loading/explaining), image ids, error;
            a protocol the dataset cannot serve is one entry for the whole run, refused before any work: model and
            method "", the ids ``#index`` of the images it would have scored.
        settings: what was run: target, seed, limit, the options (and own dataset, limit and group) of
            every method and metric, and the bootstrap's resamples and confidence.
        files: the report files written, by kind.
        sanity: model -> the model-randomisation check (:mod:`vitexplain.bench.randomisation`, reduced from the
            per-image values of its protocol ``model_randomisation``): ``levels``, ``images`` and per method
            ``correlation`` (mean per level), ``floor`` (mean) and its ``floor_kind``, ``excess`` (the last level's
            correlation less the floor, its interval: value, low, high) and ``flagged``.
        notes: the config's notes, shown at the top of the reports.
        seconds: wall time of the run that wrote the reports (a resumed run counts its own work only).
        timings: model -> method -> seconds this run spent on its ``maps``, on each metric label and on
            the ``sanity`` check (all processes added up).
        memory: model -> method -> the path its maps took this run between keeping the LRP rules' graphs
            (``kept``) and computing each block again (``recomputed``, the ``recompute`` switch) -> ``batches``
            (how many took it) and ``last`` (the last such decision, as
            :meth:`vitexplain.instrumentation.lrp.memory.Decision.describe` logs it); methods without the switch,
            or whose maps were all cached, are absent.
        trust: model -> metric label -> reported number with a direction -> how far it can be trusted on this
            model and data (:func:`metric_trust`, docs/decisions/metric-trust.md): ``best``, ``random`` (the best
            method against the random control), ``degraded`` (each method against its degraded copies) and
            ``rank_stability`` (the methods' order under resampling of the images); and ``noise_resilience`` when
            the run has a noisy copy of the model (:class:`~vitexplain.bench.config.ModelEntry` ``noise_of``): the
            copy's name, ``weight_noise`` and ``seed`` and :func:`noise_resilience`'s record.
        timeline: this run's timed phases on rank 0, in the order they ended: ``model``, ``method`` (both ""
            for the run's own ``reduce`` and ``reports``; the method "" for a model's ``gallery``), ``phase`` (as in
            ``timings``) and ``start`` / ``end``, seconds from the run's start (not in results.json, which is
            written during its last phase).
        galleries: images and maps for report.html's overlays (not in results.json).
        ranks: with the config's ``ranks``, LATEC's view: model -> kind of protocol -> each method's mean rank over
            the kind's numbers with its interval (:func:`vitexplain.bench.ranks.mean_ranks`).
    """

    dataset: str
    scores: dict[str, dict[str, dict[str, dict[str, float]]]]
    images: dict[str, dict[str, dict[str, int]]]
    curves: dict[str, dict[str, dict[str, dict[str, list[float]]]]]
    higher_is_better: dict[str, dict[str, bool]]
    errors: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = field(default_factory=dict)
    leaders: dict[str, dict[str, dict[str, dict[str, list[str]]]]] = field(default_factory=dict)
    axes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    sanity: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    memory: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    trust: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list, repr=False)
    galleries: list[Gallery] = field(default_factory=list, repr=False)
    ranks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def columns(self, model: str) -> list[tuple[str, str, str]]:
        """(metric label, number, header) of the model's table, metrics in config order."""
        pairs = []
        for label in self.higher_is_better:
            for per_metric in self.scores[model].values():
                pairs += [(label, number) for number in per_metric.get(label, {}) if (label, number) not in pairs]
        names = Counter(number for _, number in pairs)
        return [(label, number, number if names[number] == 1 else f"{label}/{number}") for label, number in pairs]

    @property
    def precision(self) -> str:
        """What the models ran in (``float32`` for results written before precisions existed)."""
        return self.settings.get("precision", "float32")

    @property
    def highlight(self) -> list[str]:
        """Labels of the methods the curves draw in colour (the config's ``highlight``)."""
        return list(self.settings.get("highlight", []))

    def controls(self, model: str) -> set[str]:
        """The model's rows whose method is a control (registered with ``control=True``)."""
        names = {label: entry.get("name") for label, entry in self.settings.get("methods", {}).items()}
        return {m for m in self.scores.get(model, {}) if names.get(m) in METHODS and METHODS.get(names[m]).control}

    def counts(self, model: str) -> dict[str, str]:
        """Per metric label, how many images its numbers come from ("20", or "18/20" when methods differ)."""
        counts = {}
        for label in self.higher_is_better:
            found = sorted({per_metric.get(label, 0) for per_metric in self.images.get(model, {}).values()})
            counts[label] = "/".join(map(str, found))
        return counts

    def table(self, model: str) -> Table:
        """The model's table: each number with its interval and image count, marked best or tied as
        :attr:`leaders` says (controls never are)."""
        columns = self.columns(model)
        better = [self.higher_is_better.get(label, {}).get(number) for label, number, _ in columns]
        methods = list(self.scores[model])
        values, marks = [], []
        for method in methods:
            row, row_marks = [], []
            for label, number, _ in columns:
                value = self.scores[model][method].get(label, {}).get(number)
                interval = self.intervals.get(model, {}).get(method, {}).get(label, {}).get(number)
                low, high = (math.nan, math.nan) if interval is None or isinstance(interval, str) else interval
                count = self.images.get(model, {}).get(method, {}).get(label, 0)
                row.append(None if value is None else Estimate(value, low, high, count))
                leading = self.leaders.get(model, {}).get(label, {}).get(number, {}).get("methods", [])
                row_marks.append("" if method not in leading else "best" if len(leading) == 1 else "tied")
            values.append(row)
            marks.append(row_marks)
        return Table(model, [label for label, _, _ in columns], [header for _, _, header in columns], better, methods,
                     values, marks, self.controls(model), [number for _, number, _ in columns], self.counts(model))

    def summary(self, model: str) -> list[Lead]:
        """Who leads each reported number with a direction, with the kind of protocol it belongs to."""
        counts = self.counts(model)
        found = []
        for label, directions in self.higher_is_better.items():
            group = self.settings.get("metrics", {}).get(label, {}).get("group", "other")
            for number, lead in self.leaders.get(model, {}).get(label, {}).items():
                found.append(Lead(group, label, number, directions[number], counts.get(label, "0"), lead["methods"],
                                  lead["controls"], self.trust.get(model, {}).get(label, {}).get(number)))
        return found

    def untrusted(self, model: str) -> list[Lead]:
        """The model's numbers that cannot tell the random control from the methods (their leaders not counted)."""
        return [lead for lead in self.summary(model) if not lead.counted]

    def chaotic(self, model: str) -> list[str]:
        """The model's methods (not controls) whose maps are chaotic at rounding level: a ``numerical_stability``
        metric's ``r_worst`` below its ``CHAOTIC_BELOW`` (empty when the run has no such metric)."""
        labels = [label for label, entry in self.settings.get("metrics", {}).items()
                  if entry.get("name") == "numerical_stability"]
        if not labels:
            return []
        try:
            from ..metrics.numerical_stability import CHAOTIC_BELOW
        except ImportError:
            return []
        controls = self.controls(model)
        return [method for method, per_metric in self.scores.get(model, {}).items() if method not in controls
                and any(per_metric.get(label, {}).get("r_worst", math.inf) < CHAOTIC_BELOW for label in labels)]

    def verdict_lines(self, model: str) -> list[str]:
        """Sentences under the model's summary: the numbers not counted, and the chaotic maps."""
        lines = []
        untrusted = self.untrusted(model)
        if untrusted:
            names = ", ".join(f"{lead.metric} {lead.number}" for lead in untrusted)
            lines.append("Not counted, as they cannot tell the random control from the methods on this model: "
                         f"{names}.")
        if self.chaotic(model):
            lines.append(f"Maps chaotic at rounding level: {', '.join(self.chaotic(model))}.")
        return lines

    def flagged(self, model: str) -> list[str]:
        """The model's methods flagged by the model-randomisation check."""
        return [m for m, found in self.sanity.get(model, {}).get("methods", {}).items() if found["flagged"]]

    def scored(self) -> list[str]:
        """The models with at least one score; on the others every method failed on every image (:attr:`errors`
        says why), and the reports show :data:`NO_SCORES` in place of their tables."""
        return [model for model in self.scores if self.columns(model)]

    def uncertainty_note(self) -> str:
        return (f"Every number: value [low, high] (images), the {CONFIDENCE:.0%} bootstrap interval over the images "
                f"({self.settings.get('bootstrap', {}).get('resamples', RESAMPLES)} resamples); on fewer than "
                f"{MIN_IMAGES} images none ({TOO_FEW}) and no best or tied. Best: better than "
                "every other method at that confidence, paired over the same images; tied: cannot be told apart from "
                "the best. Controls never lead. Trust, per number and model: does the best method beat the random "
                "control at that confidence (a number that cannot tell them apart is not counted), how many degraded "
                "copies of real maps their method beats, how stable the methods' order is over resamples of the "
                "images (docs/decisions/metric-trust.md).")

    def markdown(self) -> str:
        """Per model: who leads each kind of protocol, then the table in the papers' layout (methods as
        rows, reported numbers as columns); the randomisation check and the errors."""
        notes = [f"> {note}" for note in self.notes] + ([""] if self.notes else [])
        lines = [f"# Benchmark on {self.dataset}, {self.precision}", ""] + notes
        scored = self.scored()
        for model in self.scores:
            if model not in scored:
                lines += [f"**{model}**: {NO_SCORES}", ""]
        if scored:
            lines += ["## Who leads, per kind of protocol", "", self.uncertainty_note() + " Kinds are never mixed: "
                      "each rewards something else.", ""]
        for model in scored:
            lines += [f"### {model}", ""] + summary_markdown(self.summary(model))
            lines += [line for found in self.verdict_lines(model) for line in (found, "")]
            if self.flagged(model):
                lines += [f"Flagged by the model-randomisation check: {', '.join(self.flagged(model))}.", ""]
        for model in scored:
            lines += [f"## {model}", ""] + score_markdown(self.table(model))
            found = trust_markdown(self.summary(model))
            if found:
                lines += [f"### {model}: how far each number can be trusted", ""] + found
        for model, ranks in self.ranks.items():
            lines += [f"## {model}: LATEC's view, mean rank per kind of protocol (1 = best)", "", RANKS_NOTE, ""]
            lines += cells_markdown(*ranks_cells(ranks))
        for model, check in self.sanity.items():
            lines += [f"## {model}: model randomisation (Spearman correlation with the original maps)", ""]
            lines += cells_markdown(*sanity_cells(check))
            lines += [VERDICT_RULE.format(images=check["images"]), ""]
        if self.errors:
            lines += ["## Errors", "", "| model | method | metric | images | error |",
                      "| --- | --- | --- | ---: | --- |"]
            for (model, method, metric, message), count in self.grouped_errors().items():
                lines.append(f"| {model} | {method} | {metric} | {count} | {message.replace('|', '/')} |")
            lines.append("")
        return "\n".join(lines)

    def grouped_errors(self) -> Counter:
        """(model, method, metric or '–', message) -> number of images; a protocol the dataset cannot serve, refused
        once for the whole run (model and method ""), shows as "every model" / "every method"."""
        grouped = Counter()
        for error in self.errors:
            grouped[error["model"] or "every model", error["method"] or "every method", error["metric"] or "–",
                    error["error"]] += len(error["images"])
        return grouped

    def text(self, width: int = 100) -> str:
        """Everything for a terminal, no line wider than ``width``: per model who leads each kind of
        protocol, then its scores (one group of columns per protocol, best values marked ``*``, tied ones
        ``≈``), then the randomisation check, errors and seconds."""
        def say(text: str, indent: str = "") -> list[str]:
            return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    ",
                                 break_on_hyphens=False)

        took = f" ({self.seconds:.0f} s)" if self.seconds else ""
        lines = say(f"Benchmark on {self.dataset}, {self.precision}{took}") + [""]
        scored = self.scored()
        for model in self.scores:
            if model not in scored:
                lines += say(f"{model}: {NO_SCORES}") + [""]
        if scored:
            lines += say(self.uncertainty_note()) + [""]
        for model in scored:
            lines += say(f"{model}: who leads, per kind of protocol (never mixed)")
            lines += summary_text(self.summary(model), width)
            for found in self.verdict_lines(model):
                lines += say(f"{model}: {found}")
            if self.verdict_lines(model):
                lines += [""]
            if self.flagged(model):
                lines += say(f"{model}: flagged by the model-randomisation check: "
                             f"{', '.join(self.flagged(model))}") + [""]
            lines += say(f"{model}: scores (* best, ≈ tied; ↑/↓ higher/lower is better)")
            lines += score_text(self.table(model), width)
            detail = trust_text_lines(self.summary(model), width)
            if detail:
                lines += say(f"{model}: how far each number can be trusted") + detail
        for model, ranks in self.ranks.items():
            lines += say(f"{model}: LATEC's view, mean rank per kind of protocol (1 = best). {RANKS_NOTE}")
            lines += cells_text(*ranks_cells(ranks), width) + [""]
        for model, check in self.sanity.items():
            lines += say(f"{model}: model randomisation, Spearman correlation with the original maps")
            lines += cells_text(*sanity_cells(check), width)
            lines += say(VERDICT_RULE.format(images=check["images"])) + [""]
        if self.errors:
            lines += say("Errors (model / method / metric: images: error)")
            for (model, method, metric, message), count in self.grouped_errors().items():
                lines += say(f"{model} / {method} / {metric}: {count}: {message}", "  ")
        for model, per_method in self.timings.items():
            phases: dict[str, float] = {}
            for spent in per_method.values():
                for phase, value in spent.items():
                    phases[phase] = phases.get(phase, 0.0) + value
            if phases:
                detail = ", ".join(f"{phase} {value:.0f}" for phase, value in phases.items())
                lines += say(f"{model}: {sum(phases.values()):.0f} s of work ({detail})")
        return "\n".join(lines).rstrip()

    def to_dict(self) -> dict[str, Any]:
        """Everything but the galleries' pixels and the timeline, as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("galleries", "timeline")}


def curve_axes(metric, options: dict[str, Any], key: str, points: int) -> dict[str, Any]:
    """Where a metric's curve ``key`` of ``points`` points is drawn: ``x`` (the true shares, from the
    metric's :class:`~vitexplain.metrics.base.Curves`; step numbers 1 ... points for a metric without),
    ``xlabel`` and ``ylabel``."""
    if metric.curves is None:
        return {"x": [float(k) for k in range(1, points + 1)], "xlabel": "step", "ylabel": key}
    return {"x": [float(x) for x in metric.curves.x({**metric.options, **options}, points)],
            "xlabel": metric.curves.xlabel, "ylabel": metric.curves.ylabels.get(key, key)}


def describe_dataset(dataset: Any) -> dict[str, Any] | str:
    """A dataset spec as plain data (a Dataset object by its class name)."""
    return asdict(dataset) if isinstance(dataset, DatasetSpec) else type(dataset).__name__


def build_result(config, shares: list[Share], errors: list[dict[str, Any]], *, galleries: list[Gallery] | None = None,
                 sanity: dict[str, dict[str, Any]] | None = None, seconds: float = 0.0,
                 timings: dict[str, dict[str, dict[str, float]]] | None = None,
                 memory: dict[str, dict[str, dict[str, dict[str, Any]]]] | None = None,
                 notes: list[str] = ()) -> BenchResult:
    """Merge every process's shares in dataset order, reduce them with each metric's ``reduce``, bootstrap
    the reduction over the images (:mod:`vitexplain.bench.uncertainty`) and find who leads each number.

    ``sanity`` gives, per model the sanity check ran on, the names of its ``levels``; the check's section is
    reduced from the shares of its protocol entry (labelled :data:`~vitexplain.bench.config.SANITY_LABEL`)."""
    merged: dict[tuple[str, str, str], list[Share]] = {}
    for share in shares:
        merged.setdefault((share.model, share.method, share.metric), []).append(share)
    dataset = config.dataset.name if isinstance(config.dataset, DatasetSpec) else type(config.dataset).__name__
    metrics = {}
    for m in config.metrics:
        metrics[m.label] = {"name": m.name, "options": m.options, "limit": config.limit_of(m),
                            "dataset": describe_dataset(m.dataset or config.dataset), "group": m.bound.metric.group}
    settings = {"precision": config.precision, "target": config.target, "seed": config.seed, "limit": config.limit,
                "dataset": describe_dataset(config.dataset),
                "methods": {m.label: {"name": m.name, "options": m.options} for m in config.methods},
                "metrics": metrics, "sanity": None if config.sanity is None else asdict(config.sanity),
                "highlight": list(config.highlight),
                "bootstrap": {"resamples": RESAMPLES, "confidence": CONFIDENCE, "seed": config.seed}}
    ordered_errors = sorted(errors, key=lambda e: (e["model"], e["method"], e["metric"] or "", e["images"]))
    result = BenchResult(dataset, {}, {}, {}, {}, ordered_errors, settings,
                         sanity=_sanity_section(config, merged, sanity or {}),
                         notes=[*config.notes, *notes], seconds=seconds, timings=timings or {}, memory=memory or {},
                         galleries=galleries or [])
    for entry in config.metrics:
        result.higher_is_better[entry.label] = dict(entry.bound.metric.higher_is_better)
    kept: dict[tuple[str, str], dict[str, Sample]] = {}     # (model, metric label) -> its methods' samples
    for model in config.models:
        ranked: dict[str, list[Ranked]] = {}       # kind of protocol -> its numbers, for LATEC's view
        for entry in config.metrics:
            metric = entry.bound.metric
            report = metric.reporter(entry.options)
            samples = kept[model.name, entry.label] = {}
            for method in config.methods:
                parts = [part for part in merged[model.name, method.label, entry.label] if part.indices]
                count = sum(len(part.indices) for part in parts)
                result.images.setdefault(model.name, {}).setdefault(method.label, {})[entry.label] = count
                scores = result.scores.setdefault(model.name, {}).setdefault(method.label, {})
                if not count:
                    continue
                indices = sorted(i for part in parts for i in part.indices)
                order = torch.tensor([i for part in parts for i in part.indices]).argsort()
                values = {key: torch.cat([part.values[key] for part in parts])[order] for key in parts[0].values}
                try:
                    scores[entry.label] = {key: float(value) for key, value in report(values).items()}
                    # too few images for an interval: nothing reads resamples (no interval, no comparison, no rank's)
                    drawn = bootstrap(values, report, config.seed) if has_interval(count) else {}
                    samples[method.label] = Sample(indices, values, drawn)
                except Exception as error:  # noqa: BLE001 - one metric's reduction must not lose the other reports
                    scores.pop(entry.label, None)
                    result.errors.append({"model": model.name, "method": method.label, "metric": entry.label,
                                          "images": [], "error": f"reduce failed: {type(error).__name__}: {error}"})
                    continue
                result.intervals.setdefault(model.name, {}).setdefault(method.label, {})[entry.label] = {
                    key: list(interval(drawn[key])) if drawn else TOO_FEW for key in scores[entry.label]}
                for key, value in values.items():
                    if value.ndim == 2 and key not in metric.carried:
                        curves = result.curves.setdefault(model.name, {}).setdefault(entry.label, {})
                        curves.setdefault(key, {})[method.label] = value.double().mean(0).tolist()
                        axes = curve_axes(metric, entry.options, key, value.shape[1])
                        result.axes.setdefault(entry.label, {})[key] = axes
            for number, higher in result.higher_is_better[entry.label].items():
                found = {m: result.scores[model.name][m][entry.label][number] for m in samples
                         if number in result.scores[model.name][m][entry.label]}
                if found:
                    ranked.setdefault(metric.group, []).append(
                        Ranked(entry.label, number, higher, found, samples, per_image(metric, samples, number),
                               config.seed))
                    lead = leaders(samples, found, higher, result.controls(model.name), number, report, config.seed)
                    result.leaders.setdefault(model.name, {}).setdefault(entry.label, {})[number] = lead
                    if lead["methods"]:
                        result.trust.setdefault(model.name, {}).setdefault(entry.label, {})[number] = metric_trust(
                            samples, found, higher, lead["methods"][0], result.controls(model.name),
                            settings["methods"], number, report, config.seed)
        if config.ranks:
            controls = result.controls(model.name)
            result.ranks[model.name] = {group: mean_ranks(numbers, controls) for group, numbers in ranked.items()}
    for copy in config.models:
        if copy.noise_of is None:
            continue
        for entry in config.metrics:
            report = entry.bound.metric.reporter(entry.options)
            before, after = (result.scores.get(name, {}) for name in (copy.noise_of, copy.name))
            for number, trust in result.trust.get(copy.noise_of, {}).get(entry.label, {}).items():
                found = noise_resilience(
                    kept[copy.noise_of, entry.label], kept[copy.name, entry.label],
                    {m: per[entry.label][number] for m, per in before.items() if number in per.get(entry.label, {})},
                    {m: per[entry.label][number] for m, per in after.items() if number in per.get(entry.label, {})},
                    result.controls(copy.noise_of), number, report, config.seed)
                if found is not None:
                    trust["noise_resilience"] = {"copy": copy.name, "weight_noise": copy.weight_noise,
                                                 "seed": copy.seed, **found}
    return result


def _sanity_section(config, merged: dict[tuple[str, str, str], list[Share]],
                    levels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """:attr:`BenchResult.sanity`: per model with ``levels``, each checked method's :func:`summarise` of its
    protocol's values in dataset order; a model no method has values of is left out (no table)."""
    found = {}
    for model, known in levels.items():
        methods, images = {}, 0
        for method in config.methods:
            parts = [part for part in merged.get((model, method.label, SANITY_LABEL), []) if part.indices]
            if not parts:
                continue
            order = torch.tensor([i for part in parts for i in part.indices]).argsort()
            values = {key: torch.cat([part.values[key] for part in parts])[order] for key in parts[0].values}
            methods[method.label] = summarise(values, config.seed)
            images = max(images, len(order))
        if methods:
            found[model] = {"levels": list(known["levels"]), "images": images, "methods": methods}
    return found


def per_image(metric, samples: dict[str, Sample], number: str) -> dict[str, Tensor] | None:
    """Each method's per-image values of ``number`` where the metric reports it as their mean (LATEC ranks their
    median), else None."""
    if not isinstance(metric.reduce, Means):
        return None
    found = {method: metric.reduce.per_image(sample.values) for method, sample in samples.items()}
    return None if any(values is None for values in found.values()) else \
        {method: values[number] for method, values in found.items()}


#: the control a metric must tell the methods from (``random_baseline``'s registry name)
RANDOM_CONTROL = "random_baseline"
#: the control method that degrades another method's maps (``degraded``'s registry name)
DEGRADED_CONTROL = "degraded"


def _advantage(first: Sample, second: Sample, scores: dict[str, float], names: tuple[str, str], higher: bool,
               number: str, report, seed: int) -> tuple[list[float], bool]:
    """How much better ``names[0]`` is than ``names[1]`` on ``number`` (positive: better, in the number's units),
    with its paired 95 % interval, and whether that interval lies above 0."""
    low, high = paired_difference(first, second, number, report, seed)
    value = scores[names[0]] - scores[names[1]]
    if not higher:
        value, low, high = -value, -high, -low
    return [float(value), float(low), float(high)], bool(low > 0)


def _effective(name: str, options: dict[str, Any]) -> dict[str, Any]:
    return {**(METHODS.get(name).options if name in METHODS else {}), **options}


def degraded_copies(methods: dict[str, dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Per method row of a run (``settings["methods"]``: label -> name and options), the rows that are degraded
    copies of it: a ``degraded`` row whose ``of`` (default ``gae``) is that row's method with the same effective
    options (``degraded``'s ``options``), as (copy label, kind)."""
    copies: dict[str, list[tuple[str, str]]] = {}
    for label, entry in methods.items():
        if entry.get("name") != DEGRADED_CONTROL:
            continue
        options = _effective(DEGRADED_CONTROL, entry.get("options") or {})
        of, wanted = options.get("of"), _effective(str(options.get("of")), options.get("options") or {})
        for original, other in methods.items():
            if other.get("name") == of and _effective(of, other.get("options") or {}) == wanted:
                copies.setdefault(original, []).append((label, str(options.get("kind"))))
    return copies


def rank_stability(samples: dict[str, Sample], scores: dict[str, float], methods: list[str],
                   number: str) -> list[float] | None:
    """How stable the order of ``methods`` on ``number`` is when the images are resampled: the Spearman
    correlation of their values on each bootstrap resample with their values on all the images, as the median
    and the central 95 % of the resamples ([median, low, high]); None with fewer than 3 methods on the same
    images (only those are resampled at the same positions, so only their orders are comparable)."""
    from scipy.stats import rankdata

    sets = Counter(tuple(samples[m].indices) for m in methods)
    if not sets:
        return None
    common = sets.most_common(1)[0][0]
    ranked = [m for m in methods if tuple(samples[m].indices) == common and number in samples[m].replicates]
    if len(ranked) < 3:
        return None
    full = np.array([scores[m] for m in ranked], dtype=float)
    replicates = np.stack([samples[m].replicates[number] for m in ranked]).astype(float)   # [methods, resamples]
    keep = np.isfinite(replicates).all(0)
    if not keep.any() or np.ptp(full) == 0:
        return None
    ranks = rankdata(replicates[:, keep], axis=0)
    centred = ranks - ranks.mean(0)
    reference = rankdata(full) - rankdata(full).mean()
    norms = np.sqrt((centred ** 2).sum(0) * (reference ** 2).sum())
    rho = np.where(norms > 0, (centred * reference[:, None]).sum(0) / np.where(norms > 0, norms, 1), 0.0)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(rho, [tail, 100 - tail])
    return [float(np.median(rho)), float(low), float(high)]


def spearman(first: list[float], second: list[float]) -> float | None:
    """The Spearman correlation of two lists of values (average ranks for ties); None when ``first`` has no
    order (all equal), 0 when only ``second`` has none."""
    from scipy.stats import rankdata

    x, y = (rankdata(np.asarray(values, dtype=float)) for values in (first, second))
    x, y = x - x.mean(), y - y.mean()
    if not (x ** 2).sum():
        return None
    norm = math.sqrt((x ** 2).sum() * (y ** 2).sum())
    return float((x * y).sum() / norm) if norm else 0.0


def noise_resilience(original: dict[str, Sample], copy: dict[str, Sample], before: dict[str, float],
                     after: dict[str, float], controls: set[str], number: str, report,
                     seed: int) -> dict[str, Any] | None:
    """Does ``number`` keep its scores and its ranking of the methods when the model is replaced by its copy
    under minor weight noise (MetaQuantus's noise resilience; docs/decisions/metric-trust.md)?

    ``original``, ``copy``: each model's samples of the methods; ``before``, ``after``: their values of
    ``number``. Only methods that are not controls and have a finite value on the same images in both take part.
    ``methods``: per method, ``difference`` copy − original [value, low, high] with the paired 95 % interval over
    the images (the bench's bootstrap, as for best / tied) and ``resilient``: the interval holds 0 (MetaQuantus's
    intra-consistency: the two score distributions cannot be told apart). ``unchanged`` / ``of``: how many are
    resilient, of how many. ``ranking``: the Spearman correlation of the methods' values before and after
    (inter-consistency; None below 2 methods or when they all have the same value before). ``spread``: the
    largest less the smallest method value before, to weigh a difference against. None when no method takes
    part.
    """
    methods = [m for m in before if m not in controls and m in after and m in original and m in copy
               and original[m].indices == copy[m].indices and np.isfinite(before[m]) and np.isfinite(after[m])]
    if not methods:
        return None
    rows = []
    for method in methods:
        low, high = paired_difference(copy[method], original[method], number, report, seed)
        rows.append({"method": method, "difference": [float(after[method] - before[method]), low, high],
                     "resilient": bool(low <= 0 <= high)})
    values = [before[m] for m in methods]
    return {"methods": rows, "unchanged": sum(row["resilient"] for row in rows), "of": len(rows),
            "ranking": spearman(values, [after[m] for m in methods]) if len(methods) >= 2 else None,
            "spread": float(max(values) - min(values))}


def metric_trust(samples: dict[str, Sample], scores: dict[str, float], higher: bool, best: str, controls: set[str],
                 methods: dict[str, dict[str, Any]], number: str, report, seed: int) -> dict[str, Any]:
    """How far one reported number can be trusted on one model's images (docs/decisions/metric-trust.md).

    ``best``: the best-valued method that is not a control (the leader). ``random``: its advantage over the
    random control (``random_baseline``; the first such row), paired over the images, and whether its 95 %
    interval lies above 0 (``separates``); None when the run has no random control with a value.
    ``degraded``: for every method of the run with degraded copies (:func:`degraded_copies`), its advantage over
    each copy and whether it ``beats`` it at 95 %. ``rank_stability``: :func:`rank_stability` of the methods that
    are not controls. Every advantage is [value, low, high], positive = better in the number's direction.
    """
    found = {m for m, v in scores.items() if m in samples and np.isfinite(v)}
    random = next((m for m in methods if methods[m].get("name") == RANDOM_CONTROL and m in found), None)
    trust: dict[str, Any] = {"best": best, "random": None, "degraded": []}
    if random is not None:
        advantage, separates = _advantage(samples[best], samples[random], scores, (best, random), higher, number,
                                          report, seed)
        trust["random"] = {"control": random, "advantage": advantage, "separates": separates}
    for original, copies in degraded_copies(methods).items():
        for copy, kind in copies:
            if original in found and copy in found:
                advantage, beats = _advantage(samples[original], samples[copy], scores, (original, copy), higher,
                                              number, report, seed)
                trust["degraded"].append({"method": original, "copy": copy, "kind": kind, "advantage": advantage,
                                          "beats": beats})
    trust["rank_stability"] = rank_stability(samples, scores, [m for m in found if m not in controls],
                                             number)
    return trust
