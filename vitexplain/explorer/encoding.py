"""How a map travels in the explorer page: 16-bit levels, predicted, compressed.

Encoding (see docs/decisions/explorer.md): images are PNG ``data:`` URIs (lossless, as the model
sees them). Maps are quantised to 16 bits and stored with their scale: a map with a negative value on
a grid symmetric about 0 (``v = (q - 32767) * step``, ``step = max|v| / 32767``, so 0 and ±max|v|
are exact), any other map on ``[min, max]`` (``v = min + q * step``, ``step = (max - min) / 65535``).
The shown value is then within ``max|v| / 65534`` (about 1.5e-5 of the map's largest magnitude) of
the raw value. Each 16-bit level is stored as its difference from the prediction left + up − up-left
(the gradient predictor of lossless image coding; left on the first row, up on the first column),
modulo 2**16, high bytes then low bytes, zlib-compressed and base64-encoded; the page inflates them
with the browser's ``DecompressionStream``. Smooth pixel-level maps shrink to a fifth to a third of
their 16-bit size; noisy ones (gradients) hardly shrink, as no lossless code can shrink noise.
"""
from __future__ import annotations

import base64
import zlib

import numpy as np

LEVELS = 65535
SIGNED_ZERO = 32767


def encode_map(values: np.ndarray) -> dict:
    """16-bit levels of one map and the scale that turns them back into values (the module docstring says how)."""
    values = values.astype(np.float64)
    low, high = float(values.min()), float(values.max())
    if low < 0:
        step = max(-low, high) / SIGNED_ZERO
        levels = np.rint(values / step) + SIGNED_ZERO
        base, zero = 0.0, SIGNED_ZERO
    else:
        step = (high - low) / LEVELS
        levels = np.rint((values - low) / step) if step > 0 else np.zeros_like(values)
        base, zero = low, 0
    levels = levels.astype(np.int64)
    prediction = np.zeros_like(levels)         # left + up - up-left; left on the first row, up on the first column
    prediction[0, 1:] = levels[0, :-1]
    prediction[1:, 0] = levels[:-1, 0]
    prediction[1:, 1:] = levels[1:, :-1] + levels[:-1, 1:] - levels[:-1, :-1]
    residuals = ((levels - prediction) % (LEVELS + 1)).ravel()
    planes = np.concatenate([residuals >> 8, residuals & 0xFF]).astype(np.uint8)
    return {"rows": values.shape[0], "cols": values.shape[1], "low": low, "high": high, "signed": low < 0,
            "base": base, "zero": zero, "step": step,
            "levels": base64.b64encode(zlib.compress(planes.tobytes(), 9)).decode("ascii")}
