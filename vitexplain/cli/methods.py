"""``vitexplain methods``: list the registered explanation methods, what they explain, and their options (with
``--metrics`` / ``--datasets``: the evaluation protocols and the datasets, plug-ins' included)."""
from __future__ import annotations

LEGEND = ("[resolution, inputs explained]: token = maps on the patch grid, pixel = at image size; "
          "image+text = also explains text (vitexplain explain-text); "
          "control = a reference map, not an explanation (left out of --method all)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("methods", description="List the explanation methods and their options "
                                                          "(pass them to `vitexplain explain` as -O KEY=VALUE).")
    parser.add_argument("--models", action="store_true",
                        help="show which method explains which model family (works / refused and why)")
    parser.add_argument("--metrics", action="store_true",
                        help="list the evaluation protocols instead: group, what each needs, options")
    parser.add_argument("--datasets", action="store_true", help="list the datasets instead, with their options")
    parser.add_argument("--check", action="store_true",
                        help="with --models: run every method on every family's tiny example now (about a "
                             "minute on a CPU) instead of showing the table stored with the package")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..registry import available_methods, get_method

    if args.models:
        from ..support import TABLE, support_markdown, support_matrix

        print(support_markdown(support_matrix(progress=True)) if args.check else TABLE.read_text(), end="")
        return 0
    if args.metrics:
        return _metrics()
    if args.datasets:
        return _datasets()
    for name in available_methods():
        spec = get_method(name)
        tags = ", ".join([spec.resolution, "+".join(spec.modalities)] + (["control"] if spec.control else []))
        options = ", ".join(f"{key}={value!r}" for key, value in spec.options.items()) or "no options"
        print(f"{name:24s} [{tags}] {spec.summary}\n{'':24s} {options}")
    print(f"\n{LEGEND}")
    return 0


def _metrics() -> int:
    from ..metrics import available_metrics, get_metric
    from ..metrics.base import describe_need

    for name in available_metrics():
        metric = get_metric(name)
        needs = f"; needs {', '.join(map(describe_need, metric.requires))}" if metric.requires else ""
        options = ", ".join(f"{key}={value!r}" for key, value in metric.options.items()) or "no options"
        print(f"{name:24s} [{metric.group}{needs}]\n{'':24s} {options}")
    return 0


def _datasets() -> int:
    import inspect

    from ..datasets import available_datasets
    from ..datasets.base import DATASETS

    for name in available_datasets():
        loader = DATASETS.get(name)
        summary = (inspect.getdoc(loader) or "").split("\n", 1)[0]
        options = ", ".join(p for p in inspect.signature(loader).parameters if p != "split")
        print(f"{name:24s} {summary}\n{'':24s} {options or 'no options'}")
    return 0
