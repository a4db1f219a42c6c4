"""A sweep: many ERM runs (benchmarks x seeds) planned at once, then run several at a time on one device.

Why several at a time: one small training leaves a GPU mostly idle (the host launches its kernels; see
:mod:`shiftbench.erm.step`) and a 2-core CPU half idle in a single-threaded op; runs side by side fill
it. Each run stays a process of its own (its own Dagster run in the lineage, its own version, its own
error): concurrent processes share a GPU by time slicing, and a run's math is the one it has alone.

Every run is planned before any starts, so a bad benchmark, seed or parameter is one line and nothing
runs. On CPU a run's results depend on torch's thread count (oneDNN splits reductions by thread), so
packed runs get ``cores // parallel`` threads each and record it; a run with the same ``threads``
gives the same bytes and version id packed or alone (tested).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shiftbench.config.settings import Settings
from shiftbench.erm.launch import RunPlan, plan_run
from shiftbench.errors import InputError
from shiftbench.runtime.cpus import available_cpus

SEEDS = range(10)  # the ERM assets' seed partitions
GPU_SLOTS = 4  # runs at a time on one GPU unless asked (8 eager runs gave 4.6x one's throughput on an H100)
_HEADLINE = re.compile(r"^\s+(\S+/acc_\S+)\s+(-?[0-9.]+)$")
_PUBLISHED = re.compile(r"^\[train\] (\S+) version (\S+) \((now latest|already latest)")
_INTERRUPTED = re.compile(r"^\[train\] (.*: interrupted at iteration .*)$")


def training_seed(seed: int | None) -> int:
    """The seed of one run (default 0): seeds are the partitions 0..9."""
    seed = 0 if seed is None else seed
    if seed not in SEEDS:
        raise InputError("seeds are partitions 0..9", parameter="--seed")
    return seed


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` or ``0-2`` (or both, ``0-2,5``): distinct seeds of 0..9, in the order given."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise InputError(f"{part!r} is not a seed or a range like 0-2", parameter="--seeds")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first or last not in SEEDS:
            raise InputError(f"seeds are partitions 0..9, got {part!r}", parameter="--seeds")
        for seed in range(first, last + 1):
            if seed in seeds:
                raise InputError(f"seed {seed} is named twice", parameter="--seeds")
            seeds.append(seed)
    return seeds


def plan_sweep(
    settings: Settings,
    benchmarks: Sequence[str],
    seeds: Sequence[int],
    *,
    preset: str | None = None,
    overrides: dict[str, object] | None = None,
    version: str | None = None,
    image_root: str | None = None,
    path_template: str | None = None,
    search: tuple[str, int] | None = None,
) -> list[RunPlan]:
    """Every run of the sweep, benchmark-major (then draw-major for a ``search`` of (space, draws): each draw's trials
    are its seeds); fails on the first bad benchmark, parameter or pinned value before any run starts."""
    repeated = sorted({b for b in benchmarks if list(benchmarks).count(b) > 1})
    if repeated:
        raise InputError(f"{repeated[0]} is named twice", parameter="benchmarks")
    if version is not None and len(benchmarks) > 1:
        raise InputError("a split version belongs to one benchmark: name one benchmark", parameter="--version")
    options = {"version": version, "preset": preset, "image_root": image_root, "path_template": path_template}
    variants: list[dict[str, object]] = (
        [{}] if search is None else [{"search": search[0], "search_draw": draw} for draw in range(search[1])]
    )
    return [
        plan_run(settings, benchmark, seed=seed, overrides={**(overrides or {}), **variant}, **options)
        for benchmark in benchmarks
        for variant in variants
        for seed in seeds
    ]


def slots(parallel: int | None, n_runs: int, device: str | None) -> int:
    """Runs at a time: as asked, else one per CPU core, or ``GPU_SLOTS`` when a GPU will train them."""
    if parallel is not None:
        if parallel < 1:
            raise InputError("must be at least 1", parameter="--parallel")
        return min(parallel, n_runs)
    on_gpu = (device or "auto").startswith("cuda") or (device in {None, "auto"} and gpu_present())
    return max(1, min(GPU_SLOTS if on_gpu else available_cpus(), n_runs))


def gpu_present() -> bool:
    """Whether an NVIDIA device node exists (without importing torch in the planning process)."""
    return Path("/dev/nvidiactl").exists() and os.environ.get("CUDA_VISIBLE_DEVICES", "0") not in {"", "-1"}


def threads_per_run(parallel: int) -> int:
    """CPU threads for each of ``parallel`` runs side by side (every core used, none oversubscribed)."""
    return max(1, available_cpus() // parallel)


@dataclass
class RunOutcome:
    """One finished run of a sweep: what its command printed, reduced to what a sweep reports."""

    plan: RunPlan
    exit_code: int
    seconds: float
    log: Path
    version: str | None = None
    became_latest: bool = False
    headline: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    interrupted: bool = False  # stopped on a signal with its checkpoint kept (shiftbench.erm.interrupt)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.version is not None


def read_outcome(plan: RunPlan, exit_code: int, seconds: float, log: Path) -> RunOutcome:
    """A run's version, headline metrics or its one-line error, from the output of ``shiftbench train``."""
    outcome = RunOutcome(plan, exit_code, seconds, log)
    lines = log.read_text("utf-8", errors="replace").splitlines() if log.is_file() else []
    for line in lines:
        if (published := _PUBLISHED.match(line)) and published[1] == plan.run:
            outcome.version, outcome.became_latest = published[2], published[3] == "now latest"
        elif headline := _HEADLINE.match(line):
            outcome.headline[headline[1]] = float(headline[2])
        elif stopped := _INTERRUPTED.match(line):
            outcome.error, outcome.interrupted = stopped[1], True
    if not outcome.ok and not outcome.interrupted:
        errors = [line for line in lines if line.startswith("error:")]
        outcome.error = errors[-1].removeprefix("error:").strip() if errors else _last_words(lines, exit_code)
    return outcome


def _last_words(lines: list[str], exit_code: int) -> str:
    tail = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return f"exited with {exit_code}" + (f": {tail}" if tail else "")


def _pause(seconds: float) -> int | None:
    time.sleep(seconds)
    return None


def run_packed(
    plans: Sequence[RunPlan],
    command: Callable[[RunPlan], list[str]],
    parallel: int,
    log_dir: Path,
    on_finish: Callable[[RunOutcome], None],
    env: dict[str, str] | None = None,
    wait: Callable[[float], int | None] = _pause,
) -> list[RunOutcome]:
    """Run ``command(plan)`` for every plan, ``parallel`` at a time, each output in ``log_dir/<run>.log``;
    ``on_finish`` sees each outcome as it comes. A failed run fails alone: the others go on.

    A stop (Ctrl-C, raised as KeyboardInterrupt, or a signal ``wait`` returns: SIGINT, SIGTERM, SIGUSR1, SIGHUP)
    stops the sweep: no run starts, each running one (its process group: the command and its training job) is sent
    that signal once and waited for while it writes its checkpoint; their outcomes say so (``interrupted``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    waiting, outcomes = list(plans), list[RunOutcome]()
    running: list[tuple[RunPlan, subprocess.Popen[bytes], Path, float]] = []
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                plan = waiting.pop(0)
                log = log_dir / f"{plan.run}.log"
                with log.open("wb") as sink:  # a session of its own: a stop reaches a run once, from here
                    process = subprocess.Popen(
                        command(plan), stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                running.append((plan, process, log, time.monotonic()))
            signum = wait(0.1)
            if signum is not None:
                raise _Stop(signum)
            _collect(running, outcomes, on_finish, wait=False)
    except (KeyboardInterrupt, _Stop) as stop:
        signum = stop.signum if isinstance(stop, _Stop) else signal.SIGINT
        for _, process, _, _ in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)
        _collect(running, outcomes, on_finish, wait=True)
        raise SweepInterrupted(outcomes, [plan.run for plan in waiting], signum) from None
    return outcomes


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class SweepInterrupted(Exception):
    """A sweep stopped by a signal: the outcomes of the runs that ran, the runs that never started, the signal."""

    def __init__(self, outcomes: list[RunOutcome], not_started: list[str], signum: int = signal.SIGINT) -> None:
        super().__init__(f"{len(outcomes)} runs finished or stopped, {len(not_started)} not started")
        self.outcomes, self.not_started, self.signum = outcomes, not_started, signum


def _collect(
    running: list[tuple[RunPlan, subprocess.Popen[bytes], Path, float]],
    outcomes: list[RunOutcome],
    on_finish: Callable[[RunOutcome], None],
    *,
    wait: bool,
) -> None:
    """The outcomes of the finished runs (of all of them, waiting, with ``wait``)."""
    for item in list(running):
        plan, process, log, started = item
        if wait:
            process.wait()
        elif process.poll() is None:
            continue
        running.remove(item)
        outcome = read_outcome(plan, process.returncode, time.monotonic() - started, log)
        outcomes.append(outcome)
        on_finish(outcome)
