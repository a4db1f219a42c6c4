"""The ``shiftbench`` command itself: its parser (each command module adds its own subcommands), :func:`main`
(every error one line and an exit code) and :func:`entry` (the console script: a quick exit)."""

import atexit
import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from shiftbench.config.settings import Settings
from shiftbench.errors import ContractViolation, ShiftbenchError, StoreError, disk_full, free_bytes, one_line
from shiftbench.pipelines.cli import build, export, generate, results, train, warehouse
from shiftbench.pipelines.cli.common import OneLineParser, Subcommands
from shiftbench.runtime import progress
from shiftbench.runtime.cpus import yielding_waits

# The subcommands, in the order `shiftbench --help` lists them.
COMMANDS: tuple[Callable[[Subcommands], None], ...] = (
    build.add_build,
    results.add_sql,
    results.add_leaderboard,
    results.add_analyse,
    warehouse.add_versions,
    warehouse.add_check,
    warehouse.add_catalog,
    warehouse.add_gc,
    train.add_train,
    export.add_export,
    results.add_eval,
    generate.add_generate,
)
# The commands that may create the warehouse: they build data into it on purpose. Every other one reads a
# warehouse, and one that is not there is an error (Settings.existing_home), never an empty one made for it.
CREATE_A_WAREHOUSE = frozenset({"build", "generate"})


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="shiftbench", description="Distribution-shift benchmark splits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    yielding_waits()  # before torch loads (training in process): OpenMP's waiting threads sleep, never spin
    warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help (0), or a bad command line, said in one line (OneLineParser): 2
            return exc.code if isinstance(exc.code, int) else 2
        if args.command not in CREATE_A_WAREHOUSE:
            Settings.from_env().existing_home()
        with progress.listening(_print_traceback):
            code: int = args.func(args)
    except BrokenPipeError:  # `shiftbench ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ContractViolation, StoreError) as exc:  # failed contracts, a damaged store: not the input's fault
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except ShiftbenchError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        stopped = _stopped(exc)
        if stopped is None:
            raise  # a bug: its traceback is what a report needs
        return stopped
    return code


def _print_traceback(event: progress.Event) -> None:
    """A failure of shiftbench inside a build is that benchmark's outcome (its one line, exit code 1) and the
    others go on; being a bug, its traceback is printed too, just before that line (the run's log keeps it as
    well). A bug that stops a run is printed by :func:`shiftbench.pipelines.runs.run_job`; one outside any run,
    by Python."""
    traceback = getattr(event.outcome, "traceback", None)
    if traceback:
        print(f"{event.name}: a failure of shiftbench itself; its traceback, also in the run's log:\n"
              f"{traceback.rstrip()}", file=sys.stderr, flush=True)  # fmt: skip


def _stopped(exc: Exception) -> int | None:
    """A locked Dagster storage or a full disk: one line, and exit code 1 (None: neither, a bug)."""
    home = Path(os.environ.get("SHIFTBENCH_HOME") or "warehouse").absolute()
    if "database is locked" in str(exc):  # SQLite's busy timeout ran out: another process holds it
        print(
            f"error: Dagster's storage in {os.environ.get('DAGSTER_HOME')} is locked by another process "
            "(a stuck `dagster dev` or run?): the command stopped; `shiftbench versions` lists what is "
            "published; retry when it is free",
            file=sys.stderr,
        )
        return 1
    if not disk_full(exc, home):
        return None
    print(
        f"error: the disk holding {home} is full ({free_bytes(home) >> 10:,} KiB free): the command stopped; "
        "a version is published whole or not at all (`shiftbench versions` lists them); free space and rerun",
        file=sys.stderr,
    )
    return 1


def entry() -> NoReturn:
    """The ``shiftbench`` command: :func:`main`, then an exit without Python's teardown."""
    leave(main())


def leave(code: int) -> NoReturn:
    """Exit with ``code`` once exit-time handlers have run and the streams are flushed, skipping the teardown.

    After a GQA-scale build, Python's teardown (freeing some 3,000 modules and what the build made, one object at a
    time) took 0.8 s with nothing left to do: every file and database was closed by the command. Exit-time handlers
    (temporary directories, executors, logging) still run here; with a thread still running (none, normally) the
    exit is the normal one."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # what a normal exit runs (CPython has no public name for it)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the reader left (`| head`), or the stream was closed
            stream.flush()
    os._exit(code)
