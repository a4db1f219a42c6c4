"""A warehouse that is not there is an error, never an empty one made on the spot (issue 48): every command that
reads a warehouse, and ``shiftbench.load_split``, says in one line which folder it looked for and how it was
chosen (``SHIFTBENCH_HOME``, or the default ``./warehouse``), exit 2, and creates nothing. Only ``build`` (and
``generate``, which builds MetaShift's inputs into it) makes a warehouse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import shiftbench
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main

READERS = {  # {dir}: a folder of the test's own, beside the warehouse looked for
    "sql": ["sql", "SELECT count(*) FROM benchmarks"],
    "sql --csv": ["sql", "SELECT 1", "--csv"],
    "leaderboard": ["leaderboard"],
    "analyse": ["analyse"],
    "versions": ["versions"],
    "versions B": ["versions", "sprites-uniform"],
    "check": ["check"],
    "catalog": ["catalog"],
    "gc": ["gc", "--keep", "1"],
    "gc --dry-run": ["gc", "--dry-run"],
    "train": ["train", "sprites-uniform", "--preset", "smoke"],
    "train, a sweep": ["train", "sprites-uniform", "--seeds", "0,1"],
    "train --backend slurm": ["train", "sprites-uniform", "--backend", "slurm"],
    "eval": ["eval", "sprites-uniform", "{dir}/predictions.csv", "--method", "mine"],
    "export": ["export", "sprites-uniform", "{dir}/export"],
}


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no warehouse in it, no SHIFTBENCH_* variable set."""
    for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
        monkeypatch.delenv(key)
    work = tmp_path / "work"
    work.mkdir()
    (work / "predictions.csv").write_text("example_id,y_pred\nx,0\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    return work


def _refused(argv: list[str], work: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = sorted(p.name for p in work.parent.iterdir())
    code = main([arg.format(dir=work) for arg in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: parameter 'SHIFTBENCH_HOME': no warehouse at "), err
    assert sorted(p.name for p in work.parent.iterdir()) == before and sorted(p.name for p in work.iterdir()) == [
        "predictions.csv"
    ]  # nothing made: no warehouse, no Dagster home, no export folder
    return err


@pytest.mark.parametrize("command", READERS)
def test_every_reading_command_refuses_the_default_warehouse_that_is_not_there(
    nowhere: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    err = _refused(READERS[command], nowhere, capsys)
    assert f"no warehouse at {nowhere / 'warehouse'} (the default ./warehouse, SHIFTBENCH_HOME being unset" in err
    assert not (nowhere / "warehouse").exists()


@pytest.mark.parametrize("command", READERS)
def test_every_reading_command_refuses_a_moved_warehouse(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    moved = nowhere.parent / "moved"
    monkeypatch.setenv("SHIFTBENCH_HOME", str(moved))
    err = _refused(READERS[command], nowhere, capsys)
    assert f"no warehouse at {moved} (SHIFTBENCH_HOME names it, and it is not there" in err
    assert not moved.exists()


def test_a_file_where_the_warehouse_should_be_is_no_warehouse(
    nowhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (nowhere / "warehouse").write_text("not a folder")
    assert main(["versions"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "(the default ./warehouse, SHIFTBENCH_HOME being unset, and it is not a folder" in err
    )
    assert (nowhere / "warehouse").read_text() == "not a folder"


def test_the_command_a_newcomer_types_refuses_in_one_line(nowhere: Path) -> None:
    """The issue's case, as typed: ``shiftbench sql`` in a folder with no warehouse (it answered ``count 0``)."""
    done = subprocess.run(
        [sys.executable, "-m", "shiftbench.pipelines.cli", "sql", "SELECT count(*) FROM benchmarks"],
        capture_output=True, text=True, timeout=120, check=False, cwd=nowhere,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHIFTBENCH_")},
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and f"no warehouse at {nowhere / 'warehouse'} " in done.stderr, done.stderr
    assert not (nowhere / "warehouse").exists()


def test_load_split_names_the_warehouse_it_did_not_find(nowhere: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moved = nowhere.parent / "moved"
    with pytest.raises(InputError, match=rf"^parameter 'home': no warehouse at {moved}: it is not there$"):
        shiftbench.load_split("sprites-uniform", home=moved)
    with pytest.raises(InputError, match=r"no warehouse at .*/work/warehouse \(the default ./warehouse, SHIFTBENCH"):
        shiftbench.load_split("sprites-uniform")
    monkeypatch.setenv("SHIFTBENCH_HOME", str(moved))
    with pytest.raises(InputError, match=r"parameter 'SHIFTBENCH_HOME': no warehouse at .*/moved \(SHIFTBENCH_HOME"):
        shiftbench.load_split("sprites-uniform")
    assert not moved.exists() and not (nowhere / "warehouse").exists()


def test_an_empty_warehouse_that_is_there_still_answers(nowhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder that is there is a warehouse, empty or not: `versions` says it has nothing published (exit 0)."""
    (nowhere / "warehouse").mkdir()
    assert main(["versions"]) == 0
    assert capsys.readouterr().out == "no published versions\n"
