"""Launching runs of the code location from the CLI, recorded like the UI's own.

A run made by ``execute_in_process`` has no code-location origin, so the UI lists it under Runs
but not under its job or in the overview. Here a run is created with the same origin ``dagster
dev`` gives the location of ``[tool.dagster]`` (location ``shiftbench``, repository
``__repository__``) and then executed in this process, which costs no code server start and
keeps the terminal's progress. These are Dagster internals (``dagster._core``), used the way
``dagster job execute`` uses them; the test that the UI lists CLI runs under their job guards them.
"""

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.execution.api import create_execution_plan, execute_run
from dagster._core.remote_origin import ManagedGrpcPythonEnvCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._utils.error import SerializableErrorInfo

from shiftbench.errors import ShiftbenchError, disk_full

PROJECT = Path(__file__).resolve().parents[1]
MODULE = "shiftbench.pipelines.definitions"
LOCATION = "shiftbench"  # [tool.dagster] code_location_name
REPOSITORY = "__repository__"  # the repository a Definitions object becomes
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
# Only the run's own event log keeps Dagster's messages; the terminal shows shiftbench's.
SILENT: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
# Errors that stop a run without being a failure of shiftbench (Ctrl-C, a terminated run).
STOPPED = ("KeyboardInterrupt", "DagsterExecutionInterruptedError")


def repository_origin() -> RemoteRepositoryOrigin:
    location = ManagedGrpcPythonEnvCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name=MODULE, working_directory=str(PROJECT)),
        location_name=LOCATION,
    )
    return RemoteRepositoryOrigin(code_location_origin=location, repository_name=REPOSITORY)


def run_job(
    instance: dg.DagsterInstance,
    job_name: str,
    *,
    assets: Sequence[dg.AssetKey] | None = None,
    partitions: Sequence[str] = (),
    partition_key: str | None = None,
    config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
) -> DagsterRun:
    """Run ``job_name`` (optionally a subset of its assets) over one partition or a contiguous range.

    ``partitions`` must be contiguous in the partitions' order; the run covers first..last.
    Returns the finished run (its status says whether it succeeded).
    """
    # Definitions built now, for this environment (the settings resource binds the variables set now).
    ReconstructableJob.get_definition.cache_clear()
    ReconstructableJob.get_repository_definition.cache_clear()
    repository = ReconstructableRepository.for_module(MODULE, "build_definitions", str(PROJECT))
    recon_job = repository.get_reconstructable_job(job_name)
    if assets is not None:
        recon_job = recon_job.get_subset(asset_selection=frozenset(assets))
    job_def = recon_job.get_definition()
    run_tags = dict(tags or {})
    if partition_key is not None:
        run_tags["dagster/partition"] = partition_key
        if isinstance(partition_key, dg.MultiPartitionKey):
            run_tags.update({f"dagster/partition/{d}": k for d, k in partition_key.keys_by_dimension.items()})
    elif partitions:
        run_tags[RANGE_START], run_tags[RANGE_END] = partitions[0], partitions[-1]
    run_config = {**SILENT, **dict(config or {})}
    plan = create_execution_plan(job_def, run_config=run_config, instance_ref=instance.get_ref(), tags=run_tags)
    run = instance.create_run_for_job(
        job_def=job_def,
        execution_plan=plan,
        run_config=run_config,
        tags=run_tags,
        asset_selection=frozenset(assets) if assets is not None else None,
        remote_job_origin=repository_origin().get_job_origin(job_name),
        job_code_origin=recon_job.get_python_origin(),
    )
    execute_run(recon_job, run, instance)
    finished = instance.get_run_by_id(run.run_id)
    assert finished is not None
    for text in bug_tracebacks(instance, finished):  # the CLI's rule (pipelines/cli/app.py): a bug keeps its traceback
        header = f"a failure of shiftbench itself in run {run.run_id} ({job_name}): its traceback, also in its log"
        print(f"{header}:\n{text.rstrip()}", file=sys.stderr, flush=True)
    return finished


@contextlib.contextmanager
def dagster_keeps_sigterm() -> Iterator[None]:
    """While a run executes in this process, SIGTERM keeps the handler ``shiftbench train`` installed
    (shiftbench.erm.stops.held_stops): Dagster would map it to its own interrupt
    (``dagster._utils.interrupts.setup_interrupt_handlers``, "for k8s"), and the training job would then be stopped
    with SIGINT, exit 130 where 75 was meant. A Dagster internal, replaced for the block only."""
    from dagster._utils import interrupts

    original = interrupts.setup_interrupt_handlers
    interrupts.setup_interrupt_handlers = lambda: None
    try:
        yield
    finally:
        interrupts.setup_interrupt_handlers = original


def contiguous_blocks(selected: Sequence[str], order: Sequence[str]) -> list[list[str]]:
    """``selected`` split into runs of neighbours in ``order`` (a range run covers first..last)."""
    position = {name: i for i, name in enumerate(order)}
    ranked = sorted(selected, key=lambda name: position[name])
    blocks: list[list[str]] = []
    for name in ranked:
        if blocks and position[name] == position[blocks[-1][-1]] + 1:
            blocks[-1].append(name)
        else:
            blocks.append([name])
    return blocks


def _innermost(error: SerializableErrorInfo | None) -> SerializableErrorInfo | None:
    """The error Dagster's wrappers were raised from (what the user's code raised)."""
    while error is not None and error.cause is not None:
        error = error.cause
    return error


def _one_line(error: SerializableErrorInfo) -> tuple[str, bool]:
    """An error as one line, and whether it is a bad input (:class:`InputError`, or a run failed on purpose)."""
    message = error.message.strip()
    qualified, colon, rest = message.partition(": ")  # Dagster's text starts "module.Class: " (builtins: "Class: ")
    if colon and qualified.rpartition(".")[2] == error.cls_name:
        message = rest
    if error.cls_name in {"InputError", "Failure"}:
        return message, True
    if disk_full(Exception(message)):
        return f"the disk is full ({message.splitlines()[0]})", False
    if error.cls_name in {cls.__name__ for cls in _subclasses(ShiftbenchError)}:  # says what happened: no class name
        return message, False
    return f"{error.cls_name}: {message}", False


@dataclass(frozen=True)
class _Failed:
    """A step's (or the run's) failure: the error as Dagster recorded it, and what the user's code raised."""

    step: str | None
    error: SerializableErrorInfo | None
    raised: SerializableErrorInfo | None
    message: str


def _failures(instance: dg.DagsterInstance, run: DagsterRun) -> list[_Failed]:
    """Each step or run failure the run recorded, in order. A process launched through Pipes (the training job)
    that failed is what it raised, which Pipes recorded, not Dagster's "External execution process failed"."""
    kinds = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.ENGINE_EVENT}
    external, found = None, []
    for record in instance.all_logs(run.run_id, of_type=kinds):
        event = record.dagster_event
        error = getattr(getattr(event, "event_specific_data", None), "error", None)
        if event is not None and event.event_type == dg.DagsterEventType.ENGINE_EVENT:
            if error is not None and (event.message or "").startswith("[pipes]"):
                external = error
            continue
        raised = _innermost(error)
        if raised is not None and raised.cls_name == "DagsterPipesExecutionError" and external is not None:
            raised = _innermost(external)
        found.append(_Failed(record.step_key, error, raised, str(getattr(event, "message", "") or "")))
    return found


def run_error(instance: dg.DagsterInstance, run: DagsterRun) -> tuple[str, bool]:
    """The innermost error of a failed run (the user's message, not Dagster's wrapper), and
    whether it is a bad input (:class:`InputError`) rather than a failure of shiftbench."""
    for failed in _failures(instance, run):
        if failed.raised is not None:
            return _one_line(failed.raised)
        if failed.message:
            return failed.message, False
    return "run failed", False


def failed_steps(instance: dg.DagsterInstance, run: DagsterRun) -> dict[str, str]:
    """The run's failed steps (step key: the op's name) and each one's error in one line."""
    return {f.step: _one_line(f.raised)[0] for f in _failures(instance, run) if f.step and f.raised is not None}


def bug_tracebacks(instance: dg.DagsterInstance, run: DagsterRun) -> list[str]:
    """The tracebacks of the run's failures of shiftbench itself (bugs): not a bad input, a failed contract, a
    damaged store, a full disk or a stop, which are said in one line. Dagster keeps them in the run's log."""
    found = []
    expected = {cls.__name__ for cls in _subclasses(ShiftbenchError)} | {"Failure", *STOPPED}
    failures = _failures(instance, run)
    steps = [f for f in failures if f.step is not None]
    for failed in steps or failures:  # a run's failure repeats its first step's
        error, raised = failed.error, failed.raised
        if error is None or raised is None or raised.cls_name in expected:
            continue
        if disk_full(Exception(raised.message)) or "database is locked" in raised.message:
            continue
        if _innermost(error) is not raised:  # a process launched through Pipes: printed by it, kept by Pipes
            continue
        if error.cls_name == "DagsterExecutionStepExecutionError" and error.cause is not None:
            error = error.cause  # Dagster's wrapper of what the step raised: its own frames tell nothing
        found.append(python_traceback(error))
    return found


def python_traceback(error: SerializableErrorInfo) -> str:
    """An error Dagster recorded (with what it was raised from) as Python prints it: the first cause first."""
    text = ""
    current: SerializableErrorInfo | None = error
    while current is not None:
        own = "Traceback (most recent call last):\n" + "".join(current.stack) + current.message.rstrip() + "\n"
        text = own + text
        if current.cause is not None:
            text = "\nThe above exception was the direct cause of the following exception:\n\n" + text
        elif current.context is not None:
            text = "\nDuring handling of the above exception, another exception occurred:\n\n" + text
        current = current.cause or current.context
    return text


def _subclasses(cls: type[Exception]) -> set[type[Exception]]:
    found = {cls}
    for child in cls.__subclasses__():
        found |= _subclasses(child)
    return found
