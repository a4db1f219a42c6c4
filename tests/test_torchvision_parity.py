"""Our hand-written ResNets stay loadable with torchvision checkpoints (models.py promises it).

The shape test always runs: it compares against a snapshot of torchvision's state dicts that
``bench/bench_torchvision.py --write-snapshot tests/data/torchvision_resnet_state.json`` writes in
a venv with torchvision (the CPU torch here cannot load torchvision). The numerical test runs only
where torchvision imports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from shiftbench.erm.models import build_model

SNAPSHOT = Path(__file__).parent / "data" / "torchvision_resnet_state.json"
RESNETS = ["resnet18", "resnet50"]


@pytest.mark.parametrize("name", RESNETS)
def test_state_dict_matches_torchvision_snapshot(name: str) -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    expected = snapshot["models"][name]
    ours = {k: list(v.shape) for k, v in build_model(name, snapshot["num_classes"], 224).state_dict().items()}
    assert list(ours) == list(expected), "parameter names or their order differ from torchvision's"
    assert ours == expected


@pytest.mark.parametrize("name", RESNETS)
def test_torchvision_weights_give_the_same_outputs(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    theirs = getattr(torchvision.models, name)(weights=None, num_classes=1000)
    # Fresh BatchNorms are all alike; perturb them so that a swapped layer would show.
    g = torch.Generator().manual_seed(1)
    for module in theirs.modules():
        if isinstance(module, nn.BatchNorm2d):
            c = module.num_features
            module.weight.data.copy_(0.5 + torch.rand(c, generator=g))
            module.bias.data.copy_(0.1 * torch.randn(c, generator=g))
            module.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            module.running_var.copy_(0.5 + torch.rand(c, generator=g))
    ours = build_model(name, 1000, 224)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs.eval(), ours.eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, actual = theirs(x), ours(x)
    assert expected.abs().max() > 0.1  # a non-trivial output
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
