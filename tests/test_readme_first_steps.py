"""The README's first Python example runs as written (on the shipped model: nothing to download)."""
from __future__ import annotations

import re
from pathlib import Path

import torch
from matplotlib.figure import Figure

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_shipped_model_example_runs_and_its_numbers_carry_intervals(capsys):
    section = README.read_text().split("## First steps", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert 'load_model("digits_vit")' in code
    scope: dict = {}
    exec(compile(code, "README.md (first steps)", "exec"), scope)
    scores = scope["scores"]
    assert scores.images == 10 and set(scores.numbers) >= {"pixel_accuracy", "miou"}
    low, high = scores.intervals["miou"]
    assert low <= scores.numbers["miou"] <= high
    assert capsys.readouterr().out.startswith("segmentation (10 images, 95% bootstrap intervals)")
    figure = scope["figure"]
    assert isinstance(figure, Figure) and len([ax for ax in figure.axes if ax.get_images()]) == 4 * 3
    assert scope["maps"]["gae"].shape == (10, 14, 14) and torch.isfinite(scope["maps"]["tokentm"]).all()
