"""The commands a command prints for the user to run next work as printed (issue 48): ``Results: ... sql "..."``
after ``train``, a sweep and ``eval``, and main.sh's "Try" line for Python clients. Each is taken from the real
output and run in a shell, in a built warehouse, as a newcomer would paste it: with the bare ``shiftbench`` only
when their shell finds this same console script, else the script's path (a newcomer's shell has no bare
``shiftbench``); the Python line also with DuckDB 1.4 (.venv-clients), where ``duckdb.connect(...).sql(...)`` in one
expression fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.pipelines.cli.common import shiftbench_command
from shiftbench.splits import published as splits

from .conftest import PROJECT, small_sprites_home

CASE = "sprites-uniform"
SCRIPT = Path(sys.executable).parent / "shiftbench"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A warehouse with one ConDS case published (each test works in a copy)."""
    return small_sprites_home(tmp_path_factory.mktemp("hints") / "home", CASE)


@pytest.fixture
def home(built: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "home"
    shutil.copytree(built.home, copy, symlinks=True)
    for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(copy))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "40")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.chdir(PROJECT)
    return copy


def _without_the_venv_on_path() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != SCRIPT.parent)


def _run_as_printed(command: str, path: str) -> str:
    """``command`` pasted into a shell in the working directory it was printed in; its stdout."""
    done = subprocess.run(
        ["bash", "-c", command], cwd=Path.cwd(), env={**os.environ, "PATH": path}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (command, done.stderr[-3000:])
    return done.stdout


def _hint(out: str, label: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith(label)]
    return line.removeprefix(label).strip()


def test_the_command_is_the_bare_name_only_where_the_shell_finds_this_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv("PATH", _without_the_venv_on_path())
    if shutil.which("shiftbench") is None:  # a newcomer's shell: the script beside this Python, from here
        assert shiftbench_command() == str(SCRIPT.relative_to(PROJECT))
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "shiftbench").write_text("#!/bin/sh\nexit 3\n")  # another shiftbench first on PATH: never named bare
    (other / "shiftbench").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{_without_the_venv_on_path()}")
    assert shiftbench_command() == str(SCRIPT.relative_to(PROJECT))
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}{_without_the_venv_on_path()}")
    assert shiftbench_command() == "shiftbench"
    monkeypatch.chdir(tmp_path)  # not under the working directory: its absolute path
    monkeypatch.setenv("PATH", _without_the_venv_on_path())
    assert shiftbench_command() in {str(SCRIPT.absolute()), "shiftbench"}


@pytest.mark.parametrize("on_path", [False, True], ids=["a newcomer's PATH", "the venv on PATH"])
def test_evals_results_line_runs_as_printed(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], on_path: bool
) -> None:
    path = f"{SCRIPT.parent}{os.pathsep}{_without_the_venv_on_path()}" if on_path else _without_the_venv_on_path()
    monkeypatch.setenv("PATH", path)
    examples = splits.published_split(Settings.from_env(), CASE).examples
    examples.select("example_id", pl.col("y").alias("y_pred")).write_parquet(tmp_path / "oracle.parquet")
    assert main(["eval", CASE, str(tmp_path / "oracle.parquet"), "--method", "oracle"]) == 0
    command = _hint(capsys.readouterr().out, "Results:")
    assert command.startswith("shiftbench sql " if on_path else f"{SCRIPT.relative_to(PROJECT)} sql "), command
    run = re.search(r"run = '([^']+)'", command)
    assert run is not None
    answer = _run_as_printed(command, path)
    assert "oracle" in answer and "acc_avg" in answer and " rows " in answer and "│ 0 rows" not in answer, answer


def test_a_sweeps_results_line_runs_as_printed(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shiftbench.pipelines.cli.sweep import _summary

    assert _summary([], 1, 0.0) == 0
    command = _hint(capsys.readouterr().out, "Results:")
    assert "run" in _run_as_printed(command, _without_the_venv_on_path())


@pytest.mark.slow
def test_a_trainings_results_line_runs_as_printed(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", _without_the_venv_on_path())
    train = ["train", CASE, "--preset", "smoke", "--in-process", "--set", "max_iters=4", "--set", "eval_every=2"]
    assert main(train) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    command = _hint(out, "Results:")
    run = re.search(r"run = '([^']+)'", command)
    assert run is not None and f"[train] {run.group(1)} version " in out
    answer = _run_as_printed(command, _without_the_venv_on_path())
    assert "acc_avg" in answer and " rows " in answer and "│ 0 rows" not in answer, answer


def _try_line() -> str:
    """main.sh's "Try" line for Python clients, as the script prints it (a heredoc: $SHIFTBENCH_HOME expanded)."""
    text = (PROJECT / "scripts" / "main.sh").read_text()
    block = text[text.index("\nTry\n") : text.index("\nMSG", text.index("\nTry\n"))]
    [line] = [line.strip() for line in block.splitlines() if "import duckdb" in line]
    return line


@pytest.mark.parametrize("python", ["venv", pytest.param("clients", marks=pytest.mark.clients)])
def test_main_sh_python_try_line_runs_as_printed(home: Path, python: str, request: pytest.FixtureRequest) -> None:
    """With .venv's DuckDB 2 and .venv-clients' DuckDB 1.4 (a user's own Python), from the project root."""
    line = _try_line().replace("$SHIFTBENCH_HOME", str(home))
    assert line.startswith(".venv/bin/python -c ")
    if python == "clients":
        line = line.replace(".venv/bin/python", str(request.getfixturevalue("clients_python")), 1)
    out = _run_as_printed(line, _without_the_venv_on_path())
    assert re.search(r"│ train\s+│\s+\d+ │", out), out
