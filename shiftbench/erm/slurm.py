"""Training runs as one Slurm job array: the batch script, ``sbatch``, and watching the tasks to their end.

Thin plumbing over Slurm's own commands (``sbatch --parsable``, ``squeue``, ``scontrol show job``, ``sacct`` where
the cluster keeps accounting) rather than submitit: the job on the node is the same command the local path runs
(``python -m shiftbench.erm.job JOB.json``), so nothing is pickled and the nodes need shiftbench only; the job
checkpoints at its next step boundary when signalled and the batch script requeues it (submitit checkpoints
inside its signal handler, by pickling the function); and the watcher works without an accounting database
(submitit reads every state from ``sacct``). docs/clusters.md says so at more length.

The batch script (:func:`batch_script`) runs one task's job, forwards the time-limit warning (``--signal=B:USR1``,
sent to the batch shell only) to the job, and when the job then exits with ``EXIT_REQUEUE`` (75: it checkpointed,
:mod:`shiftbench.erm.interrupt`) requeues itself with ``scontrol requeue``; the requeued task runs the same command
and resumes. A requeue from outside (preemption, ``scontrol requeue``) signals the job directly (SIGTERM).

The watcher (:func:`watch`) polls the array, streams each task's new log lines, and reports each task once it has
left the queue, with its final state, exit code, node and Slurm's reason. Pure library: no Dagster, no torch.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shiftbench.erm.slurm_settings import ClusterSettings
from shiftbench.errors import InputError, ShiftbenchError

EXIT_REQUEUE = 75  # the job checkpointed after SIGTERM/SIGUSR1 (shiftbench.erm.interrupt.EXIT_REQUEUE)
SHARED_HINT = "the warehouse and the images must be on a filesystem the nodes share (docs/clusters.md)"
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL"}
    | {"DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)
POLL_S = 1.0  # logs are tailed this often; the queue too while tasks end
MAX_QUEUE_POLL_S = 30.0  # the longest pause between two squeue calls while nothing ends
_QUEUE_PATIENCE_S = 120.0  # squeue failing this long in a row: the controller is gone
_FIELD = re.compile(r"(\w+)=(\S*)")
_UNQUOTABLE = re.compile(r'["\x00-\x1f\x7f]')


class SlurmError(ShiftbenchError):
    """A Slurm command failed (not a run: the cluster, or the way it was asked)."""


@dataclass(frozen=True)
class Task:
    """One run of an array: its index, its name, the job description it runs and its log; ``array_id`` once the
    array is submitted (a task followed by a later process names the array an earlier one submitted)."""

    index: int
    run: str
    job_file: Path
    out_dir: Path
    log: Path
    array_id: str = ""

    @property
    def job_id(self) -> str:
        return f"{self.array_id}_{self.index}"


@dataclass
class TaskEnd:
    """A task that left the queue: Slurm's final word on it."""

    task: Task
    job_id: str  # <array>_<index>
    state: str
    exit_code: str = ""  # <code>:<signal>
    reason: str = ""
    node: str = ""
    seconds: float = 0.0
    restarts: int = 0  # requeues: preemption, a time limit the job checkpointed before, scontrol requeue
    log_seen: bool = True

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code in {"", "0:0"}

    def failure(self) -> str:
        """One line: the run, the job id, Slurm's state and reason, and what the job said last."""
        words = [self.state]
        if self.reason and self.reason not in {"None", "NonZeroExitCode"}:
            words.append(f"reason {self.reason}")
        if self.exit_code and self.exit_code != "0:0":
            words.append(f"exit code {self.exit_code}")
        where = f" on {self.node}" if self.node and self.node != "(null)" else ""
        said = "" if self.log_seen else f"; its log {self.task.log} never appeared: {SHARED_HINT}"
        last = _interrupted(self.task.out_dir) or (last_error(self.task.log) if self.log_seen else None)
        return (
            f"{self.task.run}: Slurm job {self.job_id} {', '.join(words)}{where}" + (f": {last}" if last else "") + said
        )


def _interrupted(out_dir: Path) -> str | None:
    """The line of a job stopped on a signal after its checkpoint (``interrupted.json``, shiftbench.erm.interrupt)."""
    path = out_dir / "interrupted.json"
    try:
        return str(json.loads(path.read_text("utf-8"))["line"]) if path.is_file() else None
    except (OSError, ValueError, KeyError):
        return None


def last_error(log: Path) -> str | None:
    """The job's last ``error:`` line (a bad input, a node that does not see the warehouse), if any."""
    if not log.is_file():
        return None
    lines = log.read_text("utf-8", errors="replace").splitlines()
    errors = [line.split("error:", 1)[1].strip() for line in lines if "error:" in line and "slurmstepd" not in line]
    return errors[-1] if errors else None


def batch_script(cluster: ClusterSettings, tasks: Sequence[Task], python: str, parallelism: int, name: str) -> str:
    """The array's batch script: one task per run, ``parallelism`` at a time, requeueable."""
    logs = str(tasks[0].log.parent / "task-%a.log")
    if _UNQUOTABLE.search(logs):
        raise InputError(
            "the warehouse's path holds a double quote, a newline or another control character: it cannot be named "
            f"in the batch script's #SBATCH --output line ({logs!r})",
            parameter="SHIFTBENCH_HOME",
        )
    options = [
        f"--job-name={name}",
        f"--array=0-{len(tasks) - 1}%{parallelism}",
        f'--output="{logs}"',  # quoted: sbatch reads a path with spaces whole
        "--open-mode=append",  # a requeued task's lines follow the interrupted attempt's
        "--requeue",
        f"--signal=B:USR1@{cluster.warning_seconds}",
        *cluster.sbatch_lines(),
    ]
    jobs = " ".join(shlex.quote(str(t.job_file)) for t in tasks)
    runs = " ".join(shlex.quote(t.run) for t in tasks)
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options), _BODY_HEAD]
    lines += [f"jobs=({jobs})", f"runs=({runs})", f"python={shlex.quote(python)}", *cluster.setup, _BODY]
    return "\n".join(lines) + "\n"


_BODY_HEAD = "# Written by shiftbench (shiftbench.erm.slurm): one training run per array task.\nset -u"
_BODY = r"""i=${SLURM_ARRAY_TASK_ID:-0}
job=${jobs[$i]}
attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))
echo "[slurm] ${runs[$i]}: job ${SLURM_ARRAY_JOB_ID}_$i (id $SLURM_JOB_ID) on $(hostname), attempt $attempt"
if [ ! -r "$job" ]; then
  echo "[slurm] error: $(hostname) does not see $job: SHARED_HINT"
  exit 2
fi
export PYTHONUNBUFFERED=1
warned=0
# The time-limit warning reaches this shell only (--signal=B:USR1): pass it on; the job checkpoints at its next
# step. SIGTERM (preemption, scancel, scontrol requeue) reaches the job directly: this shell waits for it.
trap 'warned=1; kill -USR1 "$child" 2>/dev/null' USR1
trap ':' TERM
"$python" -m shiftbench.erm.job "$job" 2>&1 &
child=$!
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || break
done
echo "[slurm] ${runs[$i]}: attempt $attempt ended with exit code $rc"
if [ "$rc" = EXIT_REQUEUE ] && [ "$warned" = 1 ]; then
  echo "[slurm] ${runs[$i]}: checkpointed before the time limit; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  sleep 300  # the requeue ends this attempt
fi
exit "$rc"
""".replace("SHARED_HINT", SHARED_HINT).replace("EXIT_REQUEUE", str(EXIT_REQUEUE))


def submit(script: Path) -> str:
    """``sbatch --parsable`` the script; the array's job id."""
    if shutil.which("sbatch") is None:
        raise InputError("sbatch is not on PATH: submit from a machine of the Slurm cluster", parameter="--backend")
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise InputError(f"sbatch refused the jobs: {message.removeprefix('sbatch: error: ')}", path=script)
    return done.stdout.strip().split(";")[0]


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, check=False)


def partition_nodes(partition: str | None) -> int | None:
    """How many nodes the partition (default: the default one) has; None when sinfo cannot say."""
    command = ["sinfo", "-h", "-o", "%D|%P"] + (["-p", partition] if partition else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split("|") for line in done.stdout.splitlines() if "|" in line]
    if done.returncode != 0 or not rows:
        return None
    chosen = rows if partition else [r for r in rows if r[1].endswith("*")] or rows
    return sum(int(r[0]) for r in chosen if r[0].isdigit())


@dataclass
class _Tail:
    """New complete lines of a growing log."""

    path: Path
    offset: int = 0
    rest: bytes = b""
    seen: bool = False

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.seen = True
        self.offset += len(data)
        *complete, self.rest = (self.rest + data).split(b"\n")
        return [line.decode("utf-8", errors="replace") for line in complete]


@dataclass
class Watch:
    """The tasks still to report, and their logs."""

    tasks: Sequence[Task]
    started: float = field(default_factory=time.monotonic)
    tails: dict[str, _Tail] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tails = {t.job_id: _Tail(t.log) for t in self.tasks}


class Signalled(Exception):
    """A stop signal reached the process following the jobs (:func:`shiftbench.erm.stops.take_stop`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def sleep(seconds: float) -> int | None:
    """The watcher's pause where no stop signal is taken (a Dagster run, a library caller)."""
    time.sleep(seconds)
    return None


def watch(
    tasks: Sequence[Task],
    on_line: Callable[[Task, str], None],
    on_end: Callable[[TaskEnd], None],
    poll_s: float = POLL_S,
    wait: Callable[[float], int | None] = sleep,
) -> list[TaskEnd]:
    """Wait for every task (of one array or several); stream their log lines every ``poll_s``; ``on_end`` sees each
    task as it ends. The queue is asked less often the longer nothing ends (``poll_s`` doubling up to
    :data:`MAX_QUEUE_POLL_S`), and again at once when a task's log says its attempt ended. ``wait`` sleeps between
    polls and returns a stop signal that arrived (raised as :class:`Signalled`)."""
    state = Watch(tasks)
    waiting = {t.job_id: t for t in tasks}
    ended: list[TaskEnd] = []
    failing_since: float | None = None
    interval, next_query = poll_s, 0.0
    while waiting:
        if _stream(state, waiting, on_line):
            next_query, interval = 0.0, poll_s  # an attempt ended: ask the queue now, and soon again
        if time.monotonic() >= next_query:
            queued = _queued({t.array_id for t in waiting.values()})
            if queued is None:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > _QUEUE_PATIENCE_S:
                    raise SlurmError(f"squeue has failed for {_QUEUE_PATIENCE_S:.0f} s: is slurmctld up?")
            else:
                failing_since = None
            gone = [job for job in waiting if queued is not None and job not in queued]
            for job in gone:
                end = _final(waiting.pop(job), state)
                _stream(state, {job: end.task}, on_line)
                ended.append(end)
                on_end(end)
            interval = poll_s if gone else interval
            next_query = time.monotonic() + interval
            interval = min(interval * 2, MAX_QUEUE_POLL_S)
        if waiting and (signum := wait(poll_s)) is not None:
            raise Signalled(signum)
    return ended


def _stream(state: Watch, tasks: dict[str, Task], on_line: Callable[[Task, str], None]) -> bool:
    """Print the tasks' new log lines; True when one says an attempt ended (the batch script's last line)."""
    attempt_ended = False
    for job, task in tasks.items():
        for line in state.tails[job].lines():
            on_line(task, line)
            attempt_ended = attempt_ended or (line.startswith("[slurm] ") and " ended with exit code " in line)
    return attempt_ended


def _queued(array_ids: set[str]) -> set[str] | None:
    """The tasks of these arrays still in the queue (pending, running, completing) as ``<array>_<index>``; None if
    squeue failed. One query for all of them."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "-r", "-j", ",".join(sorted(array_ids)), "-o", "%F_%K"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        # Arrays the controller forgot (finished) are "Invalid job id": nothing of them queued.
        return set() if "Invalid job id" in done.stderr else None
    return {word for word in done.stdout.split() if re.fullmatch(r"\d+_\d+", word)}


def queued(task: Task) -> bool | None:
    """Whether the task is still in the queue (None: squeue cannot say)."""
    found = _queued({task.array_id})
    return None if found is None else task.job_id in found


def _final(task: Task, state: Watch) -> TaskEnd:
    """The task's final record: ``scontrol show job`` while the controller keeps it, else ``sacct``."""
    job_id = task.job_id
    record = _scontrol(job_id) or _sacct(job_id) or {}
    end = TaskEnd(
        task,
        job_id,
        state=record.get("JobState", "UNKNOWN").split()[0],
        exit_code=record.get("ExitCode", ""),
        reason=record.get("Reason", ""),
        node=record.get("NodeList", ""),
        seconds=time.monotonic() - state.started,
        restarts=int(record.get("Restarts", "0") or 0),
        log_seen=task.log.is_file(),
    )
    return end


def _scontrol(job_id: str) -> dict[str, str] | None:
    try:
        done = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    record = dict(_FIELD.findall(done.stdout.splitlines()[0]))
    return record if record.get("JobState") in FINAL_STATES else None


_SACCT_FIELDS = {"State": "JobState", "ExitCode": "ExitCode", "NodeList": "NodeList", "Reason": "Reason",
                 "Restarts": "Restarts"}  # fmt: skip


def _sacct(job_id: str) -> dict[str, str] | None:
    """Accounting's record of the task (a cluster with slurmdbd), in ``scontrol``'s field names; None without
    accounting. A Slurm whose sacct has no ``Restarts`` field is asked again without it."""
    fields = list(_SACCT_FIELDS)
    for _ in range(2):
        try:
            done = subprocess.run(
                ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", ",".join(fields)],
                capture_output=True, text=True, check=False, timeout=60,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 and "Restarts" in fields and "Restarts" in done.stderr:
            fields.remove("Restarts")
            continue
        rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == len(fields) - 1]
        if done.returncode != 0 or not rows:
            return None
        return {_SACCT_FIELDS[name]: value for name, value in zip(fields, rows[-1], strict=True)}
    return None


def execution(task_end: TaskEnd) -> dict[str, object]:
    """Where the run trained, for its manifest (shiftbench.erm.launch.record_execution)."""
    return {
        "backend": "slurm",
        "job_id": task_end.job_id,
        "node": task_end.node,
        "restarts": task_end.restarts,
    }


def recorded_execution(task: Task | None) -> dict[str, object]:
    """Where a run trained whose job an earlier process followed (or none did): what the controller or accounting
    still knows of the job, else its id alone."""
    if task is None:
        return {"backend": "slurm"}
    record = _scontrol(task.job_id) or _sacct(task.job_id) or {}
    return {
        "backend": "slurm",
        "job_id": task.job_id,
        "node": record.get("NodeList", ""),
        "restarts": int(record.get("Restarts", "0") or 0),
    }
