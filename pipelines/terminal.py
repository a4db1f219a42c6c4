"""What the CLI shows while work runs: one line per benchmark, progress bars on a terminal.

It listens to the library's progress events (:mod:`shiftbench.runtime.progress`), so the same lines come
from a batched Dagster run and from the library path. On a terminal, rich draws a bar per batch;
elsewhere (pipes, CI, tests) it prints the same lines plainly. Warnings print once.
"""

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any, TextIO

from shiftbench.errors import disk_full
from shiftbench.runtime import progress

# Words for outcomes, as the lines print them.
_VERDICT = {"published": "", "checked": "checked, not published", "failed_checks": "FAILED its checks, not published"}


class _QuietDiskFull:
    """Standard error without Dagster's multi-line SQLite message per log call it could not store on a
    full disk (the CLI says once that the disk is full); everything else passes through."""

    _PREFIX = "Exception while writing logger call to event log:"

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._storage = Path(os.environ.get("DAGSTER_HOME") or ".")  # where Dagster's SQLite files are

    def write(self, text: str) -> int:
        if text.startswith(self._PREFIX) and disk_full(Exception(text), self._storage):
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Reporter:
    """Prints progress events; collects the finished outcomes for the summary and the exit code."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, bars: bool | None = None) -> None:
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.bars = self.out.isatty() if bars is None else bars
        self.outcomes: list[Any] = []
        self.warned: set[str] = set()
        self.started = time.monotonic()
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def line(self, text: str, error: bool = False) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.err if error else self.out, flush=True)

    def warn(self, text: str) -> None:
        short = text.strip()
        if short not in self.warned:
            self.warned.add(short)
            self.line(f"warning: {short}", error=True)

    def __call__(self, event: progress.Event) -> None:
        if event.stage == "input":
            if event.status == "done":
                self.line(f"[inputs] {event.name}: {event.detail}")
            elif event.status == "warning":
                self.warn(event.detail)
            return
        if event.stage == "catalog":
            self.warn(event.detail if event.status == "stale" else f"left out of the catalog: {event.detail}")
            return
        if event.stage == "read":
            self._advance(event, done=True)
            self.line(f"[read] {event.name} ({event.index}/{event.total})")
            return
        if event.stage == "train":
            self._advance(event)
            return
        if event.status == "start":
            self._advance(event)
            return
        self._advance(event, done=True)
        self.outcomes.append(event.outcome)
        self.line(self.describe(event), error=event.status in {"failed_checks", "error"})

    def describe(self, event: progress.Event) -> str:
        outcome = event.outcome
        prefix = f"[{event.index}/{event.total}] {event.name}" if event.total else event.name
        seconds = f"{outcome.seconds:.1f}s" if outcome is not None else ""
        if event.status == "error":
            return f"{prefix}: error: {event.detail}; nothing published"
        if event.status == "failed_checks":
            return f"{prefix}: {_VERDICT['failed_checks']}: {event.detail}"
        staged = outcome.staged
        if outcome.publication is not None:
            became = "now latest" if outcome.publication.changed_latest else "already latest"
            return f"{prefix}: version {staged.version} ({became}; {event.detail}; {seconds})"
        return f"{prefix}: version {staged.version} ({_VERDICT[event.status]}; {event.detail}; {seconds})"

    def _advance(self, event: progress.Event, done: bool = False) -> None:
        if self._progress is None or not event.total:
            return
        key = event.stage
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(f"{event.stage}s", total=event.total)
        task = self._tasks[key]
        if event.fraction is not None:
            self._progress.update(
                task, completed=event.fraction * event.total, description=f"{event.stage} {event.name}"
            )
        elif done:
            self._progress.update(task, completed=event.index, description=f"{event.stage}s")
        else:
            self._progress.update(task, description=f"{event.stage} {event.name}")

    @contextmanager
    def listening(self) -> Iterator["Reporter"]:
        """Listen to progress events (with live bars on a terminal) for the ``with`` block."""
        if self.bars:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            self._progress.start()
        try:
            with progress.listening(self), redirect_stderr(_QuietDiskFull(sys.stderr)):
                yield self
        finally:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    @property
    def failed_checks(self) -> int:
        return sum(1 for o in self.outcomes if o is not None and o.status == "failed_checks")

    @property
    def errors(self) -> int:
        return sum(1 for o in self.outcomes if o is not None and o.status == "error")

    @property
    def user_errors(self) -> int:
        """Errors of the input (exit code 2), as opposed to failures of shiftbench itself (1)."""
        return sum(1 for o in self.outcomes if o is not None and o.status == "error" and o.user_error)


def table(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> str:
    """Rows as aligned text columns (numbers right-aligned)."""
    cells = [tuple("" if v is None else str(v) for v in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if n else c.ljust(w) for c, w, n in zip(row, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
