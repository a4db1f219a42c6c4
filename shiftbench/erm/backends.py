"""Where training runs: the Slurm backend of a sweep (``shiftbench train ... --backend slurm``) and of one run
(the ERM asset with ``SHIFTBENCH_TRAIN_BACKEND=slurm``).

The split of work is the local path's: the job on the node only trains and writes its outputs to the run's
folder under the warehouse (``runs/<run>``); this process, the submitter, publishes each finished run with the
same code as a local run (:func:`shiftbench.erm.launch.publish_run`, or the asset's stage-then-publish). So the
warehouse must be on a filesystem the nodes share: a warehouse under ``/tmp`` is refused when the partition has
more than one node, and a task whose log never appears (its node could not write to the shared folder) is
reported as such.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from shiftbench.erm import slurm
from shiftbench.erm.launch import RunPlan, headline, publish_run, record_execution
from shiftbench.erm.slurm_settings import ClusterSettings
from shiftbench.erm.sweep import RunOutcome
from shiftbench.errors import InputError, ShiftbenchError
from shiftbench.settings import Settings

BACKENDS = ("local", "slurm")
# What a job leaves in its run folder: an earlier attempt's are removed before submitting (its checkpoint stays).
_OUTPUTS = ("run.json", "metrics.parquet", "curve.parquet", "model.pt", "error.json", "execution.json")
_LOCAL_ONLY = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


class RunFailed(ShiftbenchError):
    """A Slurm job of a run failed, was cancelled or died with its node (its one line)."""


@dataclass(frozen=True)
class Submission:
    """An array submitted: its id, its folder (script, job descriptions, logs) and its tasks."""

    array_id: str
    folder: Path
    tasks: list[slurm.Task]


def check_shared(settings: Settings, cluster: ClusterSettings) -> None:
    """Refuse the obvious misuse: a warehouse on a node-local filesystem with a partition of several nodes."""
    home = settings.runs_dir.resolve()
    local = next((root for root in _LOCAL_ONLY if home.is_relative_to(root)), None)
    if local is None:
        return
    nodes = slurm.partition_nodes(cluster.partition)
    if nodes is not None and nodes > 1:
        raise InputError(
            f"the warehouse's runs folder {home} is under {local}, local to each node, and partition "
            f"{cluster.partition or '(default)'} has {nodes} nodes: {slurm.SHARED_HINT}",
            parameter="SHIFTBENCH_HOME",
        )


def submit_runs(settings: Settings, cluster: ClusterSettings, plans: Sequence[RunPlan], parallelism: int) -> Submission:
    """Write each run's job description and the array's script under ``runs/slurm/<time>``, then ``sbatch`` it."""
    check_shared(settings, cluster)
    folder = settings.runs_dir / "slurm" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    while folder.exists():
        folder = folder.with_name(folder.name + "-1")
    folder.mkdir(parents=True)
    tasks = []
    for index, plan in enumerate(plans):
        out_dir = settings.runs_dir / plan.run
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in _OUTPUTS:
            (out_dir / name).unlink(missing_ok=True)
        job_file = folder / f"job-{index}.json"
        job_file.write_text(json.dumps(plan.job(out_dir), indent=2, sort_keys=True), encoding="utf-8")
        tasks.append(slurm.Task(index, plan.run, job_file, out_dir, folder / f"task-{index}.log"))
    script = folder / "sweep.sbatch"
    python = cluster.python or sys.executable
    script.write_text(slurm.batch_script(cluster, tasks, python, parallelism, "shiftbench-train"), encoding="utf-8")
    return Submission(slurm.submit(script), folder, tasks)


def finish_run(settings: Settings, plan: RunPlan, end: slurm.TaskEnd) -> RunOutcome:
    """A task that left the queue: published when it completed with its outputs, else its one failure line."""
    outcome = RunOutcome(plan, 0 if end.ok else 1, end.seconds, end.task.log)
    if not end.ok or not (end.task.out_dir / "run.json").is_file():
        failure = end.failure() if not end.ok else f"{plan.run}: Slurm job {end.job_id} left no outputs"
        outcome.exit_code, outcome.error = outcome.exit_code or 1, failure.removeprefix(f"{plan.run}: ")
        if end.state == "FAILED" and end.exit_code.startswith("2:"):
            outcome.exit_code = 2  # the job refused a bad input (shiftbench.erm.job)
        return outcome
    record_execution(end.task.out_dir, slurm.execution(end))
    published, _summary = publish_run(settings, plan, end.task.out_dir)
    outcome.version = published.staged.version
    outcome.became_latest = published.publication.changed_latest
    outcome.headline = {
        key: value
        for key, value in headline(pl.read_parquet(published.staged.table_path("erm_results"))).items()
        if value is not None
    }
    shutil.rmtree(end.task.out_dir, ignore_errors=True)  # published: the scratch folder (and checkpoint) goes
    return outcome


def run_sweep(
    settings: Settings,
    cluster: ClusterSettings,
    plans: Sequence[RunPlan],
    parallelism: int,
    on_line: Callable[[str, str], None],
    on_finish: Callable[[RunOutcome], None],
    on_submitted: Callable[[Submission], None] = lambda _: None,
) -> list[RunOutcome]:
    """The sweep as one job array, ``parallelism`` tasks at a time; each finished run published as it ends.

    A failed, cancelled or lost task fails alone: the others still publish. Interrupted here (Ctrl-C), the array
    is cancelled: its jobs checkpoint on SIGTERM and the same command resumes them.
    """
    submission = submit_runs(settings, cluster, plans, parallelism)
    on_submitted(submission)
    by_index = dict(enumerate(plans))
    outcomes: list[RunOutcome] = []

    def ended(end: slurm.TaskEnd) -> None:
        outcome = finish_run(settings, by_index[end.task.index], end)
        outcomes.append(outcome)
        on_finish(outcome)

    try:
        slurm.watch(submission.array_id, submission.tasks, lambda task, line: on_line(task.run, line), ended)
    except KeyboardInterrupt:
        slurm.cancel(submission.array_id)
        raise
    return outcomes


def train_one(
    settings: Settings, cluster: ClusterSettings, plan: RunPlan, out_dir: Path, log: Callable[[str], None]
) -> None:
    """One run as a Slurm job (an array of one) writing to ``out_dir``; its log lines to ``log``. Returns once the
    job completed with its outputs (the caller stages and publishes them); raises :class:`RunFailed` otherwise."""
    check_shared(settings, cluster)
    folder = out_dir.parent / f"{out_dir.name}.slurm"
    folder.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = folder / "job-0.json"
    job_file.write_text(json.dumps(plan.job(out_dir), indent=2, sort_keys=True), encoding="utf-8")
    task = slurm.Task(0, plan.run, job_file, out_dir, folder / "task-0.log")
    script = folder / "run.sbatch"
    script.write_text(
        slurm.batch_script(cluster, [task], cluster.python or sys.executable, 1, "shiftbench-train"), encoding="utf-8"
    )
    array_id = slurm.submit(script)
    log(f"{plan.run}: submitted as Slurm job {array_id}_0 (log {task.log})")
    ends: list[slurm.TaskEnd] = []
    try:
        slurm.watch(array_id, [task], lambda _, line: log(line), ends.append)
    except BaseException:
        slurm.cancel(array_id)
        raise
    end = ends[0]
    if not end.ok or not (out_dir / "run.json").is_file():
        raise RunFailed(end.failure() + "; nothing published")
    record_execution(end.task.out_dir, slurm.execution(end))
    shutil.rmtree(folder, ignore_errors=True)


def default_parallelism(cluster: ClusterSettings, parallel: int | None, n_runs: int) -> int:
    """Tasks of the array at a time: ``--parallel``, else the settings' ``array_parallelism``, else every run."""
    if parallel is not None and parallel < 1:
        raise InputError("must be at least 1", parameter="--parallel")
    chosen = parallel or cluster.array_parallelism or n_runs
    return max(1, min(chosen, n_runs))
