"""``vitexplain explain-text TEXT --model DIR``: a text classifier's prediction, token by token, coloured by
relevance."""
from __future__ import annotations

import html
import sys

from .shared import add_method_options, method_options, output_file, positive_int, probability_text


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain-text", description="Explain a text classifier's prediction: its tokens coloured by relevance "
                                    "on the terminal, and an HTML snippet.")
    parser.add_argument("text", help="the text to classify and explain")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="local Hugging Face model directory (save_pretrained layout, with its tokenizer)")
    parser.add_argument("--method", default="gradtoken",
                        help="a method that explains text (`vitexplain methods` marks them; default: %(default)s)")
    add_method_options(parser)
    parser.add_argument("--target", type=int, help="class to explain (default: the prediction)")
    parser.add_argument("--max-length", type=positive_int, default=512,
                        help="word pieces kept, special tokens included (default: %(default)s)")
    parser.add_argument("--html", default="vitexplain-text.html",
                        help="where the HTML snippet goes (default: %(default)s)")
    parser.add_argument("--no-color", action="store_true", help="plain text even on a terminal")
    parser.set_defaults(func=run)


def background(value: float) -> tuple[int, int, int]:
    """RGB for a relevance scaled to [-1, 1]: white at 0, red for positive, blue for negative."""
    fade = round(255 * (1 - min(abs(value), 1.0)))
    return (255, fade, fade) if value >= 0 else (fade, fade, 255)


def ansi(token: str, value: float) -> str:
    red, green, blue = background(value)
    return f"\x1b[30;48;2;{red};{green};{blue}m{token}\x1b[0m"


def html_snippet(tokens: list[str], values: list[float], relevance: list[float]) -> str:
    """One ``<span>`` per token, its background the scaled relevance, its title the raw relevance."""
    spans = [f'<span style="background-color: rgb{background(v)}" title="{raw:.4g}">{html.escape(token)}</span>'
             for token, v, raw in zip(tokens, values, relevance)]
    return '<p class="vitexplain-text">' + " ".join(spans) + "</p>\n"


def run(args) -> int:
    import torch

    from ..api import explain
    from ..models import load_text_model

    try:
        html_file = output_file(args.html)          # checked before the model is loaded, written at the end
        options = method_options([args.method], args.options)[args.method]
        tokenizer, model = load_text_model(args.model)
    except (OSError, ValueError, TypeError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    encoding = tokenizer(args.text, return_tensors="pt", truncation=True, max_length=args.max_length)
    with torch.no_grad():
        probabilities = model(**encoding).logits.softmax(-1)[0]
    target = int(probabilities.argmax()) if args.target is None else args.target
    try:
        relevance = explain(model, encoding, args.method, target=target, **options)[0]
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ids = encoding["input_ids"][0].tolist()
    special = set(tokenizer.all_special_ids)
    shown = [i for i, token_id in enumerate(ids) if token_id not in special]
    tokens = tokenizer.convert_ids_to_tokens([ids[i] for i in shown])
    raw = relevance[shown]
    peak = float(raw.abs().max()) if len(shown) else 0.0
    scaled = (raw / peak if peak > 0 else torch.zeros_like(raw)).tolist()
    names = getattr(model.config, "id2label", {}) or {}
    print(f"{names.get(target, target)} (p={probability_text(float(probabilities[target]))}), {args.method}:")
    if args.no_color or not sys.stdout.isatty():
        print(" ".join(f"{token}[{value:+.2f}]" for token, value in zip(tokens, scaled)))
    else:
        print(" ".join(ansi(token, value) for token, value in zip(tokens, scaled)))
    html_file.parent.mkdir(parents=True, exist_ok=True)
    html_file.write_text(html_snippet(tokens, scaled, raw.tolist()))
    print(f"wrote {args.html}")
    return 0
