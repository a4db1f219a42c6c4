"""Training parameters say what trains (issue 48): a user's schedule wins over a preset's in either unit (iterations or
epochs of the training split), the run's name says it departs from its preset, and a bad schedule is one line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

from shiftbench.config.settings import Settings
from shiftbench.erm import launch
from shiftbench.errors import InputError

from .conftest import small_sprites_home

CASE = "sprites-uniform"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return small_sprites_home(tmp_path_factory.mktemp("schedule_home"), CASE)


def _plan(warehouse: Settings, preset: str, **overrides: Any) -> launch.RunPlan:
    return launch.plan_run(warehouse, CASE, preset=preset, overrides=overrides)


def test_a_users_schedule_wins_over_the_presets_in_either_unit(warehouse: Settings) -> None:
    """breeds_450 counts 450 epochs (BREEDS' protocol); smoke counts 300 iterations."""
    paper = _plan(warehouse, "breeds_450")
    per_epoch = math.ceil(paper.n_train / paper.config["batch_size"])
    assert paper.run == f"{CASE}.breeds_450.resnet18.seed0"
    assert paper.config["max_iters"] == 450 * per_epoch
    assert paper.config["lr_milestones"] == [150 * per_epoch, 300 * per_epoch]
    # --set max_iters=2 on an epoch preset: 2 iterations (it trained 450 epochs), and a name of its own.
    two = _plan(warehouse, "breeds_450", max_iters=2)
    assert two.config["max_iters"] == 2
    assert re.fullmatch(rf"{CASE}\.breeds_450-[0-9a-f]{{8}}\.resnet18\.seed0", two.run)
    # --set max_epochs on either kind of preset: converted to iterations of this split (it was refused).
    one = _plan(warehouse, "breeds_450", max_epochs=1)
    assert one.config["max_iters"] == per_epoch and one.run not in (paper.run, two.run)
    smoke = _plan(warehouse, "smoke")
    by_epochs = _plan(warehouse, "smoke", max_epochs=3)
    assert by_epochs.config["max_iters"] == 3 * math.ceil(smoke.n_train / smoke.config["batch_size"])
    assert re.fullmatch(rf"{CASE}\.smoke-[0-9a-f]{{8}}\.mlp\.seed0", by_epochs.run)
    # The preset's own schedule, given in the other unit, is the preset's run.
    assert _plan(warehouse, "breeds_450", max_epochs=450).run == paper.run
    assert _plan(warehouse, "breeds_450", max_iters=450 * per_epoch).run == paper.run
    # The learning-rate drops likewise: the user's iterations over the preset's epochs, and the reverse.
    assert _plan(warehouse, "breeds_450", lr_milestones=[5]).config["lr_milestones"] == [5]
    assert _plan(warehouse, "smoke", lr_drop_epochs="1,2").config["lr_milestones"] == [per_epoch, 2 * per_epoch]
    assert _plan(warehouse, "smoke", lr_drop_epochs=1).config["lr_milestones"] == [per_epoch]  # --set ...=1: one drop


def test_breeds_table_13s_architectures_take_their_learning_rates(warehouse: Settings) -> None:
    """BREEDS Table 13: AlexNet and VGG-11 at 0.01, the ResNets and DenseNet-121 at 0.1; the preset's rate for the
    model is the preset's run, a user's ``lr`` wins and names the run apart."""
    for model, rate in (("alexnet", 0.01), ("vgg11", 0.01), ("resnet34", 0.1), ("densenet121", 0.1), ("resnet18", 0.1)):
        plan = _plan(warehouse, "breeds", model=model)
        assert (plan.config["lr"], plan.run) == (rate, f"{CASE}.breeds.{model}.seed0")
    mine = _plan(warehouse, "breeds", model="alexnet", lr=0.1)
    assert mine.config["lr"] == 0.1 and re.fullmatch(rf"{CASE}\.breeds-[0-9a-f]{{8}}\.alexnet\.seed0", mine.run)
    assert _plan(warehouse, "breeds_450", model="vgg11").config["lr"] == 0.01


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": "vgg13"}, "parameter 'model': unknown model 'vgg13'; known: resnet18, resnet50, small_cnn, mlp, "),
        ({"model": "alexnet", "image_size": 32}, "parameter 'image_size': alexnet needs images of at least 63 pixels"),
        ({"model": "vit_b_16", "image_size": 200}, "parameter 'image_size': vit_b_16 cuts 16-pixel patches"),
        ({"lr_by_model": {"alexnet": 0.01}}, "parameter 'lr_by_model': a preset's key, not a training parameter"),
        ({"selection": "oracle"}, "parameter 'selection': must be auto, val, id_val, last or test_oracle"),
    ],
    ids=["unknown", "too-small", "patches", "preset-only-key", "selection"],
)
def test_an_architecture_that_cannot_run_is_one_line(
    warehouse: Settings, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError) as refused:
        _plan(warehouse, "smoke", **overrides)
    assert message in str(refused.value), str(refused.value)


BAD_SCHEDULES = [
    ({"max_epochs": 0}, {"max_epochs"}, "parameter 'max_epochs': must be whole epochs >= 1, got 0"),
    ({"max_epochs": -3}, set(), "parameter 'max_epochs': must be whole epochs >= 1"),  # a preset's
    ({"max_epochs": "two"}, {"max_epochs"}, "parameter 'max_epochs': expected int, got 'two'"),
    ({"max_epochs": 1.5}, {"max_epochs"}, "parameter 'max_epochs': expected int, got 1.5"),
    ({"max_epochs": 2, "max_iters": 5}, {"max_epochs", "max_iters"}, "give max_epochs or max_iters, not both"),
    ({"lr_drop_epochs": "1,0"}, {"lr_drop_epochs"}, "parameter 'lr_drop_epochs': must be whole epochs >= 1"),
    ({"lr_drop_epochs": "1,x"}, {"lr_drop_epochs"}, "parameter 'lr_drop_epochs': expected tuple"),
    (
        {"lr_drop_epochs": [1], "lr_milestones": [3]},
        {"lr_drop_epochs", "lr_milestones"},
        "parameter 'lr_drop_epochs': give lr_drop_epochs or lr_milestones, not both",
    ),
]


@pytest.mark.parametrize(("values", "given", "message"), BAD_SCHEDULES, ids=[str(v) for v, _, _ in BAD_SCHEDULES])
def test_a_bad_schedule_is_one_line_naming_the_parameter(values: dict[str, Any], given: set[str], message: str) -> None:
    with pytest.raises(InputError) as err:
        launch.resolve_config({"model": "mlp", **values}, 432, given)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_max_epochs_trains_through_the_cli_and_the_dagster_job(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set max_epochs=1`` reaches the ERM asset's launchpad config and trains one epoch of the split."""
    from shiftbench.pipelines.cli import main

    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    args = ["train", CASE, "--preset", "smoke", "--seed", "3", "--set", "max_epochs=1", "--set", "eval_every=2"]
    assert main([*args, "--in-process"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    found = re.search(rf"({CASE}\.smoke-[0-9a-f]{{8}}\.mlp\.seed3) version", out)
    assert found is not None, out
    with duckdb.connect(str(warehouse.home / "catalog.duckdb"), read_only=True) as con:
        iterations, n_train, config = con.execute(
            "SELECT iterations, n_train, config FROM erm_runs WHERE run = ?", [found.group(1)]
        ).fetchone() or (None, None, None)
    assert iterations == json.loads(config)["max_iters"] == math.ceil(n_train / 128)
