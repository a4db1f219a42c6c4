"""A training run's folder (``runs/<run>``): what it holds, which state that means, and writes that a kill cannot tear.

The folder is the same for every attempt of a run, whoever launches it (``shiftbench train``, a sweep, the
Dagster asset, a Slurm task, a pod), so any later process can tell what an earlier one left:

- **finished**: ``run.json`` is written last, atomically, after every other output (``metrics.parquet``,
  ``curve.parquet``, ``model.pt``, ``conflicts.parquet`` with ``track_conflicts``); it is the commit. A finished
  folder is published as it is and never trained again, whatever happens to the process afterwards (a kill while
  the checkpoint is discarded, during publishing, before the folder is removed);
- **stopped**: a checkpoint (``resume/state.json``) and no ``run.json``: the next attempt resumes from it;
- **failed**: ``error.json`` (a bad input the job named) and nothing newer;
- **empty**: nothing of the above.

``attempts.jsonl`` keeps one line per attempt that stopped on a signal (where it started and stopped, which
signal, the Slurm job): the job counts attempts that made no progress across requeues and gives up past a limit
(:func:`stalled`), and the launchers tell a time limit from a preemption in the run's ``execution`` record.

Pure standard library: the lean training job imports it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_JSON = "run.json"
ERROR_JSON = "error.json"
INTERRUPTED_JSON = "interrupted.json"
ATTEMPTS = "attempts.jsonl"
RESUME = "resume"
OUTPUTS = ("metrics.parquet", "curve.parquet", "model.pt")
# A previous attempt's words, removed when an attempt starts training (its checkpoint is kept: it resumes from it).
STALE = (ERROR_JSON, INTERRUPTED_JSON, RUN_JSON, "conflicts.parquet", *OUTPUTS)
# What each stop signal means to a scheduler (docs/clusters.md): Slurm sends SIGUSR1 before the time limit
# (--signal=B:USR1), SIGTERM when it preempts, requeues or cancels; a terminal SIGINT or SIGHUP.
CAUSES = {"SIGUSR1": "time limit", "SIGTERM": "preemption or cancel", "SIGINT": "stopped by a person",
          "SIGHUP": "hang-up"}  # fmt: skip
MAX_STALLED_ATTEMPTS = 3  # submitit's max_num_timeout
# Keys of the training config that do not change a run's bytes: a resumed run may change them, and finished outputs
# of the run serve whatever they say (shiftbench.erm.resume, shiftbench.erm.backends).
UNBOUND = frozenset({"checkpoint_every"})


def write_atomically(path: Path, data: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the folder: ``path`` holds the old bytes or the new, never a mix."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("wb") as sink:
        sink.write(data)
        sink.flush()
        os.fsync(sink.fileno())
    temporary.replace(path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_json(path: Path, value: Mapping[str, Any]) -> None:
    write_atomically(path, json.dumps(dict(value), indent=2, sort_keys=True).encode())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def finished(out_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run (``run.json`` and every output it lists present), else None."""
    summary = _read_json(out_dir / RUN_JSON)
    if summary is None or not all((out_dir / name).is_file() for name in OUTPUTS):
        return None
    if summary.get("config", {}).get("track_conflicts") and not (out_dir / "conflicts.parquet").is_file():
        return None
    return summary


def discard_checkpoints(out_dir: Path, before_delete: Callable[[], None] = lambda: None) -> None:
    """Remove ``resume/`` as one step: renamed away first (atomic), then deleted. A kill in between leaves a folder
    that nothing reads, never a ``state.json`` naming a file already deleted."""
    folder = out_dir / RESUME
    if folder.exists():
        discarded = out_dir / f".{RESUME}.discarded.{os.getpid()}"
        folder.replace(discarded)
        before_delete()
        shutil.rmtree(discarded, ignore_errors=True)
    for left in out_dir.glob(f".{RESUME}.discarded.*"):  # an earlier kill's
        shutil.rmtree(left, ignore_errors=True)


@dataclass(frozen=True)
class Attempt:
    """One attempt that stopped on a signal: the iteration it started from and stopped at, the signal, how much it
    did (steps, and an abandoned evaluation redone), the job and the node."""

    started: int
    stopped: int
    signal: str
    progress: int
    job_id: str | None = None
    node: str | None = None

    @property
    def progressed(self) -> bool:
        return self.progress > 0

    @property
    def cause(self) -> str:
        return CAUSES.get(self.signal, self.signal)

    def as_dict(self) -> dict[str, Any]:
        return {"started": self.started, "stopped": self.stopped, "signal": self.signal, "progress": self.progress,
                "job_id": self.job_id, "node": self.node, "cause": self.cause}  # fmt: skip


def attempts(out_dir: Path) -> list[Attempt]:
    """The run's stopped attempts, oldest first (a torn last line, from a kill while it was written, is skipped)."""
    path = out_dir / ATTEMPTS
    found = []
    try:
        lines = path.read_text("utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            raw = json.loads(line)
            found.append(Attempt(int(raw["started"]), int(raw["stopped"]), str(raw["signal"]), int(raw["progress"]),
                                 raw.get("job_id"), raw.get("node")))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
    return found


def record_attempt(out_dir: Path, attempt: Attempt) -> None:
    """Append the attempt to ``attempts.jsonl`` (one short line: one write, flushed to disk)."""
    with (out_dir / ATTEMPTS).open("a", encoding="utf-8") as sink:
        sink.write(json.dumps(attempt.as_dict(), sort_keys=True) + "\n")
        sink.flush()
        os.fsync(sink.fileno())


def stalled(history: Sequence[Attempt], job_id: str | None) -> list[Attempt]:
    """The latest attempts of job ``job_id`` (a Slurm job and its requeues, a Dagster run and its retries) stopped by
    a scheduler (not a person) without progress, in a row. Attempts of a job started by hand (no id) never count: a
    new submission is a new decision."""
    run: list[Attempt] = []
    for attempt in reversed(history):
        if job_id is None or attempt.job_id != job_id or attempt.progressed or attempt.signal == "SIGINT":
            break
        run.append(attempt)
    return run[::-1]


def stall_line(history: Sequence[Attempt], limit: int, job_id: str | None) -> str | None:
    """Why the run gives up (one line naming the job and the reason), or None while it may go on."""
    stuck = stalled(history, job_id)
    if len(stuck) < limit:
        return None
    causes = sorted({a.cause for a in stuck})
    hint = (
        "the time limit is shorter than start-up plus an evaluation: raise `time` in the Slurm settings (or lower "
        "eval_every)"
        if causes == ["time limit"]
        else "each attempt was stopped before it could take a step"
    )
    return (
        f"no progress in {len(stuck)} attempts of job {job_id} in a row (each stopped at iteration "
        f"{stuck[-1].stopped} by {' or '.join(causes)}), the limit is {limit}: {hint}; the checkpoint is kept"
    )


def execution_attempts(out_dir: Path) -> dict[str, Any]:
    """What the ``execution`` record says of the stops: each attempt, and how many were time limits and
    preemptions (SIGTERM: a preemption, ``scontrol requeue`` or a cancel)."""
    history = attempts(out_dir)
    if not history:
        return {}
    return {
        "attempts": [a.as_dict() for a in history],
        "timeouts": sum(a.signal == "SIGUSR1" for a in history),
        "preemptions": sum(a.signal == "SIGTERM" for a in history),
    }
