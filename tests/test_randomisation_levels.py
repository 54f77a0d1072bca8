"""The model-randomisation cascade as the families declare it (instrumentation/randomisation.py,
families/cascade.py): which parameters each level re-initialises, in which order, and the refusals."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from vitexplain.instrumentation import UnsupportedModelError
from vitexplain.instrumentation.families.base import catalogue, served_families
from vitexplain.instrumentation.randomisation import Randomisation, randomisation_levels

from conftest import make_vit

#: the examples of the families that declare a cascade (today timm's flat-sequence ones)
TIMM = [example.label for family in served_families() if family.cascade is not None
        for example in family.example_models]


def timm_names(model: nn.Module) -> list[tuple[str, list[str]]]:
    """The levels written out from timm's parameter names: head modules, ``blocks.<i>.`` top down, the rest."""
    top, blocks, rest = [], {}, []
    for name, _ in model.named_parameters():
        found = re.match(r"blocks\.(\d+)\.", name)
        if found:
            blocks.setdefault(int(found[1]), []).append(name)
        elif name.split(".")[0] in ("head", "head_dist", "norm", "fc_norm", "attn_pool"):
            top.append(name)
        else:
            rest.append(name)
    return [("head", top), *((f"block {i}", blocks[i]) for i in sorted(blocks, reverse=True)), ("embedding", rest)]


@pytest.mark.parametrize("label", TIMM)
def test_a_timm_family_declares_the_head_then_its_blocks_top_down_then_the_rest(label):
    model, _ = catalogue()[label].build()
    assert type(model).__module__.startswith("timm.models.")
    levels = randomisation_levels(model)
    assert [(level.name, level.names) for level in levels] == timm_names(model)
    kinds = {name: kind for level in levels for name, _, kind in level.parameters}
    parameters = dict(model.named_parameters())
    assert all((kinds[name] == "normal") == (parameters[name].ndim >= 2) for name in parameters)
    assert all(kinds[name] == "one" for name in parameters if name.endswith(("norm1.weight", ".gamma")))


def test_a_wrapped_model_randomises_its_described_module_and_the_same_draws():
    model = make_vit()
    wrapped = nn.Sequential(nn.Identity(), make_vit())
    wrapped[1].load_state_dict(model.state_dict())
    assert [level.names for level in randomisation_levels(wrapped)] == [level.names
                                                                        for level in randomisation_levels(model)]
    Randomisation(1, 3)(model)
    Randomisation(1, 3)(wrapped)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), wrapped[1].state_dict().values()))


def test_models_without_a_cascade_are_refused_in_one_line():
    from torchvision.models import resnet18

    with pytest.raises(UnsupportedModelError, match=r"^model randomisation re-initialises a model's blocks from the "
                                                    r"top down; ResNet has none that vitexplain can reach") as caught:
        randomisation_levels(resnet18(num_classes=3))
    assert "\n" not in str(caught.value)
    swin = next(example for label, example in catalogue().items() if label.startswith("Swin ("))
    with pytest.raises(UnsupportedModelError, match="not described for this SwinTransformer .*declares no cascade"):
        randomisation_levels(swin.build()[0])
