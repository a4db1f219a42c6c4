"""The training step: the static program a CUDA graph captures gives the eager step's results (on CPU it
runs uncaptured, within the rounding of the fused optimizers), the choice of step is
named, and on a GPU the captured step trains as the eager one does (marked ``gpu``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shiftbench.conds.specs import load_specs
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.methods import build_method
from shiftbench.erm.step import choose_step
from shiftbench.erm.train import TrainResult, train

from .conftest import sprites_split

SPECS = load_specs()
CASE = "sprites-sc-object_color"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Path], dict[str, Any]]:
    return sprites_split(tmp_path_factory.mktemp("step_home"), CASE)


def _train(split: tuple[Any, list[Path], dict[str, Any]], tmp: Path, **values: Any) -> tuple[TrainResult, dict]:
    table, paths, preset = split
    # Batches of 32 (the smoke preset's 128 made AugMix's nine resamplings per batch 30 s of the suite) on one
    # thread (the train() default, every core, oversubscribes the workers of a parallel test run).
    settings = {"max_iters": 40, "eval_every": 20, "lr_milestones": [25], "patience": 0, "device": "cpu",
                "batch_size": 32, "threads": 1}  # fmt: skip
    config = TrainConfig.from_mapping({**preset, **settings, "group_by": "y,object_color", **values})
    result = train(table, paths, config, tmp / values["step"], log=lambda _m: None)
    return result, torch.load(result.weights_path)


def _metrics(result: TrainResult) -> dict[tuple[str, str, str | None], float | None]:
    return {(m.eval_split, m.metric, m.group): m.value for m in result.metrics}


@pytest.mark.parametrize(
    ("model", "method", "augment", "optimizer", "tolerance"),
    [
        ("small_cnn", "groupdro", "flip_rot90", "sgd", 1e-6),
        ("mlp", "reweight", "domainbed", "sgd", 1e-6),
        ("mlp", "erm", "augmix", "sgd", 1e-6),
        ("mlp", "erm", "none", "adam", 1e-4),
    ],
)
def test_the_static_step_trains_as_the_eager_step(
    split: Any, tmp_path: Path, model: str, method: str, augment: str, optimizer: str, tolerance: float
) -> None:
    """Device-side augmentation from host draws, gathers by index, GroupDRO's in-place weights and the
    schedule on a learning-rate tensor (a drop at 25) change nothing: the same run up to the rounding of
    the fused optimizer kernels (SGD's differ from torch's default by ~1e-7 after 40 steps of 32, Adam's more)."""
    values = {"model": model, "method": method, "augment": augment, "optimizer": optimizer}
    eager, eager_weights = _train(split, tmp_path, step="eager", **values)
    static, static_weights = _train(split, tmp_path, step="graph", **values)
    assert (eager.step, static.step) == ("eager", "static")
    assert eager_weights.keys() == static_weights.keys()
    assert max(float((eager_weights[k] - static_weights[k]).abs().max()) for k in eager_weights) < tolerance
    first, second = _metrics(eager), _metrics(static)
    assert first.keys() == second.keys()
    assert all(abs((first[k] or 0.0) - (second[k] or 0.0)) <= 10 * tolerance for k in first)
    assert [c[:3] for c in eager.curve] == [c[:3] for c in static.curve]


@pytest.mark.parametrize(
    ("values", "device", "expected"),
    [
        ({}, "cpu", ("eager", "no graphs on cpu")),
        ({}, "cuda", ("graph", "captured")),
        ({"step": "graph"}, "cpu", ("graph", "static, uncaptured off a GPU")),
        ({"step": "eager"}, "cuda", ("eager", "step: eager")),
        ({"method": "irm"}, "cuda", ("eager", "irm decides per batch on the host")),
        ({"method": "coral", "step": "graph"}, "cuda", ("eager", "coral decides per batch on the host")),
        ({"linear_probe": True}, "cuda", ("eager", "linear_probe")),
    ],
)
def test_the_step_is_chosen_and_the_reason_named(values: dict[str, Any], device: str, expected: tuple) -> None:
    config = TrainConfig.from_mapping(values)
    method = build_method(config.method, np.zeros(4, np.int64), 1, {"groupdro_eta": 0.01, "irm_lambda": 1.0,
                          "irm_anneal_iters": 0.0, "coral_lambda": 1.0}, torch.device("cpu"))  # fmt: skip
    assert choose_step(config, method, torch.device(device)) == expected


def test_an_unknown_step_is_named() -> None:
    with pytest.raises(Exception, match="step"):
        TrainConfig.from_mapping({"step": "fast"})


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU and torch's CUDA build (.venv has the CPU wheel)"
)
def test_the_captured_step_trains_as_the_eager_step_on_a_gpu(split: Any, tmp_path: Path) -> None:
    """Captured in a CUDA graph (bf16, channels_last), the step gives the eager step's run within bf16
    tolerance on a fixed seed, and says it was captured."""
    values = {"model": "small_cnn", "method": "groupdro", "augment": "domainbed", "optimizer": "sgd", "batch_size": 128}
    eager, _ = _train(split, tmp_path, step="eager", device="cuda", **values)
    graph, _ = _train(split, tmp_path, step="graph", device="cuda", **values)
    assert (eager.step, graph.step) == ("eager", "graph")
    first, second = _metrics(eager), _metrics(graph)
    for key in [k for k in first if k[1] in {"acc_avg", "loss_avg"} and k[2] is None]:
        assert abs((first[key] or 0.0) - (second[key] or 0.0)) < 0.05, key
