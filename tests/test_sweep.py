"""A sweep (``shiftbench train B1 B2 --seeds``): every run planned first, runs packed side by side give the
versions they give one by one, each finished run printed as it comes, and a failed run fails alone."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from shiftbench.erm import sweep
from shiftbench.erm.launch import RunPlan
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main

from .conftest import small_sprites_home

CASE = "sprites-uniform"


@pytest.mark.parametrize(
    ("text", "seeds"), [("0", [0]), ("0,1,2", [0, 1, 2]), ("0-2", [0, 1, 2]), ("4, 0-1", [4, 0, 1]), ("9", [9])]
)
def test_seeds_are_lists_and_ranges_of_partitions(text: str, seeds: list[int]) -> None:
    assert sweep.parse_seeds(text) == seeds


@pytest.mark.parametrize(("text", "fragment"), [("", "''"), ("1-", "'1-'"), ("10", "0..9"), ("2,2", "twice")])
def test_bad_seeds_are_named(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        sweep.parse_seeds(text)


def test_slots_follow_the_device_and_never_exceed_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(sweep, "gpu_present", lambda: False)
    assert sweep.slots(None, 6, None) == 2 and sweep.slots(None, 1, "auto") == 1
    assert sweep.slots(None, 6, "cuda") == sweep.GPU_SLOTS and sweep.slots(3, 2, "cpu") == 2
    assert sweep.threads_per_run(2) == 1 and sweep.threads_per_run(1) == 2 and sweep.threads_per_run(8) == 1


def _plan(run: str) -> Any:
    return RunPlan(run, "b", "conds", "sprites", "v", Path(), "p", {"seed": 0}, None, 1)  # type: ignore[arg-type]


def test_a_failed_run_fails_alone_with_its_error_line(tmp_path: Path) -> None:
    """Three runs two at a time: the middle one exits 2 with an error line; the others are read as
    published, and every outcome reaches the callback as it finishes."""
    scripts = {
        "a": "print('[train] a version 1111 (now latest, 1.0s)'); print('  test/acc_avg                 0.5000')",
        "b": "import sys; print('[train] starting'); print('error: cannot decode image: x.png', file=sys.stderr); "
        "sys.exit(2)",
        "c": "print('[train] c version 2222 (already latest, 1.0s)')",
    }
    seen: list[str] = []
    outcomes = sweep.run_packed(
        [_plan(r) for r in scripts],
        lambda plan: [sys.executable, "-c", scripts[plan.run]],
        2,
        tmp_path / "logs",
        lambda outcome: seen.append(outcome.plan.run),
    )
    by_run = {o.plan.run: o for o in outcomes}
    assert sorted(seen) == ["a", "b", "c"]
    assert by_run["a"].ok and by_run["a"].version == "1111" and by_run["a"].became_latest
    assert by_run["a"].headline == {"test/acc_avg": 0.5}
    assert by_run["c"].ok and not by_run["c"].became_latest
    assert not by_run["b"].ok and by_run["b"].exit_code == 2 and by_run["b"].error == "cannot decode image: x.png"
    assert (tmp_path / "logs" / "b.log").is_file()


@pytest.mark.slow
def test_packed_runs_give_the_versions_of_runs_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two seeds side by side (one CPU thread each), then one of them alone with one thread: the same
    version, already latest; one line per run and a summary, through the CLI."""
    home = tmp_path / "home"
    env = {"SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    small_sprites_home(home, CASE)
    quick = ["--preset", "quick", "--set", "max_iters=10", "--set", "eval_every=5", "--device", "cpu", "--in-process"]

    def versions(*extra: str) -> tuple[dict[str, str], str]:
        assert main(["train", CASE, *quick, *extra]) == 0
        out = capsys.readouterr().out
        found = re.findall(r"^\[sweep \d/\d\] (\S+) version (\S+) \((now|already) latest", out, re.MULTILINE)
        return {run: version for run, version, _ in found}, out

    packed, out = versions("--seeds", "0-1", "--parallel", "2")
    assert "2 runs (1 benchmark x seeds 0,1), 2 at a time, 1 CPU thread each" in out
    assert "2 published, 0 failed" in out and len(packed) == 2 and out.count("now latest") == 2
    alone, out = versions("--seeds", "1", "--parallel", "1", "--set", "threads=1")
    assert "1 run (1 benchmark x seeds 1), 1 at a time;" in out
    assert len(alone) == 1 and alone.items() <= packed.items() and "already latest" in out
