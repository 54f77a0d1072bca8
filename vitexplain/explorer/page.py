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

from ..viz import DIVERGING, OVERLAY_ALPHA, SEQUENTIAL, as_array, map_scale, palette
from .encoding import encode_map

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
    page = explorer_html(items, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


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
             "style": package.joinpath("explorer.css").read_text(encoding="utf-8"),
             "script": package.joinpath("explorer.js").read_text(encoding="utf-8")}
    template = package.joinpath("template.html").read_text(encoding="utf-8")
    return re.sub(r"\{\{(\w+)\}\}", lambda match: parts[match.group(1)], template)


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
