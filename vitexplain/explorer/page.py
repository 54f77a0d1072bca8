"""The explorer page: its items checked, their images and maps encoded, the template filled in.

Colours follow the convention of :mod:`vitexplain.viz` (the PNG overlays and the bench gallery use
it too): a map with a negative value on a diverging palette (RdBu by default), 0 at its centre, its
ends at ± the 99th percentile of |v|; any other map on a sequential palette (viridis by default) from
its minimum to its 99th percentile; beyond the ends, saturated. The ends are computed here, from the
raw map, and stored with it; the page only applies them. Each map has its own scale (methods' units
are not comparable). Maps are upsampled to the image by nearest neighbour by
default, so each token is drawn as the block of pixels it covers, in the colour of the value hover
reports; bilinear (as :func:`vitexplain.maps.resize`, ``align_corners=False``) is a switch in the page.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..html_page import html_page
from ..viz import DIVERGING, OVERLAY_ALPHA, SEQUENTIAL, as_array, map_scale, method_maps, palette, pictures
from .encoding import encode_map

#: the page's own head: a Content-Security-Policy that forbids every fetch (only inline script and style, data: images)
_HEAD = ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
         'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'"><meta name="generator" content="vitexplain">')
#: The palettes offered in the page, first the convention's (:mod:`vitexplain.viz`): (matplotlib name, label shown).
SEQUENTIAL_PALETTES = ((SEQUENTIAL, SEQUENTIAL), ("inferno", "inferno"), ("jet", "jet"))
DIVERGING_PALETTES = ((DIVERGING, "RdBu (blue − / red +)"), ("coolwarm", "coolwarm"), ("bwr", "bwr"))


@dataclass
class ExplorerItem:
    """One image of the explorer, with its maps (method label -> [h, w]) and the model's prediction.

    ``image`` is uint8 [H, W, 3] as the model sees it (resized, cropped, not normalised). A map of
    shape ``grid`` is token-level (hover reports the token), one of shape [H, W] pixel-level; any
    other 2-D shape is drawn over the whole image and hover reports its cell. Torch tensors are
    accepted wherever arrays are.
    """

    name: str
    image: np.ndarray
    maps: dict[str, np.ndarray]
    options: dict[str, dict] = field(default_factory=dict)
    top5: list[tuple[str, float]] = field(default_factory=list)
    target: str | None = None
    grid: tuple[int, int] | None = None


def write_explorer(path: str | Path, items: Sequence[ExplorerItem], *, title: str = "vitexplain explorer") -> Path:
    """Write the explorer page for ``items`` to ``path`` (parent folders are created); returns the path."""
    return ExplorerPage(items, title=title).save(path)


class ExplorerPage:
    """The explorer page of ``items`` (:func:`explorer_html`), for a notebook: Jupyter shows it inline, in an
    ``<iframe>`` of ``height`` pixels; :meth:`save` writes it as the file :func:`write_explorer` writes.

    Example::

        maps = {name: vitexplain.explain(model, images, name) for name in ("gae", "tis")}
        items = vitexplain.explorer_items(images, maps, config=config, probabilities=model(images).softmax(-1))
        page = vitexplain.ExplorerPage(items)   # the cell's value: the page, inline
        page.save("explorer.html")
    """

    def __init__(self, items: Sequence[ExplorerItem], *, title: str = "vitexplain explorer", height: int = 760):
        if not isinstance(height, (int, np.integer)) or isinstance(height, bool) or height <= 0:
            raise ValueError(f"height must be a positive number of pixels; got {height!r}")
        items = list(items)
        #: the page, one self-contained HTML document
        self.html = explorer_html(items, title=title)
        self.title, self.height, self.names = title, int(height), [str(item.name) for item in items]

    def _repr_html_(self) -> str:
        """The page in an iframe (its own document: the page's script, style and Content-Security-Policy stay
        inside it; sandboxed, so the script cannot reach the notebook)."""
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title, quote=True)}" '
                f'sandbox="allow-scripts" style="width: 100%; height: {self.height}px; border: 1px solid #d0d7de">'
                "</iframe>")

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (parent folders are created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"ExplorerPage({self.title!r}: {len(self.names)} image{'s' * (len(self.names) != 1)})"


def explorer_items(images, maps, *, names: Sequence[str] | None = None, mean=None, std=None, config=None,
                   probabilities=None, class_names: Sequence[str] | None = None, targets=None,
                   options: Mapping[str, Mapping] | None = None,
                   grid: tuple[int, int] | None = None) -> list[ExplorerItem]:
    """The explorer's items of a batch: images and maps as :func:`vitexplain.plot` takes them.

    Args:
        images: a preprocessed batch [B, 3, H, W] with ``mean`` / ``std`` or ``config`` (the model's data
            config) to un-normalise it, or pictures (PIL images, [H, W, 3] arrays); see :func:`vitexplain.viz.pictures`.
        maps: one method's maps [B, h, w] (labelled ``"map"``) or ``{method: maps [B, h, w]}``.
        names: one per image, distinct (default ``"image 0"``, ``"image 1"`` ...).
        probabilities: the model's class probabilities [B, K] (softmax): each image's top-5, named by
            ``class_names`` (K names; default the class indices).
        targets: the class each image's maps explain (an int for all, or one per image; ints are named by
            ``class_names``, strings shown as they are); None: the predicted class when ``probabilities``
            are given (what :func:`vitexplain.explain` explains by default), else not shown.
        options: ``{method: {option: value}}`` shown beside each method's maps (what they were made with).
        grid: the model's patch grid (h, w), which makes a map of that shape token-level (hover names the
            token); None: the shape all of an image's maps share that is not the image's own.
    """
    shown = pictures(images, mean=mean, std=std, config=config)
    per_method = method_maps(maps, len(shown))
    count = len(shown)
    names = [f"image {i}" for i in range(count)] if names is None else [str(name) for name in names]
    if len(names) != count:
        raise ValueError(f"names: {len(names)} names for {count} images")
    top5 = _top5_rows(probabilities, class_names, count)
    explained = _targets(targets, probabilities, class_names, count)
    items = []
    for i, picture in enumerate(shown):
        picture = picture if picture.dtype == np.uint8 else np.round(picture * 255).astype(np.uint8)
        maps_i = {method: values[i] for method, values in per_method.items()}
        shapes = {saliency.shape for saliency in maps_i.values()} - {picture.shape[:2]}
        items.append(ExplorerItem(name=names[i], image=picture, maps=maps_i,
                                  options={method: dict(values) for method, values in (options or {}).items()},
                                  top5=top5[i], target=explained[i],
                                  grid=grid if grid is not None or len(shapes) != 1 else next(iter(shapes))))
    return items


def _class_name(index: int, class_names: Sequence[str] | None) -> str:
    return str(index) if class_names is None else str(class_names[index])


def _top5_rows(probabilities, class_names: Sequence[str] | None, count: int) -> list[list[tuple[str, float]]]:
    if probabilities is None:
        return [[] for _ in range(count)]
    probabilities = np.asarray(as_array(probabilities), dtype=np.float64)
    if probabilities.ndim != 2 or probabilities.shape[0] != count:
        raise ValueError(f"probabilities must be [B, K] with B = {count} images; got shape {list(probabilities.shape)}")
    if class_names is not None and len(class_names) != probabilities.shape[1]:
        raise ValueError(f"class_names: {len(class_names)} names for {probabilities.shape[1]} classes")
    if probabilities.min() < -1e-6 or probabilities.max() > 1 + 1e-6:
        raise ValueError(f"probabilities must be in [0, 1] (the softmax of the logits); got {probabilities.min():.3g} "
                         f"to {probabilities.max():.3g}")
    probabilities = probabilities.clip(0.0, 1.0)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :5]
    return [[(_class_name(int(k), class_names), float(row[k])) for k in ranks]
            for row, ranks in zip(probabilities, order)]


def _targets(targets, probabilities, class_names: Sequence[str] | None, count: int) -> list[str | None]:
    if targets is None:
        if probabilities is None:
            return [None] * count
        targets = np.asarray(as_array(probabilities)).argmax(1)
    elif isinstance(targets, (str, int, np.integer)) or (hasattr(targets, "ndim") and targets.ndim == 0):
        targets = [targets.item() if hasattr(targets, "item") else targets] * count
    targets = list(targets)
    if len(targets) != count:
        raise ValueError(f"targets: {len(targets)} targets for {count} images")
    found = []
    for target in targets:
        target = target.item() if hasattr(target, "item") else target
        if isinstance(target, str):
            found.append(target)
        elif isinstance(target, (int, np.integer)) and not isinstance(target, bool) and (
                class_names is None or 0 <= target < len(class_names)):
            found.append(_class_name(int(target), class_names))
        else:
            raise ValueError(f"targets must be class indices (of class_names) or strings; got {target!r}")
    return found


def explorer_html(items: Sequence[ExplorerItem], *, title: str = "vitexplain explorer") -> str:
    """The explorer page for ``items`` as one self-contained HTML string."""
    items = list(items)
    if not items:
        raise ValueError("the explorer needs at least one item")
    repeated = sorted(name for name, count in Counter(item.name for item in items).items() if count > 1)
    if repeated:
        raise ValueError(f"item names must be unique (they label the picker); repeated: "
                         f"{', '.join(map(repr, repeated))}")
    data = {
        "palettes": {"sequential": _palettes(SEQUENTIAL_PALETTES), "diverging": _palettes(DIVERGING_PALETTES)},
        "items": [_item_data(item) for item in items],
    }
    package = resources.files(__package__)
    parts = {"title": html.escape(title), "data": _script_json(data), "opacity": str(round(100 * OVERLAY_ALPHA)),
             "script": package.joinpath("explorer.js").read_text(encoding="utf-8")}
    body = re.sub(r"\{\{(\w+)\}\}", lambda match: parts[match.group(1)],
                  package.joinpath("template.html").read_text(encoding="utf-8"))
    return html_page(title, body, style=package.joinpath("explorer.css").read_text(encoding="utf-8"), head=_HEAD)


def _item_data(item: ExplorerItem) -> dict:
    """One item as the page reads it, after checking every field."""
    where = f"item {item.name!r}"
    image = as_array(item.image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"{where}: image must be uint8 [H, W, 3] (as the model sees it, not normalised); "
                         f"got {image.dtype} {list(image.shape)}")
    grid = _grid(item.grid, where)
    if not item.maps:
        raise ValueError(f"{where}: no maps")
    unknown = sorted(set(item.options) - set(item.maps))
    if unknown:
        raise ValueError(f"{where}: options given for methods without a map: {', '.join(map(repr, unknown))}")
    not_dicts = [label for label, options in item.options.items() if not isinstance(options, Mapping)]
    if not_dicts:
        raise ValueError(f"{where}: options must be a dict per method; not for {', '.join(map(repr, not_dicts))}")
    maps = []
    for label, values in item.maps.items():
        values = as_array(values)
        if values.ndim != 2 or 0 in values.shape:
            raise ValueError(f"{where}, method {label!r}: a map must be 2-D [h, w]; got shape {list(values.shape)}")
        if values.dtype.kind not in "iuf":
            raise ValueError(f"{where}, method {label!r}: a map must hold real numbers; got dtype {values.dtype}")
        if not np.isfinite(values).all():
            raise ValueError(f"{where}, method {label!r}: the map holds non-finite values (NaN or inf)")
        shape = tuple(values.shape)
        kind = "token" if shape == grid else "pixel" if shape == image.shape[:2] else "cell"
        scale = map_scale(values)
        maps.append({"label": str(label), "kind": kind, "options": _jsonable(item.options.get(label, {})),
                     "scale": {"low": scale.low, "high": scale.high, "rule": scale.rule}, **encode_map(values)})
    return {"name": str(item.name), "image": _png_uri(image), "height": image.shape[0], "width": image.shape[1],
            "grid": list(grid) if grid else None, "top5": _top5(item.top5, where),
            "target": None if item.target is None else str(item.target), "maps": maps}


def _grid(grid, where: str) -> tuple[int, int] | None:
    if grid is None:
        return None
    grid = tuple(grid)
    if len(grid) != 2 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in grid):
        raise ValueError(f"{where}: grid must be two positive ints (h, w); got {grid}")
    return int(grid[0]), int(grid[1])


def _top5(top5, where: str) -> list[list]:
    rows = []
    for row in top5:
        if len(row) != 2:
            raise ValueError(f"{where}: top5 rows must be (class name, probability); got {row!r}")
        name, probability = row[0], float(row[1])
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"{where}: top5 probability of {name!r} must be in [0, 1]; got {probability}")
        rows.append([str(name), probability])
    return rows


def _png_uri(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _palettes(palettes: Sequence[tuple[str, str]]) -> list[dict]:
    """Each palette's colours (:func:`vitexplain.viz.palette`) as RGB triples, base64."""
    return [{"name": name, "label": label, "rgb": base64.b64encode(palette(name).tobytes()).decode("ascii")}
            for name, label in palettes]


def _jsonable(value):
    """Options as JSON: numbers, strings, lists and dicts as they are, small arrays and tensors as lists, else repr."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if hasattr(value, "shape") and hasattr(value, "tolist"):          # numpy arrays and torch tensors
        array = as_array(value)
        return _jsonable(array.tolist()) if array.size <= 64 else f"{array.dtype} array of shape {list(array.shape)}"
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _script_json(data: dict) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' can end it or open a comment."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
