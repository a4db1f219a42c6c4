"""Progress events of long work (builds, inputs, training), for whoever listens.

The library reports; it never prints. The CLI listens and draws progress bars (rich); the Dagster
shell listens and writes the run's event log. Listeners are per thread of control: a listener
added with :func:`listening` hears the events reported inside its ``with`` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    stage: str  # input | benchmark | collection | task | case | train | read
    name: str
    index: int = 0  # 1-based position in a batch (0: not part of one)
    total: int = 0
    status: str = "start"  # start | done | warning | published | checked | failed_checks | error | progress
    detail: str = ""
    fraction: float | None = None  # for status "progress": how much is done
    outcome: Any = None  # the benchmark_builds.Outcome of a finished benchmark


Listener = Callable[[Event], None]
_LISTENERS: ContextVar[tuple[Listener, ...]] = ContextVar("shiftbench_progress_listeners", default=())


def report(event: Event) -> None:
    for listener in _LISTENERS.get():
        listener(event)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    token = _LISTENERS.set((*_LISTENERS.get(), listener))
    try:
        yield
    finally:
        _LISTENERS.reset(token)
