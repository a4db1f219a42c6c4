"""Runs that survive interruption (shiftbench.erm.interrupt, shiftbench.erm.resume): a run stopped anywhere and
resumed publishes exactly what the uninterrupted run publishes; a checkpoint is used only by the run that wrote it;
Ctrl-C on a real ``shiftbench train`` checkpoints, says so in one line and the same command resumes."""

# long: one subject (a run stopped and resumed, at every level from the job to the command) whose tests share one
# warehouse and the uninterrupted runs they compare with (module fixtures): split, each file would train them again.

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.erm import launch, resume
from shiftbench.erm.interrupt import EXIT_INTERRUPTED, EXIT_REQUEUE, TEST_HOOK, TEST_SIGNAL, Interrupted
from shiftbench.erm.job import run_job
from shiftbench.errors import InputError

from .conftest import small_sprites_home, terminal_ctrl_c

CASE = "sprites-uniform"
# 432 training examples in batches of 64: 6 batches an epoch; evaluations at 4, 8 and 12.
TINY = {"max_iters": 12, "eval_every": 4, "batch_size": 64, "threads": 1}
ROWS = {
    "erm": {},
    "groupdro": {"method": "groupdro"},
    "autoaugment": {"augment": "autoaugment"},
}
# Where the run is stopped: after iteration 1, mid-epoch (the 2nd batch of the 2nd epoch), during the evaluation
# at 8, just before the end, and twice in a row (stopped again right after resuming).
POINTS = {"first": "1", "mid_epoch": "8", "evaluation": "eval:8", "before_end": "11", "twice": "5,6"}
# The cells of rows x points that run: every point and every row, not every pair. What a point exercises is the loop's
# (shiftbench.erm.loop: the state before any evaluation, the stream across an epoch, an abandoned evaluation redone,
# the last steps, a resumed run's state saved again) and the same for every method; what a row adds is state that
# Loop.snapshot and Loop._restore carry at every point (GroupDRO's group weights, the augmentation generator), on
# top of ERM's. So ERM takes the first and the last point, and each row with state of its own meets the points that
# stress it most: saved again after resuming (twice) for both, the abandoned evaluation for GroupDRO, mid-epoch (the
# generator with the stream's position) for AutoAugment.
CELLS = [
    ("erm", "first"), ("erm", "before_end"), ("groupdro", "evaluation"), ("groupdro", "twice"),
    ("autoaugment", "mid_epoch"), ("autoaugment", "twice"),
]  # fmt: skip


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return small_sprites_home(tmp_path_factory.mktemp("resume_home"), CASE)


def _plan(settings: Settings, row: str, **extra: Any) -> launch.RunPlan:
    return launch.plan_run(settings, CASE, preset="smoke", seed=0, overrides={**TINY, **ROWS[row], **extra})


def _outputs(out_dir: Path) -> dict[str, Any]:
    """What a run publishes, from the job's outputs: weights, metrics and curve, byte for byte."""
    summary = json.loads((out_dir / "run.json").read_text("utf-8"))
    return {
        "weights": summary["weights"]["sha256"],
        "metrics": pl.read_parquet(out_dir / "metrics.parquet").to_dicts(),
        "curve": pl.read_parquet(out_dir / "curve.parquet").to_dicts(),
        "best_iteration": summary["best_iteration"],
        "iterations": summary["iterations"],
    }


def _interrupted_run(plan: launch.RunPlan, out_dir: Path, points: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Run the job with the test hook stopping it at ``points`` until it finishes; the iterations it stopped at."""
    monkeypatch.setenv(TEST_HOOK, points)
    stops: list[Interrupted] = []
    for _ in range(4):
        try:
            run_job(plan.job(out_dir), log=lambda _: None)
            break
        except Interrupted as stopped:
            stops.append(stopped)
    assert (out_dir / "run.json").is_file(), "the run never finished"
    assert all(stop.exit_code == EXIT_INTERRUPTED for stop in stops)
    return [stop.iteration for stop in stops]


@pytest.fixture(scope="module")
def uninterrupted(warehouse: Settings, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """The outputs of a row's run trained without a stop, trained once per module the first time a test asks."""
    found: dict[str, dict[str, Any]] = {}

    def outputs(row: str) -> dict[str, Any]:
        if row not in found:
            out_dir = tmp_path_factory.mktemp(f"plain-{row}")
            with pytest.MonkeyPatch.context() as unhooked:  # never stopped, whatever the asking test has set
                unhooked.delenv(TEST_HOOK, raising=False)
                run_job(_plan(warehouse, row).job(out_dir), log=lambda _: None)
            found[row] = _outputs(out_dir)
        return found[row]

    return outputs


def test_every_row_and_every_stop_point_is_run() -> None:
    assert {row for row, _ in CELLS} == set(ROWS) and {point for _, point in CELLS} == set(POINTS)


@pytest.mark.parametrize(("row", "point"), CELLS)
def test_a_run_stopped_anywhere_and_resumed_gives_the_uninterrupted_result(
    warehouse: Settings, uninterrupted: Callable[[str], dict[str, Any]], row: str, point: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    stops = _interrupted_run(_plan(warehouse, row), tmp_path, POINTS[point], monkeypatch)
    expected = [int(p.removeprefix("eval:")) for p in POINTS[point].split(",")]
    assert stops == expected
    assert _outputs(tmp_path) == uninterrupted(row)
    assert not (tmp_path / "resume").exists()  # the outputs supersede the checkpoint


def test_the_static_step_resumes_too(warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``step: graph`` (the program a GPU captures, uncaptured on CPU: fused optimizer, learning rate as a tensor)
    stopped mid-epoch with GroupDRO resumes to the uninterrupted run's bytes."""
    plan = _plan(warehouse, "groupdro", step="graph")
    run_job(plan.job(tmp_path / "plain"), log=lambda _: None)
    assert _interrupted_run(plan, tmp_path / "stopped", "8", monkeypatch) == [8]
    assert _outputs(tmp_path / "stopped") == _outputs(tmp_path / "plain")


def test_a_learning_rate_grid_resumes_in_either_fit(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An lr grid of two fits stopped at iteration 8 of each (the second resume restores the first fit's record:
    its score and best weights) gives the uninterrupted grid's result."""
    plan = _plan(warehouse, "erm", lr_grid="0.001,0.01")
    run_job(plan.job(tmp_path / "plain"), log=lambda _: None)
    assert _interrupted_run(plan, tmp_path / "stopped", "8", monkeypatch) == [8, 8]
    plain, stopped = (json.loads((tmp_path / d / "run.json").read_text("utf-8")) for d in ("plain", "stopped"))
    assert stopped["lr_grid_scores"] == plain["lr_grid_scores"] and len(plain["lr_grid_scores"]) == 2
    assert _outputs(tmp_path / "stopped") == _outputs(tmp_path / "plain")


def test_the_resumed_run_publishes_the_same_version_and_its_folder_goes(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the launcher's folder (runs/<run>), periodic checkpoints on, stopped by SIGTERM (exit code 75):
    the published version is the uninterrupted run's, and nothing of the run's folder is left."""
    plan = _plan(warehouse, "groupdro", checkpoint_every=3)
    plain, _ = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=lambda _: None)
    out_dir = launch.scratch_dir(warehouse, plan)
    assert not out_dir.exists()
    monkeypatch.setenv(TEST_HOOK, "7")
    monkeypatch.setenv(TEST_SIGNAL, str(int(signal.SIGTERM)))
    with pytest.raises(Interrupted) as stopped:
        launch.train_in_process(warehouse, plan, out_dir, log=lambda _: None)
    assert stopped.value.exit_code == EXIT_REQUEUE and "(SIGTERM)" in stopped.value.line()
    assert sorted(p.name for p in (out_dir / "resume").iterdir()) == ["state-000000007.pt", "state.json"]
    lines: list[str] = []
    resumed, summary = launch.train_in_process(warehouse, plan, out_dir, log=lines.append)
    assert any(line.startswith("resuming from iteration 7 ") for line in lines) and summary["resumed_from"] == 7
    assert resumed.staged.version == plain.staged.version and not resumed.staged.created
    assert not out_dir.exists()


def _stop_at(plan: launch.RunPlan, out_dir: Path, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_HOOK, point)
    with pytest.raises(Interrupted):
        run_job(plan.job(out_dir), log=lambda _: None)
    monkeypatch.delenv(TEST_HOOK)


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stop_at(_plan(warehouse, "erm"), tmp_path, "2", monkeypatch)
    state = tmp_path / "resume" / "state.json"
    before = state.read_bytes()
    other = _plan(warehouse, "erm", lr=0.01)
    with pytest.raises(InputError) as refused:
        run_job(other.job(tmp_path), log=lambda _: None)
    message = str(refused.value)
    assert message.startswith(f"{state}: checkpoint of another run (lr 0.001 vs 0.01): rerun with --restart")
    assert f"or delete {tmp_path / 'resume'} to discard it" in message and "\n" not in message
    assert state.read_bytes() == before  # nothing of it was changed
    # checkpoint_every is not part of the identity: the same run with another interval resumes
    run_job(_plan(warehouse, "erm", checkpoint_every=5).job(tmp_path), log=lambda _: None)
    assert (tmp_path / "run.json").is_file() and not (tmp_path / "resume").exists()


def _damaged_cases() -> dict[str, Any]:
    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    def forged(path: Path) -> None:  # another valid checkpoint's bytes under the recorded name
        import io

        import torch

        buffer = io.BytesIO()
        torch.save({"iteration": 1}, buffer)
        path.write_bytes(buffer.getvalue())

    return {
        "flipped byte": (flip, "damaged checkpoint ("),
        "torn": (lambda p: p.write_bytes(p.read_bytes()[:1000]), "damaged checkpoint (torn or corrupt"),
        "forged": (forged, "damaged checkpoint: SHA-256"),
        "record": (None, "damaged checkpoint record"),
        "missing file": (lambda p: p.unlink(), "damaged checkpoint (checkpoint not found)"),
    }


@pytest.mark.parametrize("case", _damaged_cases())
def test_a_damaged_checkpoint_is_refused_in_one_line(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    plan = _plan(warehouse, "erm")
    _stop_at(plan, tmp_path, "3", monkeypatch)
    damage, fragment = _damaged_cases()[case]
    if damage is None:
        (tmp_path / "resume" / "state.json").write_text("{not json", "utf-8")
    else:
        damage(tmp_path / "resume" / "state-000000003.pt")
    with pytest.raises(InputError) as refused:
        run_job(plan.job(tmp_path), log=lambda _: None)
    message = str(refused.value)
    assert fragment in message and "--restart" in message and "\n" not in message, message


def test_two_jobs_never_share_a_folder(warehouse: Settings, tmp_path: Path) -> None:
    import fcntl

    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="another process is training this run in this folder"):
            run_job(_plan(warehouse, "erm").job(tmp_path), log=lambda _: None)


def test_the_batch_stream_resumes_mid_epoch() -> None:
    import numpy as np
    import torch

    from shiftbench.erm.data import standard_batches

    def stream() -> Any:
        return standard_batches(np.arange(10), 4, torch.Generator().manual_seed(1))

    whole = [next(stream_a := stream()) for _ in range(1)] + [next(stream_a) for _ in range(6)]
    first = stream()
    head = [next(first) for _ in range(3)]  # two batches an epoch: the 3rd starts the 2nd epoch
    again = stream()
    again.restore(first.state())
    assert [b.tolist() for b in head + [next(again) for _ in range(4)]] == [b.tolist() for b in whole]


def _command(warehouse: Settings, seed: int, **values: int) -> tuple[list[str], launch.RunPlan, dict[str, str]]:
    """``shiftbench train`` of a run of ``values`` (100 iterations, checkpoints every 10: the Ctrl-C test's) in a
    process of its own, with the plan it makes (its run folder: ``launch.scratch_dir``) and its environment."""
    values = {"max_iters": 100, "eval_every": 50, "checkpoint_every": 10, "threads": 1, **values}
    settings = [item for key, value in values.items() for item in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "shiftbench.pipelines.cli", "train", CASE, "--preset", "smoke"]
    command += ["--seed", str(seed), "--device", "cpu", *settings]
    plan = launch.plan_run(warehouse, CASE, preset="smoke", seed=seed, overrides={**values, "device": "cpu"})
    env = {**os.environ, "SHIFTBENCH_HOME": str(warehouse.home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"}
    env.pop(TEST_HOOK, None)
    return command, plan, env


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 300
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_on_shiftbench_train_checkpoints_and_the_same_command_resumes(
    warehouse: Settings, tmp_path: Path
) -> None:
    """A real SIGINT to a real ``shiftbench train`` (to its process group, as a terminal sends Ctrl-C) mid-run: one
    line, exit 130, no traceback; the same command resumes and publishes what an uninterrupted run publishes."""
    command, plan, env = _command(warehouse, 0)
    env["DAGSTER_HOME"] = str(tmp_path / "dagster")
    out_dir = launch.scratch_dir(warehouse, plan)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=terminal_ctrl_c)  # fmt: skip
    _wait_for(out_dir / "resume" / "state.json")  # training, past 10: 90 iterations left to stop in
    os.killpg(child.pid, signal.SIGINT)
    out, err = child.communicate(timeout=300)
    assert child.returncode == EXIT_INTERRUPTED, (out, err)
    stopped = [line for line in err.splitlines() if "interrupted at iteration" in line]
    assert len(stopped) == 1 and "Traceback" not in err and "error" not in err, err
    line = re.fullmatch(
        rf"\[train\] {CASE} seed 0: interrupted at iteration (\d+) of 100 \(SIGINT\), checkpoint kept in (\S+); "
        "run the same command again to resume",
        stopped[0],
    )
    assert line is not None and 10 <= int(line[1]) < 100 and Path(line[2]).is_dir(), stopped
    assert Path(line[2]) == out_dir / "resume"  # the plan below is the command's
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resuming from iteration {line[1]} " in again.stderr
    resumed = re.search(r"version (\S+) \(now latest", again.stdout)
    assert resumed is not None and not Path(line[2]).parent.exists()  # published: the run's folder is gone
    # The same run trained without a stop, in this process (``--restart`` retrains through the command in
    # test_the_in_process_dagster_run_stops_and_resumes), publishes that version again, not a new one.
    said: list[str] = []
    plain, _ = launch.train_in_process(warehouse, plan, tmp_path / "plain", log=said.append)
    assert plain.staged.version == resumed[1] and not plain.staged.created
    assert not any("resuming" in entry for entry in said), said


def test_checkpoint_every_is_checked() -> None:
    from shiftbench.erm.config import TrainConfig

    with pytest.raises(InputError, match="parameter 'checkpoint_every': must be an integer >= 0"):
        TrainConfig.from_mapping({"checkpoint_every": -1})
    assert "checkpoint_every" not in resume.identity("b", "v", {"checkpoint_every": 5}, {}, None)["config"]
    assert hashlib.sha256(b"").hexdigest() != resume.code_hash()


def test_ctrl_c_stops_a_sweep_after_its_runs_checkpoint(tmp_path: Path, ctrl_c_raises: None) -> None:
    """Ctrl-C on a sweep: no further run starts; each running run's process group gets SIGINT once and is waited
    for; their interrupted lines are their outcomes. Runs are stand-ins that answer SIGINT as the job does."""
    import threading

    from shiftbench.erm import sweep

    answer = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(0.5)  # a checkpoint being written\n"
        "    print('[train] b seed {seed}: interrupted at iteration 7 of 9 (SIGINT), checkpoint kept in x; run the '\n"
        "          'same command again to resume', flush=True)\n"
        "    sys.exit(130)\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    plans = [launch.RunPlan(f"r{i}", "b", "conds", "sprites", "v", Path(), "p", {"seed": i}, None, 1) for i in range(3)]  # type: ignore[arg-type]
    threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(sweep.SweepInterrupted) as stopped:
        sweep.run_packed(
            plans, lambda plan: [sys.executable, "-c", answer.format(seed=plan.config["seed"])], 2, tmp_path,
            lambda _: None,
        )  # fmt: skip
    outcomes = {o.plan.run: o for o in stopped.value.outcomes}
    assert sorted(outcomes) == ["r0", "r1"] and stopped.value.not_started == ["r2"]
    for seed, run in enumerate(("r0", "r1")):
        outcome = outcomes[run]
        assert outcome.interrupted and outcome.exit_code == EXIT_INTERRUPTED and not outcome.ok
        assert outcome.error is not None and outcome.error.startswith(f"b seed {seed}: interrupted at iteration 7 of 9")


def test_the_in_process_dagster_run_stops_and_resumes(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shiftbench train --in-process``: the asset runs the job in the command's process; stopped at iteration 5 it
    says so in one line (exit 130), and the same command resumes and publishes the uninterrupted run's version."""
    from shiftbench.pipelines.cli import main

    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    args = ["train", CASE, "--preset", "smoke", "--seed", "1", "--in-process", "--device", "cpu"]
    args += [item for key, value in TINY.items() for item in ("--set", f"{key}={value}")]
    monkeypatch.setenv(TEST_HOOK, "5")
    assert main(args) == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert re.search(rf"^\[train\] {CASE} seed 1: interrupted at iteration 5 of 12 \(SIGINT\)", err, re.MULTILINE)
    assert "Traceback" not in err and "error:" not in err, err
    assert main(args) == 0  # the hook's point was spent: the resumed run goes on
    out = capsys.readouterr().out
    resumed = re.search(r"version (\S+) \(now latest", out)
    monkeypatch.delenv(TEST_HOOK)
    assert resumed is not None and main([*args, "--restart"]) == 0
    assert f"version {resumed[1]} (already latest" in capsys.readouterr().out


def test_a_training_stopped_by_sigterm_is_retried_by_the_asset_and_resumes(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted or evicted pod's path, without a cluster: the ERM asset materialized by Dagster itself (the UI, a
    backfill), SIGTERM to the job (the test hook sends the real signal at iteration 5): it checkpoints and exits 75,
    the asset asks Dagster for a retry (SHIFTBENCH_TRAIN_RETRIES), the step runs again, resumes from the checkpoint
    and publishes the uninterrupted run's version."""
    import dagster as dg

    from shiftbench.assets import erm
    from shiftbench.assets.resources import resource_class
    from shiftbench.conds.family import CASE as KIND
    from shiftbench.conds.family import CONDS

    baseline, _ = erm.baseline_assets(CONDS, KIND)
    resources = {
        "settings": resource_class()(home=str(warehouse.home), train_retries="1"),
        "erm_pipes_client": dg.PipesSubprocessClient(),
    }
    key = dg.MultiPartitionKey({"benchmark": CASE, "seed": "3"})
    config = {"preset": "smoke", "device": "cpu", "in_process": True, **TINY}
    monkeypatch.setenv(TEST_SIGNAL, str(int(signal.SIGTERM)))
    monkeypatch.setenv(TEST_HOOK, "5")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KIND.qualified, [CASE])
        result = dg.materialize(
            [baseline], resources=resources, partition_key=key, instance=instance, raise_on_error=False,
            run_config={"ops": {KIND.baseline_op: {"config": config}}},
        )  # fmt: skip
        said = "\n".join(entry.user_message for entry in instance.all_logs(result.run_id))
    assert result.success, said
    assert "interrupted at iteration 5 of 12 (SIGTERM)" in said and "retrying (attempt 2 of at most 2" in said, said
    assert "resuming from iteration 5 " in said, said
    published = result.asset_materializations_for_node(KIND.baseline_op)[-1].metadata["version"].value
    monkeypatch.delenv(TEST_HOOK)
    plain = launch.plan_run(warehouse, CASE, preset="smoke", seed=3, overrides={**TINY, "device": "cpu"})
    outcome, _ = launch.train_in_process(warehouse, plain, tmp_path / "plain", log=lambda _: None)
    assert outcome.staged.version == published and not outcome.staged.created


def test_a_stop_of_shiftbench_train_is_final_whatever_the_retries(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Through ``shiftbench train`` the person or scheduler that sent the signal decides what comes next: SIGTERM to
    the job is the command's one line and exit 75 even with retries left (STOP_TAG), and the same command resumes."""
    from shiftbench.pipelines.cli import main

    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    args = ["train", CASE, "--preset", "smoke", "--seed", "2", "--device", "cpu"]  # the job: a Pipes subprocess
    args += [item for key, value in TINY.items() for item in ("--set", f"{key}={value}")]
    monkeypatch.setenv(TEST_SIGNAL, str(int(signal.SIGTERM)))
    monkeypatch.setenv(TEST_HOOK, "5")
    monkeypatch.setenv("SHIFTBENCH_TRAIN_RETRIES", "2")
    assert main(args) == EXIT_REQUEUE
    err = capfd.readouterr().err
    assert re.search(rf"{CASE} seed 2: interrupted at iteration 5 of 12 \(SIGTERM\)", err), err
    assert main(args) == 0 and "resuming from iteration 5 " in capfd.readouterr().err


def test_periodic_checkpoints_stay_under_two_percent_of_the_time(tmp_path: Path) -> None:
    """Every ``checkpoint_every`` iterations, unless the last write took more than 2 % of the time since it."""
    from shiftbench.erm.interrupt import StopRequest
    from shiftbench.erm.run import Resumable

    resumable = Resumable(resume.Checkpoints(tmp_path, {}), StopRequest(), 10, "b seed 0")
    assert not resumable.due(15, 0) and not resumable.due(10, 10)  # off the interval; the checkpoint resumed from
    resumable.write_s, resumable.written_at = 0.5, time.perf_counter() - 10.0  # 5 % of the time since
    assert not resumable.due(20, 0)
    resumable.written_at = time.perf_counter() - 30.0  # under 2 %
    assert resumable.due(20, 0)
    assert not Resumable(resume.Checkpoints(tmp_path, {}), StopRequest(), 0, "b seed 0").due(20, 0)  # 0: never


def _record(out_dir: Path) -> dict[str, Any]:
    return dict(json.loads((out_dir / "resume" / "state.json").read_text("utf-8")))


def _rewrite(out_dir: Path, **changes: Any) -> None:
    (out_dir / "resume" / "state.json").write_text(json.dumps({**_record(out_dir), **changes}), "utf-8")


def _swap_state(out_dir: Path, state: Any) -> None:
    """Replace the state file by ``state`` saved by torch, its SHA-256 and size updated in the record."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    record = _record(out_dir)
    (out_dir / "resume" / record["file"]).write_bytes(buffer.getvalue())
    _rewrite(out_dir, sha256=hashlib.sha256(buffer.getvalue()).hexdigest(), bytes=len(buffer.getvalue()))


def _other_config(out_dir: Path, warehouse: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another configuration's checkpoint (lr 0.01) under this run's record: identity pasted, SHA-256 updated."""
    other = out_dir.parent / "other"
    _stop_at(_plan(warehouse, "erm", lr=0.01), other, "3", monkeypatch)
    ours = _record(out_dir)["identity"]
    for name in ("state-000000003.pt",):
        (out_dir / "resume" / name).write_bytes((other / "resume" / name).read_bytes())
    _rewrite(out_dir, **{k: v for k, v in _record(other).items() if k != "identity"}, identity=ours)


def _more_damage() -> dict[str, tuple[Any, str]]:
    import torch

    return {
        "record-without-sha256": (
            lambda d, w, m: (d / "resume" / "state.json").write_text(
                json.dumps({k: v for k, v in _record(d).items() if k != "sha256"}), "utf-8"
            ),
            "state.json: damaged checkpoint record (no 'sha256')",
        ),
        "identity-a-list": (lambda d, w, m: _rewrite(d, identity=[1, 2]), "damaged checkpoint record ('identity'"),
        "foreign-torch-file": (
            lambda d, w, m: _swap_state(d, {"weights": torch.zeros(2)}),
            "damaged checkpoint (no 'iteration'): not a checkpoint this job writes",
        ),
        "record-is-a-folder": (
            lambda d, w, m: ((d / "resume" / "state.json").unlink(), (d / "resume" / "state.json").mkdir()),
            "state.json: damaged checkpoint record (",
        ),
        "resume-is-a-file": (
            lambda d, w, m: (__import__("shutil").rmtree(d / "resume"), (d / "resume").write_text("x")),
            "resume: damaged checkpoint (not a folder)",
        ),
        "other-config-identity-pasted": (
            _other_config,
            "checkpoint of another run, whatever state.json says (the file's own identity: lr 0.01 vs 0.001)",
        ),
    }


@pytest.mark.parametrize("case", list(_more_damage()))
def test_a_record_or_state_of_another_kind_is_one_line_never_a_traceback(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """What issue 48 found as tracebacks (KeyError, AttributeError, IsADirectoryError, FileExistsError) and the
    checkpoint whose record vouched for another configuration's weights: each is one line naming the file, exit 2,
    through the job's command line too."""
    from shiftbench.erm.job import main as job_main

    plan = _plan(warehouse, "erm")
    out_dir = tmp_path / "run"
    _stop_at(plan, out_dir, "3", monkeypatch)
    damage, fragment = _more_damage()[case]
    damage(out_dir, warehouse, monkeypatch)
    with pytest.raises(InputError) as refused:
        run_job(plan.job(out_dir), log=lambda _: None)
    message = str(refused.value)
    assert fragment in message and "\n" not in message and "--restart" in message, message
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(plan.job(out_dir)), "utf-8")
    assert job_main([str(job_file)]) == 2
    assert json.loads((out_dir / "error.json").read_text("utf-8"))["error"] == message


@pytest.mark.parametrize("point", ["run.json", "discard"])
def test_a_kill_during_the_jobs_clean_up_is_completed_without_training(
    warehouse: Settings, tmp_path: Path, point: str
) -> None:
    """SIGKILL (a real one: the job kills itself at the point, SHIFTBENCH_TEST_KILL_AT) just after ``run.json`` is
    written or with ``resume/`` renamed away but not deleted: the same job run again trains nothing, returns the
    finished outputs as they are and removes what was left of the checkpoint."""
    plan = _plan(warehouse, "erm", checkpoint_every=2)
    out_dir = tmp_path / "run"
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(plan.job(out_dir)), "utf-8")
    env = {**os.environ, "SHIFTBENCH_TEST_KILL_AT": point}
    env.pop(TEST_HOOK, None)
    killed = subprocess.run([sys.executable, "-m", "shiftbench.erm.job", str(job_file)], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL and (out_dir / "run.json").is_file()
    before = (out_dir / "run.json").read_bytes()
    lines: list[str] = []
    summary = run_job(plan.job(out_dir), log=lines.append)
    assert any("finished by an earlier attempt; its outputs are kept" in line for line in lines), lines
    assert not any("iteration" in line for line in lines), lines
    assert (out_dir / "run.json").read_bytes() == before and summary["weights"]["sha256"]
    assert not (out_dir / "resume").exists() and not list(out_dir.glob(".resume.discarded.*"))


def test_a_kill_before_run_json_resumes_from_the_last_checkpoint(
    warehouse: Settings, uninterrupted: Callable[[str], dict[str, Any]], tmp_path: Path
) -> None:
    """Killed with its outputs written but not ``run.json`` (the commit): the folder is not finished (a crash while
    training, as far as anyone can tell); the same job resumes from the last periodic checkpoint and gives the
    uninterrupted outputs (the ERM row's: the checkpoint interval changes no output)."""
    plan = _plan(warehouse, "erm", checkpoint_every=2)
    out_dir = tmp_path / "run"
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(plan.job(out_dir)), "utf-8")
    env = {**os.environ, "SHIFTBENCH_TEST_KILL_AT": "outputs"}
    env.pop(TEST_HOOK, None)
    killed = subprocess.run([sys.executable, "-m", "shiftbench.erm.job", str(job_file)], env=env, capture_output=True)
    assert killed.returncode == -signal.SIGKILL and not (out_dir / "run.json").exists()
    lines: list[str] = []
    run_job(plan.job(out_dir), log=lines.append)
    assert any(line.startswith("resuming from iteration 2 ") for line in lines), lines
    assert _outputs(out_dir) == uninterrupted("erm")


def test_a_run_that_makes_no_progress_gives_up_after_the_limit(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeue livelock without a cluster: attempts of one job (its ``launch`` id, as a Slurm task's id stays the
    same across requeues) each stopped by SIGUSR1 right after resuming. The third in a row without a step gives up:
    one line naming the run, the job and the reason, exit 2, instead of 75; the next attempt of that job is refused
    before training; a new submission (another id) goes on; the attempts are recorded for the manifest."""
    from shiftbench.erm import run_folder

    plan = _plan(warehouse, "erm")
    out_dir = tmp_path / "run"
    job = {**plan.job(out_dir), "launch": "job-7", "max_stalled_attempts": 3}
    monkeypatch.setenv(TEST_SIGNAL, str(int(signal.SIGUSR1)))
    monkeypatch.setenv(TEST_HOOK, "3")
    with pytest.raises(Interrupted):
        run_job(job, log=lambda _: None)  # progress: 3 steps
    monkeypatch.setenv(TEST_HOOK, "resume")
    for _ in range(2):
        with pytest.raises(Interrupted) as stopped:
            run_job(job, log=lambda _: None)
        assert stopped.value.exit_code == EXIT_REQUEUE
    with pytest.raises(InputError) as gave_up:
        run_job(job, log=lambda _: None)
    line = str(gave_up.value)
    assert line.startswith(
        f"{CASE} seed 0: no progress in 3 attempts of job job-7 in a row (each stopped at iteration 3 by time "
        "limit), the limit is 3: the time limit is shorter than start-up plus an evaluation"
    ), line
    assert (out_dir / "resume" / "state.json").is_file()  # the checkpoint is kept
    monkeypatch.delenv(TEST_HOOK)
    with pytest.raises(InputError, match="no progress in 3 attempts of job job-7"):
        run_job(job, log=lambda _: None)
    record = run_folder.execution_attempts(out_dir)
    assert record["timeouts"] == 4 and record["preemptions"] == 0
    assert [(a["started"], a["stopped"], a["progress"]) for a in record["attempts"]] == [
        (0, 3, 3), (3, 3, 0), (3, 3, 0), (3, 3, 0)
    ]  # fmt: skip
    summary = run_job({**job, "launch": "job-8"}, log=lambda _: None)  # a new submission is a new decision
    assert summary["resumed_from"] == 3


# Every signal to every target but SIGINT to the group (a terminal's Ctrl-C: the test above): eight runs, seeds 2-9.
STOPS = [(s, t) for s in ("SIGINT", "SIGTERM", "SIGUSR1") for t in ("command", "group", "job")]
STOPS.remove(("SIGINT", "group"))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "target"), STOPS)
def test_a_stop_sent_to_the_command_its_group_or_the_job_checkpoints_with_the_signals_code(
    tmp_path: Path, warehouse: Settings, name: str, target: str
) -> None:
    """A real signal to a real ``shiftbench train`` (its own session, as a terminal's job) after the job's first
    checkpoint: to the command alone, to its process group, or to the training job alone (its pid from the run's lock
    file). Each checkpoints and exits with the code docs/erm.md gives (130 for SIGINT, 75 for the others) and one line
    naming the signal: Dagster turns a SIGTERM it receives into SIGINT, so the command holds the signals and forwards
    them as they were (shiftbench.erm.interrupt.forwarded_stops)."""
    command, plan, env = _command(warehouse, 2 + STOPS.index((name, target)), max_iters=5000, eval_every=100)
    env["DAGSTER_HOME"] = str(tmp_path / "dagster")  # a run of its own (seeds 2-9)
    out_dir = launch.scratch_dir(warehouse, plan)
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=terminal_ctrl_c)  # fmt: skip
    _wait_for(out_dir / "resume" / "state.json")
    signum = signal.Signals[name]
    if target == "command":
        os.kill(child.pid, signum)
    elif target == "group":
        os.killpg(child.pid, signum)
    else:
        os.kill(int((out_dir / ".lock").read_text()), signum)
    out, err = child.communicate(timeout=300)
    assert child.returncode == (EXIT_INTERRUPTED if name == "SIGINT" else EXIT_REQUEUE), (out, err)
    stopped = [line for line in err.splitlines() if "interrupted at iteration" in line]
    assert len(stopped) == 1 and f"({name})" in stopped[0], err
    assert "Traceback" not in err and "error" not in err, err


def test_a_sweep_passes_each_stop_signal_on_to_its_runs_and_exits_with_its_code(tmp_path: Path) -> None:
    """``shiftbench train --seeds`` holds the stop signals (shiftbench.erm.stops) and the sweep's loop takes them:
    SIGTERM stops it like Ctrl-C, sent on as SIGTERM to each running run's process group; the runs are stand-ins that
    answer as the job does, and the outcome carries the signal, whose exit code (75) the command returns."""
    from shiftbench.erm import sweep
    from shiftbench.erm.interrupt import exit_code

    answer = (
        "import signal, sys, time\n"
        "def stop(signum, _):\n"
        "    print(f'[train] b seed {seed}: interrupted at iteration 7 of 9 ({{signal.Signals(signum).name}}), '\n"
        "          'checkpoint kept in x; run the same command again to resume', flush=True)\n"
        "    sys.exit(75)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(60)\n"
    )
    plans = [launch.RunPlan(f"r{i}", "b", "conds", "sprites", "v", Path(), "p", {"seed": i}, None, 1) for i in range(2)]  # type: ignore[arg-type]
    calls = {"n": 0}

    def wait(seconds: float) -> int | None:
        calls["n"] += 1
        time.sleep(seconds)
        return int(signal.SIGTERM) if calls["n"] == 20 else None

    with pytest.raises(sweep.SweepInterrupted) as stopped:
        sweep.run_packed(
            plans, lambda plan: [sys.executable, "-c", answer.format(seed=plan.config["seed"])], 2, tmp_path,
            lambda _: None, wait=wait,
        )  # fmt: skip
    assert stopped.value.signum == signal.SIGTERM and exit_code(stopped.value.signum) == EXIT_REQUEUE
    for outcome in stopped.value.outcomes:
        assert outcome.interrupted and outcome.exit_code == EXIT_REQUEUE and "(SIGTERM)" in str(outcome.error)


def test_a_moved_warehouse_resumes_its_stopped_runs(
    warehouse: Settings, uninterrupted: Callable[[str], dict[str, Any]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A run stopped in a warehouse that is then moved (``mv``) resumes where it is: the checkpoint names the images
    inside the warehouse relative to it, not by the absolute path it had (issue 48), and gives the uninterrupted
    run's outputs."""
    import shutil

    before, after = tmp_path / "before", tmp_path / "after"
    shutil.copytree(warehouse.home, before, symlinks=True)
    stopped = Settings.from_env({"SHIFTBENCH_HOME": str(before), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"})
    plan = _plan(stopped, "erm")
    _stop_at(plan, launch.scratch_dir(stopped, plan), "5", monkeypatch)
    before.rename(after)
    moved = Settings.from_env({"SHIFTBENCH_HOME": str(after), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"})
    plan = _plan(moved, "erm")
    assert str(plan.images.root).startswith(str(after))
    lines: list[str] = []
    run_job(plan.job(launch.scratch_dir(moved, plan)), log=lines.append)
    assert any(line.startswith("resuming from iteration 5 ") for line in lines), lines
    assert _outputs(launch.scratch_dir(moved, plan)) == uninterrupted("erm")


def test_the_code_identity_covers_every_module_the_job_imports() -> None:
    """A checkpoint is refused when any code its bytes depend on changed: the hashed files are every shiftbench module
    ``python -m shiftbench.erm.job`` imports, training and evaluating included (issue 48: image decoding and metrics
    were missing)."""
    code = (
        "import sys\n"
        "import shiftbench.erm.job, shiftbench.erm.train\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('shiftbench'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = {name.split(".", 1)[1] for name in done.stdout.split() if "." in name}
    package = Path(resume.__file__).resolve().parents[1]
    hashed = {".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__") for p in resume._CODE}
    assert imported - hashed - {"erm"} == set(), imported - hashed


@pytest.mark.slow
def test_a_job_killed_as_its_outputs_are_committed_is_published_by_the_same_command(
    warehouse: Settings, tmp_path: Path
) -> None:
    """Issue 48's reproduction through ``shiftbench train``: the job SIGKILLed the moment its ``run.json`` appears.
    The command says so in one line (no traceback), exit 1; the same command publishes the finished outputs without
    training, where it used to refuse a checkpoint whose file the clean-up had already deleted."""
    # A short run (12 iterations) with a periodic checkpoint (at 4, the first is never skipped) left at the kill.
    command, plan, env = _command(warehouse, 1, max_iters=12, eval_every=4, checkpoint_every=4)
    env.update({"DAGSTER_HOME": str(tmp_path / "dagster"), "SHIFTBENCH_TEST_KILL_AT": "run.json"})
    out_dir = launch.scratch_dir(warehouse, plan)
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == 1 and "Traceback" not in killed.stderr, killed.stderr
    assert (out_dir / "run.json").is_file() and (out_dir / "resume" / "state.json").is_file()
    assert "iteration 12/12: " in killed.stderr, killed.stderr  # what training says, which the next must not
    assert killed.stderr.strip().splitlines()[-1] == (
        "error: the training job was killed by SIGKILL (out of memory, or killed by hand): what it finished is kept "
        "(its outputs, else its last checkpoint); run the same command again to complete it; nothing was published"
    ), killed.stderr  # the command adds the last words
    env.pop("SHIFTBENCH_TEST_KILL_AT")
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "finished by an earlier attempt; its outputs are kept" in again.stderr, again.stderr
    assert re.search(r"iteration \d+/12", again.stderr) is None, again.stderr  # no training
    assert re.search(r"version \S+ \(now latest", again.stdout), again.stdout
