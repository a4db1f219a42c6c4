"""No side channels (issue 50): what the CLI decides reaches the ERM asset as run configuration, never through the
process environment. ``shiftbench train --backend local`` over ``SHIFTBENCH_TRAIN_BACKEND=slurm`` trains here and
leaves the environment as it found it; the asset reads ``backend`` from its config, else the setting."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from shiftbench.assets.erm import _backend
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main

from .conftest import copied_home, small_sprites_home

CASE = "sprites-uniform"


@pytest.fixture(scope="module")
def split_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("run_configuration") / "base"
    small_sprites_home(home, CASE)
    return home


def test_backend_local_over_the_slurm_setting_is_the_run_s_configuration(
    split_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    copied_home(split_home, tmp_path, monkeypatch)
    monkeypatch.setenv("SHIFTBENCH_TRAIN_BACKEND", "slurm")
    quick = ["--preset", "smoke", "--set", "max_iters=10", "--set", "eval_every=5"]
    assert main(["train", CASE, *quick, "--backend", "local"]) == 0
    assert "[slurm]" not in capsys.readouterr().out
    assert os.environ["SHIFTBENCH_TRAIN_BACKEND"] == "slurm"  # the command changed nothing of its process
    with dg.DagsterInstance.get() as instance:
        (run,) = instance.get_runs()
    (op,) = run.run_config["ops"].values()
    assert op["config"]["backend"] == "local"


@pytest.mark.parametrize(
    ("setting", "configured", "expected"),
    [("local", None, "local"), ("slurm", None, "slurm"), ("slurm", "local", "local"), ("local", "slurm", "slurm")],
)
def test_the_asset_trains_where_its_configuration_says_else_where_the_setting_says(
    setting: str, configured: str | None, expected: str
) -> None:
    settings = Settings.from_env({"SHIFTBENCH_HOME": "/tmp/unused", "SHIFTBENCH_TRAIN_BACKEND": setting})
    assert _backend(settings, SimpleNamespace(backend=configured)) == expected


def test_a_backend_the_asset_does_not_know_is_one_line_naming_the_parameter() -> None:
    settings = Settings.from_env({"SHIFTBENCH_HOME": "/tmp/unused"})
    with pytest.raises(InputError, match=r"backend.*must be one of local, slurm, got 'pbs'"):
        _backend(settings, SimpleNamespace(backend="pbs"))
