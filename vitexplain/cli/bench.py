"""``vitexplain bench``: methods x metrics x dataset x models, from a YAML config and/or flags.

Without --config and without --method / --metric / --dataset it runs the default benchmark,
``vitexplain/bench/default_digits.yaml`` (every method, every digits protocol, the shipped ViT); other
flags (--model, --limit, -o, --device ...) still override its keys, so ``--model digits_vit --model
digits_deit`` runs it on both shipped models. Run it again with the same arguments
to resume after an interruption; to share the images among N processes (one per GPU) run
``torchrun --nproc_per_node=N -m vitexplain.cli.main bench ...``.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import warnings
from typing import Any

from .shared import add_model_arguments, add_precision_option, output_folder, positive_int


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark explanation methods with evaluation metrics (resumable, torchrun-aware)",
        description="Flags override the keys of --config (default: the digits benchmark shipped with vitexplain, "
                    "when no --method/--metric/--dataset is given either; --model then replaces its models). "
                    "Results: OUTPUT/report.html, OUTPUT/results.{json,csv,md}, OUTPUT/plots/.")
    parser.add_argument("--config", help="YAML file with the keys of vitexplain.bench.BenchConfig, or the name of a "
                                          "config shipped with vitexplain (e.g. latec: LATEC's methods and protocols)")
    add_model_arguments(parser, repeatable=True)
    parser.add_argument("--method", action="append", help="explanation method (repeatable)")
    parser.add_argument("--method-option", action="append", default=[], metavar="METHOD.KEY=VALUE",
                        help="an option of one method, the value read as YAML (repeatable)")
    parser.add_argument("--highlight", action="append", metavar="LABEL",
                        help="a method drawn in colour in the report's curves, the others grey (repeatable)")
    parser.add_argument("--metric", action="append", help="evaluation metric (repeatable)")
    parser.add_argument("--metric-option", action="append", default=[], metavar="METRIC.KEY=VALUE",
                        help="an option of one metric, the value read as YAML (repeatable)")
    parser.add_argument("--dataset", help="dataset name (see vitexplain.datasets)")
    parser.add_argument("--data-root", help="folder the dataset is read from")
    parser.add_argument("--dataset-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a dataset option, the value read as YAML (repeatable)")
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("-o", "--output", dest="output_dir", help="output folder (default: vitexplain-bench)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_precision_option(parser)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--limit", type=positive_int, help="benchmark a random subset of this many images")
    parser.add_argument("--target", choices=("predicted", "label"), help="class explained (default: predicted)")
    parser.add_argument("--num-workers", type=int)
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--force", action="store_true", default=None,
                        help="write into an output folder vitexplain did not make even when it holds files the bench "
                             "writes (results.json, report.html ...): they are replaced (without it: refused)")
    parser.add_argument("--ranks", action="store_true", default=None,
                        help="add LATEC's view to the reports: each method's mean rank per kind of protocol, with its "
                             "bootstrap interval")
    parser.set_defaults(func=run)


def _assignment(text: str, dotted: bool) -> tuple[str | None, str, Any]:
    """``[OWNER.]KEY=VALUE`` -> (owner, key, YAML-parsed value)."""
    import yaml

    name, equals, value = text.partition("=")
    owner, dot, key = name.partition(".") if dotted else (None, "", name)
    if not equals or not key or (dotted and not dot):
        form = "NAME.KEY=VALUE" if dotted else "KEY=VALUE"
        raise ValueError(f"expected {form}, got {text!r}")
    try:
        return owner, key, yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise ValueError(f"cannot read the value of {text!r} as YAML: {str(error).splitlines()[0]}") from None


def _with_options(entries: list, assignments: list[str], what: str, excluded: list[str] | str) -> list[dict[str, Any]]:
    """Entries as dicts with ``--<what>-option`` values merged in (matched by label or name). ``all`` stays as it is
    (the config expands it); an option for a name only ``all`` reaches (not one of ``excluded``) names that entry on
    its own, last, so that it runs with the option."""
    excluded = [excluded] if isinstance(excluded, str) else list(excluded)     # a YAML file may give one name
    entries = [entry if entry == "all" else {"name": entry} if isinstance(entry, str) else dict(entry)
               for entry in entries]
    for text in assignments:
        owner, key, value = _assignment(text, dotted=True)
        matching = [entry for entry in entries if entry != "all" and owner in (entry.get("label"), entry["name"])]
        if not matching and "all" in entries and owner not in excluded:
            matching = [{"name": owner, "label": owner}]   # an unknown name is refused by the config, as in a file
            entries.append(matching[0])
        if not matching:
            why = f" (the config's exclude_{what}s leaves it out)" if owner in excluded else ""
            raise ValueError(f"--{what}-option {text!r} names no {what} of this run{why}")
        for entry in matching:
            entry["options"] = {**entry.get("options", {}), key: value}
    return entries


def config_from_args(args: argparse.Namespace):
    """The :class:`~vitexplain.bench.BenchConfig` that ``--config`` and the flags describe."""
    from ..bench import DEFAULT_CONFIG, BenchConfig
    from ..bench.config import read_config

    data: dict[str, Any] = {}
    content_flags = (args.method, args.metric, args.dataset, args.data_root, args.dataset_option)
    path = args.config or (None if any(content_flags) else DEFAULT_CONFIG)
    if path:
        data = read_config(path)
    if args.model:
        data["models"] = [{"name": name, "arch": args.arch} for name in args.model]
    for key in ("method", "metric"):
        if getattr(args, key):
            data[f"{key}s"] = list(getattr(args, key))
        data[f"{key}s"] = _with_options(data.get(f"{key}s", []), getattr(args, f"{key}_option"), key,
                                        data.get(f"exclude_{key}s", []))
    if args.highlight:
        data["highlight"] = list(args.highlight)
    elif args.method and data.get("highlight"):     # --method replaced the config's methods: keep what is still run
        given = data["highlight"]
        data["highlight"] = [label for label in ([given] if isinstance(given, str) else given) if label in args.method]
    if args.dataset or args.data_root or args.dataset_option:
        dataset = data.get("dataset") or {}
        dataset = {"name": dataset} if isinstance(dataset, str) else dict(dataset)
        if args.dataset:
            dataset["name"] = args.dataset
        if args.data_root:
            dataset["root"] = args.data_root
        for text in args.dataset_option:
            _, key, value = _assignment(text, dotted=False)
            dataset["options"] = {**dataset.get("options", {}), key: value}
        data["dataset"] = dataset
    for key in ("batch_size", "output_dir", "device", "precision", "seed", "limit", "target", "num_workers",
                "progress", "force", "ranks"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    return BenchConfig.from_dict(data)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _refused(error: Exception) -> int:
    """The user's mistake as one line on stderr; the exit status of a refused run."""
    print(f"error: {error}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.output_dir is not None:         # the flag's folder before torch is imported; a config's after it is read
        try:
            output_folder(args.output_dir)
        except ValueError as error:
            return _refused(error)
    from ..bench import run_benchmark
    from ..models import ModelLoadError

    offline = {"HF_HUB_OFFLINE": "1"} if args.offline else {}   # every model of the run from the local cache
    saved = {key: os.environ.get(key) for key in offline}
    try:
        os.environ.update(offline)
        with warnings.catch_warnings():          # the run's warnings (e.g. a repaired cache) as one plain line each
            warnings.showwarning = _show_warning
            config = config_from_args(args)
            output_folder(config.output_dir)
            result = run_benchmark(config)       # resolves the device before any data, model or cache
    except (ValueError, TypeError, OSError, ModelLoadError) as error:
        return _refused(error)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(result.text())
    print(textwrap.fill(f"wrote {result.files['html']} (everything on one page), {result.files['markdown']}, "
                        f"{result.files['csv']}, {result.files['json']} and {len(result.files['plots'])} plot(s)",
                        100, subsequent_indent="    ", break_on_hyphens=False, break_long_words=False))
    if result.errors:
        count = sum(len(error["images"]) for error in result.errors)
        said = f"{len(result.errors)} error(s) on {count} image(s); see Errors above"
        if not result.scored():               # nothing to read above but the errors: the first one on this line
            model, method, metric, message = next(iter(result.grouped_errors()))
            said = f"error: no scores, every method failed on every image ({model} / {method}: {message}); {said}"
        print(said, file=sys.stderr)
        return 1
    return 0
