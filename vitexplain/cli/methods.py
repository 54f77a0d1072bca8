"""``vitexplain methods``: list the registered explanation methods, what they explain, and their options."""
from __future__ import annotations

LEGEND = ("[resolution, inputs explained]: token = maps on the patch grid, pixel = at image size; "
          "image+text = also explains text (vitexplain explain-text); "
          "control = a reference map, not an explanation (left out of --method all)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("methods", description="List the explanation methods and their options "
                                                          "(pass them to `vitexplain explain` as -O KEY=VALUE).")
    parser.add_argument("--models", action="store_true",
                        help="show which method explains which model family (works / refused and why)")
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
    for name in available_methods():
        spec = get_method(name)
        tags = ", ".join([spec.resolution, "+".join(spec.modalities)] + (["control"] if spec.control else []))
        options = ", ".join(f"{key}={value!r}" for key, value in spec.options.items()) or "no options"
        print(f"{name:24s} [{tags}] {spec.summary}\n{'':24s} {options}")
    print(f"\n{LEGEND}")
    return 0
