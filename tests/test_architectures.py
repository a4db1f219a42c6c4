"""BREEDS Table 13's and ConDS Table 1's architectures in training: each trains through the job with a method that
reads the last layer's input (CORAL), and the linear probe retrains each one's own last layer and nothing else.
Their definitions against torchvision's: tests/test_torchvision_parity.py."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.erm.config import TrainConfig
from shiftbench.erm.models import build_model, head_name
from shiftbench.erm.train import train
from shiftbench.runtime.seeding import seed_for

from .conftest import sprites_split

CASE = "sprites-uniform"
NEW = ["resnet34", "alexnet", "vgg11", "densenet121", "vit_b_16"]
HEADS = {"resnet34": "fc", "alexnet": "classifier.6", "vgg11": "classifier.6", "densenet121": "classifier",
         "vit_b_16": "heads.head"}  # fmt: skip


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Path], dict[str, Any]]:
    """The case's first 24 examples of each split: what two iterations and the final evaluation of every split
    need (all 1,242 examples made the evaluation through VGG-11's and ViT-B/16's full-size heads most of the time)."""
    table, paths, preset = sprites_split(tmp_path_factory.mktemp("architectures_home"), CASE)
    keep = np.sort(np.concatenate([table.indices(name)[:24] for name in table.split_names]))
    fewer = dataclasses.replace(
        table, example_ids=[table.example_ids[i] for i in keep], splits=table.splits[keep], y=table.y[keep],
        group_index=table.group_index[keep], metadata=table.metadata[keep],
    )  # fmt: skip
    return fewer, [paths[i] for i in keep], preset


def _train(split: Any, out: Path, **values: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    table, paths, preset = split
    short = {"max_iters": 2, "eval_every": 2, "batch_size": 8, "device": "cpu", "optimizer": "sgd",
             "lr": 0.01, "lr_milestones": [], "threads": 1}  # fmt: skip
    config = TrainConfig.from_mapping({**preset, **short, **values})
    result = train(table, paths, config, out, log=lambda _m: None)
    return result, torch.load(result.weights_path)


@pytest.mark.parametrize("model", NEW)
def test_each_architecture_trains_its_own_last_layer_under_the_probe_with_a_feature_method(
    model: str, split: Any, tmp_path: Path
) -> None:
    """One short run per architecture: CORAL reads the input of the model's last layer (a hook on it), and the linear
    probe leaves every parameter and statistic but that layer's at the job's initial values."""
    table, size = split[0], 64 if model == "alexnet" else 32
    result, trained = _train(split, tmp_path, model=model, method="coral", linear_probe=True, image_size=size)
    values = [m.value for m in result.metrics if m.value is not None]
    assert values and all(math.isfinite(v) for v in values)
    torch.manual_seed(seed_for(0, table.benchmark, "init"))  # the job's initial model (shiftbench.erm.fit)
    built = build_model(model, table.num_classes, size)
    assert head_name(built) == HEADS[model]
    initial = built.state_dict()
    changed = sorted(k for k in initial if not torch.equal(initial[k], trained[k]))
    assert changed and all(k.startswith(HEADS[model] + ".") for k in changed), changed
