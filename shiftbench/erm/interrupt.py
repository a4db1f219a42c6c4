"""Stopping a training run on a signal: it checkpoints at the next step boundary and exits with a known code.

SIGINT (Ctrl-C), SIGTERM (``kill``, a Kubernetes pod deleted, Slurm's preemption) and SIGUSR1 (Slurm's warning
signal before a time limit, ``sbatch --signal=B:USR1@120``) only set a flag; the training loop checks it
after every step (and between the batches of an evaluation, which it abandons: the resumed run redoes it), writes
a checkpoint (:mod:`shiftbench.erm.resume`) and raises :class:`Interrupted`. The job prints one line
(:func:`Interrupted.line`) and exits with:

- :data:`EXIT_INTERRUPTED` (130, the shell's code for Ctrl-C) after SIGINT: a person stopped it;
- :data:`EXIT_REQUEUE` (75, ``EX_TEMPFAIL`` of sysexits.h: "try again later") after SIGTERM, SIGUSR1 or SIGHUP (a
  closed terminal, an ssh drop): the checkpoint is kept and a scheduler should run the same job again, which resumes.

A signal that arrives within :data:`REPEAT_WINDOW_S` of the first is the same request said twice (a terminal
sends Ctrl-C to every process of its group, and a launcher such as Dagster's Pipes client forwards it once more):
it is ignored. A second Ctrl-C after that stops the job at once, without a new checkpoint (the last one stays
intact: checkpoints are replaced atomically). This module imports no torch: launchers read its exit codes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from shiftbench.errors import InputError, ShiftbenchError

EXIT_INTERRUPTED = 130  # SIGINT: stopped by a person, checkpoint kept
EXIT_REQUEUE = 75  # SIGTERM or SIGUSR1: checkpoint kept, run the same job again (a scheduler's requeue)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
REPEAT_WINDOW_S = 2.0
# Tests only: ``STEP`` or ``eval:STEP`` (comma-separated), the job sends itself SIGINT after that iteration's step,
# or during its evaluation (after the first batch): interruptions at exact points, through the real handler. A
# resumed run starts after its checkpoint's iteration, so a point stops each fit (of an lr_grid) once.
TEST_HOOK = "SHIFTBENCH_TEST_INTERRUPT_AT"
TEST_SIGNAL = "SHIFTBENCH_TEST_INTERRUPT_SIGNAL"  # the signal the hook sends (default SIGINT)
# Tests only: ``parent`` sends the hook's signal to the job's parent (a Slurm batch script, which forwards a USR1 as
# the time-limit warning it stands for) instead of the job itself. ``resume`` in TEST_HOOK: right after resuming.
TEST_TARGET = "SHIFTBENCH_TEST_INTERRUPT_TARGET"
# Tests only: the job kills itself with SIGKILL at this point of its clean-up (``outputs``: the outputs written,
# ``run.json`` not yet; ``run.json``: just after it; ``discard``: with ``resume/`` renamed away, not yet deleted).
TEST_KILL = "SHIFTBENCH_TEST_KILL_AT"


def exit_code(signum: int) -> int:
    """The job's exit code after a checkpointed stop on ``signum``."""
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_REQUEUE


class Stopped(ShiftbenchError):
    """A run stopped on a signal: its one line and the exit code it means (a stop someone asked for, not a
    failure). A launcher rebuilds it from the job's ``interrupted.json`` (:meth:`as_dict`)."""

    def __init__(self, line: str, exit_code: int) -> None:
        super().__init__(line)
        self.exit_code = exit_code

    def line(self) -> str:
        return str(self.args[0])

    def as_dict(self) -> dict[str, object]:
        return {"line": self.line(), "exit_code": self.exit_code}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Stopped:
        return cls(str(values["line"]), int(values["exit_code"]))


class Interrupted(Stopped):
    """The run stopped on a signal after writing its checkpoint."""

    def __init__(self, run: str, iteration: int, max_iters: int, signum: int, checkpoint: str) -> None:
        self.run, self.iteration, self.max_iters, self.signum = run, iteration, max_iters, signum
        self.checkpoint = checkpoint  # the checkpoint's folder
        super().__init__(
            f"{run}: interrupted at iteration {iteration} of {max_iters} ({signal.Signals(signum).name}), "
            f"checkpoint kept in {checkpoint}; run the same command again to resume",
            exit_code(signum),
        )

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "run": self.run, "iteration": self.iteration, "checkpoint": self.checkpoint}


STOPPED_AT_ONCE = Stopped(
    "stopped at once by a second Ctrl-C: no new checkpoint, the last one (if any) is kept; run the same command "
    "again to resume from it",
    EXIT_INTERRUPTED,
)


class StopRequest:
    """The flag the handlers set; the training loop polls :attr:`signum` at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._at = 0.0
        self._hook = _parse_hook(os.environ.get(TEST_HOOK, ""))
        self._hook_signal = int(os.environ.get(TEST_SIGNAL) or signal.SIGINT)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._at = signum, now
        elif signum == signal.SIGINT and now - self._at > REPEAT_WINDOW_S:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once (the last checkpoint stays intact)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def after_step(self, iteration: int) -> None:
        """The test hook's point after a step (nothing unless :data:`TEST_HOOK` names this iteration)."""
        if iteration in self._hook[0]:
            self._hook[0].discard(iteration)
            self._send()

    def during_evaluation(self, iteration: int) -> None:
        if iteration in self._hook[1]:
            self._hook[1].discard(iteration)
            self._send()

    def after_resume(self) -> None:
        """The test hook's point right after a checkpoint was restored (``resume`` in :data:`TEST_HOOK`)."""
        if -1 in self._hook[0]:
            self._hook[0].discard(-1)
            self._send()

    def _send(self) -> None:
        target = os.getppid() if os.environ.get(TEST_TARGET) == "parent" else os.getpid()
        os.kill(target, self._hook_signal)
        if target != os.getpid():
            time.sleep(1.0)  # the parent passes it on


def kill_point_for_tests(name: str) -> None:
    """Tests only: SIGKILL now if :data:`TEST_KILL` names this point of the job's clean-up."""
    if os.environ.get(TEST_KILL) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _parse_hook(text: str) -> tuple[set[int], set[int]]:
    steps, evaluations = set(), set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "resume":
            steps.add(-1)
        elif part.startswith("eval:"):
            evaluations.add(int(part.removeprefix("eval:")))
        else:
            steps.add(int(part))
    return steps, evaluations


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Handlers for :data:`SIGNALS` while the block runs (the previous ones restored after). Off the main thread
    (where Python cannot install handlers) the flag is never set: the run is stopped the way its host stops it."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {signum: signal.signal(signum, request) for signum in SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # a launcher may have deferred them to us
    try:
        yield request
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


LOCK = ".lock"


@contextlib.contextmanager
def job_lock(out_dir: Path) -> Iterator[None]:
    """One job at a time in an output folder (two would write each other's checkpoints): a lock the kernel
    releases when the process ends, however it ends. The lock file holds the job's process id, for a launcher
    that forwards a stop to it (:mod:`shiftbench.erm.stops`)."""
    with (out_dir / LOCK).open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError("another process is training this run in this folder", path=out_dir) from None
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def wait_for_job(out_dir: Path, timeout_s: float) -> bool:
    """Wait until no job holds ``out_dir``'s lock (a stopped job writing its checkpoint); False on timeout."""
    path = out_dir / LOCK
    if not path.is_file():
        return True
    deadline = time.monotonic() + timeout_s
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
                continue
            fcntl.flock(handle, fcntl.LOCK_UN)
            return True
