"""Stop signals on the launcher's side: ``shiftbench train`` and the processes that follow jobs (a Slurm sweep, a
local sweep) hold them from their first line and decide what each means, so a stop sent to the command, to its
process group or to the training job gives the same answer (the job's side: :mod:`shiftbench.erm.interrupt`).

Held, not left to the defaults: a library thread started before a handler exists (polars and DuckDB start theirs)
would take SIGUSR1 or SIGHUP and end the process on the spot, and Dagster, which runs the ERM job in this process,
turns a SIGTERM it receives into its own interrupt, which reaches the job as SIGINT (exit 130 where 75 was meant).
So, while :func:`held_stops` lasts:

- SIGINT is blocked in this process (and stays blocked in every process it starts, across fork and exec) and taken
  with ``sigtimedwait``; the training job unblocks it for itself (:func:`shiftbench.erm.interrupt.stop_requests`);
- SIGTERM, SIGUSR1 and SIGHUP are caught by a handler that only queues them. They are not blocked: Dagster ends its
  helper processes (``tail`` of the compute logs) with SIGTERM, which a blocked mask would make them ignore.
  ``shiftbench.pipelines.runs.dagster_keeps_sigterm`` stops Dagster from replacing that handler during a run.

:func:`take_stop` returns the next stop, whichever kind; :func:`forwarded_stops` sends each to the job training in a
run folder as the signal it was. No torch, no Dagster: pure standard library.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from shiftbench.erm.interrupt import LOCK, SIGNALS

QUEUED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
_pending: collections.deque[int] = collections.deque()


def _queue(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)


@contextlib.contextmanager
def held_stops() -> Iterator[None]:
    """The stop signals held for :func:`take_stop` until the block ends (enter it before anything starts a thread);
    those still held at the end are dropped: the job answered them, or the command was past the point where a stop
    means anything (publishing). Off the main thread (where Python cannot install handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = {signum: signal.signal(signum, _queue) for signum in QUEUED}
    try:
        yield
    finally:
        while signal.sigtimedwait({signal.SIGINT}, 0) is not None:
            pass
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def take_stop(timeout_s: float) -> int | None:
    """The next held stop signal, waiting up to ``timeout_s`` for one; None if none came. Without
    :func:`held_stops` it only waits."""
    if _pending:
        return _pending.popleft()
    if signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        threading.Event().wait(timeout_s)
        return _pending.popleft() if _pending else None
    taken = signal.sigtimedwait({signal.SIGINT}, timeout_s)
    if taken is not None:
        return taken.si_signo
    return _pending.popleft() if _pending else None


def job_below(out_dir: Path, ancestor: int) -> int | None:
    """The process id the lock file of ``out_dir`` names, if that process runs below ``ancestor`` (a launcher's
    own job, not a stale id in the file nor a job another launcher started). The file is read, not locked: a
    launcher never holds the lock a job is about to take."""
    try:
        text = (out_dir / LOCK).read_text().strip()
    except OSError:
        return None
    pid = int(text) if text.isdigit() else None
    current = pid
    while current is not None and current > 1:
        current = _parent(current)
        if current == ancestor:
            return pid
    return None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state, past the command's parentheses


class Forwarder(threading.Thread):
    """Takes the held stop signals and sends each, as soon as a job holds the lock of :attr:`out_dir`, to that job."""

    def __init__(self) -> None:
        super().__init__(name="shiftbench-stop-forwarder", daemon=True)
        self.out_dir: Path | None = None  # set once the run's folder is known
        self.pending, self.done = list[int](), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            taken = take_stop(0.1)
            if taken is not None:
                self.pending.append(taken)
            pid = job_below(self.out_dir, os.getpid()) if self.pending and self.out_dir is not None else None
            if pid is not None:
                for signum in self.pending:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                self.pending.clear()


@contextlib.contextmanager
def forwarded_stops() -> Iterator[Forwarder]:
    """Inside :func:`held_stops`, for a launcher that waits for a job it started (``shiftbench train`` through
    Dagster): every stop the launcher gets is sent on to the job as the signal it was (set the forwarder's
    ``out_dir`` once the run's folder is known); the job checkpoints and exits with that signal's code. Sent to the
    whole process group (a terminal's Ctrl-C), the job gets it twice within
    :data:`shiftbench.erm.interrupt.REPEAT_WINDOW_S`: one request."""
    forwarder = Forwarder()
    forwarder.start()
    try:
        yield forwarder
    finally:
        forwarder.done.set()
        forwarder.join()


__all__ = ["SIGNALS", "Forwarder", "forwarded_stops", "held_stops", "take_stop"]
