"""Option values checked and parsed by their annotations (vitexplain.options), and the generic registry."""
import sys
from collections.abc import Sequence
from typing import Annotated, Literal

import pytest
import torch

from vitexplain.options import InvalidOption, PositiveInt, Range, Share, check_options, conforms, describe, parse_option


def _fn(x, *, count: PositiveInt = 3, ratio: Share | Sequence[Share] = 0.5, mode: Literal["a", "b"] = "a",
        flag: bool = False, scale: float = 1.0, start: int | None = None, name: str = "x",
        steps: Annotated[int, Range(low=2)] = 2, weights: torch.Tensor | None = None):
    return x


@pytest.mark.parametrize("options", [
    {"count": 1}, {"ratio": 1.0}, {"ratio": [0.25, 0.5]}, {"ratio": (0.1,)}, {"mode": "b"}, {"flag": True},
    {"scale": 2}, {"scale": -0.5}, {"start": None}, {"start": -1}, {"name": "y"}, {"steps": 2},
    {"weights": torch.ones(2)},
])
def test_valid_values_pass(options):
    check_options("function 'f'", _fn, options)


@pytest.mark.parametrize("options, message", [
    ({"count": 0}, "count .* an integer >= 1"),
    ({"count": 2.0}, "count .* an integer"),
    ({"count": True}, "count .* an integer"),
    ({"ratio": 0}, "ratio .* > 0 and <= 1"),
    ({"ratio": []}, "ratio"),
    ({"ratio": [0.5, 1.5]}, "ratio"),
    ({"mode": "c"}, "mode .* one of 'a', 'b'"),
    ({"flag": "yes"}, "flag .* True or False"),
    ({"flag": 1}, "flag .* True or False"),
    ({"scale": float("nan")}, "scale .* a number"),
    ({"start": 1.5}, "start .* an integer or None"),
    ({"steps": 1}, "steps .* >= 2"),
    ({"weights": [1.0]}, "weights"),
])
def test_invalid_values_are_named(options, message):
    with pytest.raises(InvalidOption, match=f"option {message}"):
        check_options("function 'f'", _fn, options)
    with pytest.raises(ValueError):  # InvalidOption is both a ValueError and a TypeError
        check_options("function 'f'", _fn, options)


def test_unknown_options_list_the_valid_ones():
    with pytest.raises(TypeError, match="function 'f' has no option 'cuont'; its options are: count, flag"):
        check_options("function 'f'", _fn, {"cuont": 3})


@pytest.mark.parametrize("text, expected", [
    ("count=7", ("count", 7)), ("ratio=0.25", ("ratio", 0.25)), ("ratio=[0.25, 0.5]", ("ratio", [0.25, 0.5])),
    ("mode=b", ("mode", "b")), ("flag=true", ("flag", True)), ("start=null", ("start", None)),
    ("name=123", ("name", "123")), ("scale=3", ("scale", 3)), ("start=-2", ("start", -2)),
])
def test_text_is_parsed_by_the_annotation(text, expected):
    assert parse_option("function 'f'", _fn, text) == expected


@pytest.mark.parametrize("text, error", [
    ("count", ValueError), ("count=0", InvalidOption), ("flag=maybe", InvalidOption), ("nope=1", TypeError),
])
def test_bad_text_is_refused(text, error):
    with pytest.raises(error):
        parse_option("function 'f'", _fn, text)


def test_descriptions_and_conformance_agree_on_bounds():
    assert describe(Share) == "a number > 0 and <= 1"
    assert conforms(1, Share) and not conforms(0, Share) and not conforms(1.01, Share)
    assert describe(Literal["x", "y"]) == "one of 'x', 'y'"


def test_registry_names_lookup_and_duplicates(tmp_path, monkeypatch):
    """Built-ins are the modules of the registry's package, imported at the first lookup, `_` ones skipped."""
    package = tmp_path / "widget_parts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "beta.py").write_text("import test_widget_registry as r\nr.REGISTRY.add('beta', 2)\n")
    (package / "_shared.py").write_text("raise RuntimeError('a helper module is not an entry')\n")
    (tmp_path / "test_widget_registry.py").write_text(
        "from vitexplain.registry import Registry\nREGISTRY = Registry('widget', 'widget_parts', sort=False)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from test_widget_registry import REGISTRY as registry
    registry.add("gamma", 3)
    assert "widget_parts.beta" not in sys.modules
    assert registry.names() == ["gamma", "beta"] and "widget_parts.beta" in sys.modules
    assert registry.get("beta") == 2 and "gamma" in registry and len(registry) == 2
    with pytest.raises(ValueError, match="a widget named 'beta' is already registered"):
        registry.add("beta", 4)
    with pytest.raises(ValueError, match=r"unknown widget 'bata' \(did you mean 'beta'\?\); available: gamma, beta"):
        registry.get("bata")
    assert registry.remove("gamma") == 3 and registry.names() == ["beta"]
