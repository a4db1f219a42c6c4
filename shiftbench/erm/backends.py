"""Where training runs: the Slurm backend of a sweep (``shiftbench train ... --backend slurm``) and of one run
(the ERM asset with ``SHIFTBENCH_TRAIN_BACKEND=slurm``).

The split of work is the local path's: the job on the node only trains and writes its outputs to the run's
folder under the warehouse (``runs/<run>``); the process that follows the jobs publishes each finished run with the
same code as a local run (:func:`shiftbench.erm.launch.publish_run`, or the asset's stage-then-publish). So the
warehouse must be on a filesystem the nodes share: a warehouse under ``/tmp`` is refused when the partition has
more than one node, and a task whose log never appears (its node could not write to the shared folder) is
reported as such.

Nothing depends on the submitting process staying alive: each run's folder records the Slurm job that trains it
(``slurm.json``) and keeps the job's outputs until they are published, so the same command run again (after an ssh
drop, a SIGHUP, a reboot of the login node) takes every run where it stands (:func:`take_stock`): a finished one is
published without training, one still queued is followed, a stopped one is resubmitted and resumes from its
checkpoint, and only one that never ran or failed is submitted afresh. submitit keeps results under job ids the same
way, for any later process to collect.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.erm import run_folder, slurm
from shiftbench.erm.launch import FAMILY, RunPlan, headline, publish_run, record_execution
from shiftbench.erm.slurm_settings import ClusterSettings
from shiftbench.erm.sweep import RunOutcome
from shiftbench.errors import InputError, ShiftbenchError
from shiftbench.store import Store

BACKENDS = ("local", "slurm")
SUBMITTED = "slurm.json"  # in a run's folder: the Slurm job that trains it
_LOCAL_ONLY = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


class RunFailed(ShiftbenchError):
    """A Slurm job of a run failed, was cancelled or died with its node (its one line)."""


class SweepStopped(ShiftbenchError):
    """A stop signal reached the process following the jobs: what it did about them (its line), the exit code and
    the outcomes of the runs that ended before."""

    def __init__(self, line: str, exit_code: int, outcomes: list[RunOutcome]) -> None:
        super().__init__(line)
        self.exit_code, self.outcomes = exit_code, outcomes


@dataclass(frozen=True)
class Submission:
    """An array submitted: its id, its folder (script, job descriptions, logs) and its tasks."""

    array_id: str
    folder: Path
    tasks: list[slurm.Task]


@dataclass(frozen=True)
class Standing:
    """Where one run of a sweep stands when the command starts: ``published`` (its latest version is this training:
    nothing to do), ``finished`` (its outputs wait to be published), ``queued`` (a job of an earlier command still
    trains it: followed), ``stopped`` (a checkpoint, no job: resubmitted, it resumes), ``failed`` (a job ended without
    outputs: resubmitted) or ``new``; and the line that says so."""

    plan: RunPlan
    out_dir: Path
    state: str
    line: str
    task: slurm.Task | None = None  # the queued job's task


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


def _same_training(config: dict[str, Any], plan: RunPlan) -> bool:
    """Whether ``config`` (a run's recorded training config) is the one ``plan`` trains."""
    trained = {k: v for k, v in config.items() if k not in run_folder.UNBOUND}
    wanted = {k: v for k, v in json.loads(json.dumps(plan.config)).items() if k not in run_folder.UNBOUND}
    return trained == wanted


def finished_outputs(plan: RunPlan, out_dir: Path) -> dict[str, Any] | None:
    """The summary of outputs in ``out_dir`` that finish ``plan`` (its split version and training config), if any."""
    summary = run_folder.finished(out_dir)
    if summary is None or summary.get("split_version") != plan.split_version:
        return None
    return summary if _same_training(dict(summary.get("config") or {}), plan) else None


def published_version(settings: Settings, plan: RunPlan) -> str | None:
    """The run's latest published version when it is this plan's (same split version and training config)."""
    store = Store(settings.store_dir)
    latest = store.log.latest(plan.run, FAMILY)
    if latest is None:
        return None
    runs = pl.read_parquet(store.layout.staged(FAMILY, plan.run, latest.version).table_path("erm_runs")).row(
        0, named=True
    )
    config = {k: v for k, v in json.loads(runs["config"]).items() if k != "init"}
    same = runs["split_version"] == plan.split_version and _same_training(config, plan)
    return latest.version if same else None


def recorded_task(out_dir: Path) -> slurm.Task | None:
    """The Slurm task ``slurm.json`` says trains the run (None: no record, or one this version cannot read)."""
    try:
        raw = json.loads((out_dir / SUBMITTED).read_text("utf-8"))
        return slurm.Task(
            int(raw["index"]), str(raw["run"]), Path(raw["job_file"]), out_dir, Path(raw["log"]), str(raw["array_id"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_task(task: slurm.Task) -> None:
    record = {"array_id": task.array_id, "index": task.index, "job_id": task.job_id, "run": task.run,
              "job_file": str(task.job_file), "log": str(task.log)}  # fmt: skip
    run_folder.write_json(task.out_dir / SUBMITTED, record)


def take_stock(settings: Settings, plans: Sequence[RunPlan], *, restart: bool = False) -> list[Standing]:
    """Where each run stands, from its folder, the queue and the store (one line each, :class:`Standing`). With
    ``restart`` every run is new: what an earlier attempt left is discarded (a job of it still queued is cancelled)
    and a published run is trained again."""
    standings = []
    for plan in plans:
        out_dir = settings.runs_dir / plan.run
        task = recorded_task(out_dir)
        if restart:
            if task is not None and slurm.queued(task):
                slurm.cancel(task.job_id)
            shutil.rmtree(out_dir, ignore_errors=True)
            standings.append(Standing(plan, out_dir, "new", "submitted (--restart: anything earlier discarded)"))
            continue
        version = published_version(settings, plan) if not out_dir.exists() else None
        if version is not None:
            standings.append(
                Standing(plan, out_dir, "published", f"already published as version {version}: nothing to train "
                         "(--restart trains it again)")
            )  # fmt: skip
        elif finished_outputs(plan, out_dir) is not None:
            by = f" by job {task.job_id}" if task else ""
            standings.append(Standing(plan, out_dir, "finished", f"finished{by}: publishing it, nothing retrained"))
        elif task is not None and slurm.queued(task):
            standings.append(Standing(plan, out_dir, "queued", f"job {task.job_id} still has it: following it", task))
        elif (out_dir / run_folder.RESUME / "state.json").is_file():
            where = _checkpoint_iteration(out_dir)
            standings.append(
                Standing(plan, out_dir, "stopped", f"stopped{where} with a checkpoint: resubmitted, it resumes")
            )
        elif task is not None or (out_dir / run_folder.ERROR_JSON).is_file():
            why = _last_words(out_dir, task)
            standings.append(Standing(plan, out_dir, "failed", f"ended without outputs{why}: resubmitted"))
        else:
            standings.append(Standing(plan, out_dir, "new", "submitted"))
    return standings


def _checkpoint_iteration(out_dir: Path) -> str:
    try:
        return f" at iteration {int(json.loads((out_dir / run_folder.RESUME / 'state.json').read_text())['iteration'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _last_words(out_dir: Path, task: slurm.Task | None) -> str:
    error = out_dir / run_folder.ERROR_JSON
    said = None
    if error.is_file():
        try:
            said = str(json.loads(error.read_text("utf-8"))["error"])
        except (OSError, ValueError, KeyError, TypeError):
            said = None
    if said is None and task is not None:
        said = slurm.last_error(task.log)
    job = f" (job {task.job_id})" if task is not None else ""
    return f"{job}{f': {said}' if said else ''}"


def submit_runs(settings: Settings, cluster: ClusterSettings, plans: Sequence[RunPlan], parallelism: int) -> Submission:
    """Write each run's job description and the array's script under ``runs/slurm/<time>``, ``sbatch`` it, and record
    in each run's folder the task that trains it (``slurm.json``): a later command follows it from there. Nothing an
    earlier attempt left is removed here: the job itself discards stale outputs and resumes from a checkpoint."""
    check_shared(settings, cluster)
    folder = settings.runs_dir / "slurm" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    while folder.exists():
        folder = folder.with_name(folder.name + "-1")
    folder.mkdir(parents=True)
    tasks = []
    for index, plan in enumerate(plans):
        out_dir = settings.runs_dir / plan.run
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SUBMITTED).unlink(missing_ok=True)
        job_file = folder / f"job-{index}.json"
        job = {**plan.job(out_dir), "max_stalled_attempts": cluster.max_stalled_attempts}
        job_file.write_text(json.dumps(job, indent=2, sort_keys=True), encoding="utf-8")
        tasks.append(slurm.Task(index, plan.run, job_file, out_dir, folder / f"task-{index}.log"))
    script = folder / "sweep.sbatch"
    python = cluster.python or sys.executable
    script.write_text(slurm.batch_script(cluster, tasks, python, parallelism, "shiftbench-train"), encoding="utf-8")
    array_id = slurm.submit(script)
    tasks = [replace(task, array_id=array_id) for task in tasks]
    for task in tasks:
        _record_task(task)
    return Submission(array_id, folder, tasks)


def finish_run(settings: Settings, plan: RunPlan, end: slurm.TaskEnd | None, out_dir: Path) -> RunOutcome:
    """A run whose job left the queue (or whose outputs an earlier command's job left): published when its outputs
    are there, else its one failure line. The folder goes only once the run is in the store."""
    log = end.task.log if end is not None else out_dir / run_folder.RUN_JSON
    outcome = RunOutcome(plan, 0, end.seconds if end is not None else 0.0, log)
    if finished_outputs(plan, out_dir) is None:
        assert end is not None  # a run taken as finished has its outputs
        failure = end.failure() if not end.ok else f"{plan.run}: Slurm job {end.job_id} left no outputs"
        outcome.exit_code, outcome.error = 1, failure.removeprefix(f"{plan.run}: ")
        if end.state == "FAILED" and end.exit_code.startswith("2:"):
            outcome.exit_code = 2  # the job refused a bad input, or gave up (shiftbench.erm.job)
        return outcome
    if end is not None or not (out_dir / "execution.json").is_file():
        task = end.task if end is not None else recorded_task(out_dir)
        record_execution(out_dir, slurm.execution(end) if end is not None else slurm.recorded_execution(task))
    published, _summary = publish_run(settings, plan, out_dir)
    outcome.version = published.staged.version
    outcome.became_latest = published.publication.changed_latest
    outcome.headline = {
        key: value
        for key, value in headline(pl.read_parquet(published.staged.table_path("erm_results"))).items()
        if value is not None
    }
    shutil.rmtree(out_dir, ignore_errors=True)  # published: the scratch folder (and checkpoint) goes
    return outcome


def run_sweep(
    settings: Settings,
    cluster: ClusterSettings,
    plans: Sequence[RunPlan],
    parallelism: int,
    on_line: Callable[[str, str], None],
    on_finish: Callable[[RunOutcome], None],
    on_submitted: Callable[[Submission | None, list[Standing]], None] = lambda *_: None,
    wait: Callable[[float], int | None] = slurm.sleep,
    *,
    restart: bool = False,
) -> list[RunOutcome]:
    """The sweep: every run taken where it stands (:func:`take_stock`); finished ones published now, queued ones
    followed, the others submitted as one job array, ``parallelism`` tasks at a time; each published as it ends.

    A failed, cancelled or lost task fails alone: the others still publish. A stop signal (``wait`` returns it):
    SIGINT cancels the jobs (they checkpoint on Slurm's SIGTERM; the same command resumes them), SIGTERM, SIGUSR1 or
    SIGHUP leave them running (the same command collects them): :class:`SweepStopped` either way.
    """
    standings = take_stock(settings, plans, restart=restart)
    outcomes: list[RunOutcome] = []
    to_submit = [s.plan for s in standings if s.state in {"stopped", "failed", "new"}]
    submission = submit_runs(settings, cluster, to_submit, min(parallelism, len(to_submit))) if to_submit else None
    on_submitted(submission, standings)
    by_job: dict[str, RunPlan] = {}
    for standing in standings:
        if standing.state == "finished":
            outcome = finish_run(settings, standing.plan, None, standing.out_dir)
        elif standing.state == "published":
            outcome = RunOutcome(standing.plan, 0, 0.0, standing.out_dir, version=published_version(
                settings, standing.plan))  # fmt: skip
        else:
            continue
        outcomes.append(outcome)
        on_finish(outcome)
    followed = [s.task for s in standings if s.task is not None]
    followed += submission.tasks if submission is not None else []
    by_job = {task.job_id: plans_by_run(plans)[task.run] for task in followed}

    def ended(end: slurm.TaskEnd) -> None:
        outcome = finish_run(settings, by_job[end.task.job_id], end, end.task.out_dir)
        outcomes.append(outcome)
        on_finish(outcome)

    try:
        slurm.watch(followed, lambda task, line: on_line(task.run, line), ended, wait=wait)
    except slurm.Signalled as stopped:
        raise _stopped(stopped.signum, {t.array_id for t in followed}, outcomes) from None
    return outcomes


def plans_by_run(plans: Sequence[RunPlan]) -> dict[str, RunPlan]:
    return {plan.run: plan for plan in plans}


def _stopped(signum: int, arrays: set[str], outcomes: list[RunOutcome]) -> SweepStopped:
    """What a stop signal does to the jobs followed: SIGINT (a person) cancels them, the others leave them running."""
    if signum == signal.SIGINT:
        for array in sorted(arrays):
            slurm.cancel(array)
        return SweepStopped(
            "interrupted: the jobs were cancelled (each checkpoints on Slurm's SIGTERM); nothing more is published; "
            "run the same command again to resume them",
            130,
            outcomes,
        )
    name = signal.Signals(signum).name
    return SweepStopped(
        f"stopped by {name}: the jobs go on in Slurm; run the same command again to publish what finished and follow "
        "the rest",
        75,
        outcomes,
    )


def train_one(
    settings: Settings, cluster: ClusterSettings, plan: RunPlan, out_dir: Path, log: Callable[[str], None]
) -> None:
    """One run as a Slurm job (an array of one) writing to ``out_dir``; its log lines to ``log``. Returns once the
    run's outputs are there (the caller stages and publishes them): at once when an earlier attempt's job finished
    them, after following the job an earlier attempt submitted when it is still queued, else after a new job.
    Raises :class:`RunFailed` when the job ends without them."""
    check_shared(settings, cluster)
    out_dir.mkdir(parents=True, exist_ok=True)
    task = recorded_task(out_dir)
    if finished_outputs(plan, out_dir) is not None:
        log(f"{plan.run}: finished by an earlier job{f' ({task.job_id})' if task else ''}; nothing retrained")
        if task is not None and not (out_dir / "execution.json").is_file():
            record_execution(out_dir, slurm.recorded_execution(task))
        return
    if task is None or not slurm.queued(task):
        task = _submit_one(settings, cluster, plan, out_dir)
        log(f"{plan.run}: submitted as Slurm job {task.job_id} (log {task.log})")
    else:
        log(f"{plan.run}: Slurm job {task.job_id} of an earlier attempt still has it: following it")
    ends: list[slurm.TaskEnd] = []
    try:
        slurm.watch([task], lambda _, line: log(line), ends.append)
    except BaseException:
        slurm.cancel(task.array_id)
        raise
    end = ends[0]
    if not end.ok or finished_outputs(plan, out_dir) is None:
        raise RunFailed(end.failure() + "; nothing published")
    record_execution(end.task.out_dir, slurm.execution(end))
    shutil.rmtree(task.job_file.parent, ignore_errors=True)


def _submit_one(settings: Settings, cluster: ClusterSettings, plan: RunPlan, out_dir: Path) -> slurm.Task:
    folder = out_dir.parent / f"{out_dir.name}.slurm"
    folder.mkdir(parents=True, exist_ok=True)
    job_file = folder / "job-0.json"
    job = {**plan.job(out_dir), "max_stalled_attempts": cluster.max_stalled_attempts}
    job_file.write_text(json.dumps(job, indent=2, sort_keys=True), encoding="utf-8")
    task = slurm.Task(0, plan.run, job_file, out_dir, folder / "task-0.log")
    script = folder / "run.sbatch"
    script.write_text(
        slurm.batch_script(cluster, [task], cluster.python or sys.executable, 1, "shiftbench-train"), encoding="utf-8"
    )
    task = replace(task, array_id=slurm.submit(script))
    _record_task(task)
    return task


def default_parallelism(cluster: ClusterSettings, parallel: int | None, n_runs: int) -> int:
    """Tasks of the array at a time: ``--parallel``, else the settings' ``array_parallelism``, else every run."""
    if parallel is not None and parallel < 1:
        raise InputError("must be at least 1", parameter="--parallel")
    chosen = parallel or cluster.array_parallelism or n_runs
    return max(1, min(chosen, n_runs))
