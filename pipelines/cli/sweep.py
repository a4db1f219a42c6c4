"""``shiftbench train B1 B2 … --seeds 0,1,2``: a sweep, every run planned first, then several at a time.

Each run is ``shiftbench train B --seed S`` in a process of its own (so each is its own Dagster run in
the lineage, published as its own version, failing alone with its one-line error); this shell plans,
packs (:mod:`shiftbench.erm.sweep`), shows a bar over runs and prints one line per finished run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from shiftbench.config.settings import Settings
from shiftbench.erm.launch import RunPlan
from shiftbench.erm.stops import take_stop
from shiftbench.erm.sweep import (
    SEEDS,
    RunOutcome,
    SweepInterrupted,
    parse_seeds,
    plan_sweep,
    run_packed,
    slots,
    threads_per_run,
)
from shiftbench.errors import InputError
from shiftbench.pipelines.cli.common import shiftbench_command

# Options of `shiftbench train` that every run of a sweep takes as given.
_FORWARDED = ("model", "device", "preset", "version", "image_root", "path_template", "backend")


def cmd_sweep(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    from shiftbench.families.plans import trainable_kind

    settings = Settings.from_env()
    seeds, search = sweep_shape(args)
    for benchmark in args.benchmarks:
        trainable_kind(settings, benchmark)
    plans = plan_sweep(
        settings, args.benchmarks, seeds, preset=args.preset, overrides=overrides, version=args.version,
        image_root=args.image_root, path_template=args.path_template, search=search,
    )  # fmt: skip
    selections = checked_selections(settings, args) if search else []
    parallel = slots(args.parallel, len(plans), overrides.get("device") or args.device)
    on_cpu = not _gpu_will_train(args, overrides)
    threads = threads_per_run(parallel) if on_cpu and "threads" not in overrides else None
    plans = _unfinished(settings, plans, threads) if search else plans
    _register_partitions(settings, args.benchmarks)
    sweep_dir = settings.runs_dir / "sweeps" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    n = len(args.benchmarks)
    each = f", {threads} CPU thread{'s' * (threads > 1)} each" if threads else ""
    shape = f"x {search[1]} draws x trials" if search else "x seeds"
    print(
        f"[sweep] {_runs(len(plans))} ({n} benchmark{'s' * (n > 1)} {shape} {','.join(map(str, seeds))}), "
        f"{parallel} at a time{each}; logs in {sweep_dir}",
        flush=True,
    )
    started = time.monotonic()
    with _Bar(len(plans)) as bar:
        try:
            outcomes = run_packed(
                plans, lambda plan: _command(args, plan, threads), parallel, sweep_dir, bar.finished, wait=take_stop
            )
        except SweepInterrupted as stopped:
            return _stopped(stopped, time.monotonic() - started)
    code = _summary(outcomes, parallel, time.monotonic() - started)
    return report_search(settings, args, selections) if search and code == 0 else code


def sweep_shape(args: argparse.Namespace) -> tuple[list[int], tuple[str, int] | None]:
    """The seeds of a sweep and its search (space, draws), or None: ``--search N --trials K`` trains draws 0..N-1,
    each with seeds 0..K-1 (its trials); ``--seed``/``--seeds`` otherwise."""
    if args.seed is not None and args.seeds is not None:
        raise InputError("give --seed or --seeds, not both", parameter="--seeds")
    if args.search is None:
        for flag, value in (("--trials", args.trials), ("--select", args.select)):
            if value is not None:
                raise InputError("belongs to a search: add --search N", parameter=flag)
        if args.search_space != "auto":
            raise InputError("belongs to a search: add --search N", parameter="--search-space")
        return (parse_seeds(args.seeds) if args.seeds is not None else [args.seed or 0]), None
    if args.seed is not None or args.seeds is not None:
        raise InputError("a search's seeds are its trials: give --trials K, not seeds", parameter="--seeds")
    if args.search < 1:
        raise InputError(f"draws must be at least 1, got {args.search}", parameter="--search")
    trials = 1 if args.trials is None else args.trials
    if not 1 <= trials <= len(SEEDS):
        raise InputError(f"trials are seeds 0..{len(SEEDS) - 1}: 1 to {len(SEEDS)}, got {trials}", parameter="--trials")
    return list(range(trials)), (args.search_space, args.search)


def checked_selections(settings: Settings, args: argparse.Namespace) -> list[str]:
    """The selection methods asked for, each checked against every benchmark's split before anything trains (the
    default: every method each benchmark's split allows)."""
    from shiftbench.erm.search_requests import selections_for

    return selections_for(settings, list(args.benchmarks), args.select, args.version)


def _unfinished(settings: Settings, plans: list[RunPlan], threads: int | None) -> list[RunPlan]:
    """A search's runs that are not yet published as planned (with the threads each will be given): a search
    started again trains only what it lacks."""
    from dataclasses import replace

    from shiftbench.erm.backends import published_version

    left = []
    for plan in plans:
        given = plan if threads is None else replace(plan, config={**plan.config, "threads": threads})
        version = published_version(settings, given)
        if version is None:
            left.append(plan)
        else:
            print(f"[sweep] {plan.run}: published (version {version}), not retrained", flush=True)
    return left


def report_search(settings: Settings, args: argparse.Namespace, selections: list[str]) -> int:
    """DomainBed's ``collect_results`` for this search: per selection method, each learner's test accuracy as the mean
    ± standard error over trials of the runs it picked."""
    from shiftbench.scoring.selection import selection_report
    from shiftbench.warehouse.catalog import open_catalog

    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        print("\n" + selection_report(con, args.benchmarks, selections), flush=True)
    return 0


def _stopped(stopped: SweepInterrupted, seconds: float) -> int:
    """A sweep stopped by a signal: what each run became, and how to go on (the same command resumes); the exit
    code is the signal's (130 for SIGINT, 75 for the others)."""
    import signal

    from shiftbench.erm.interrupt import exit_code

    kept = sum(o.interrupted for o in stopped.outcomes)
    published = sum(o.ok for o in stopped.outcomes)
    print(
        f"[sweep] interrupted ({signal.Signals(stopped.signum).name}) after {seconds:.1f}s: {published} published, "
        f"{kept} stopped with a checkpoint, {len(stopped.not_started)} not started; run the same command again to "
        "resume",
        file=sys.stderr,
    )
    return exit_code(stopped.signum)


def _gpu_will_train(args: argparse.Namespace, overrides: dict[str, Any]) -> bool:
    from shiftbench.erm.sweep import gpu_present

    device = str(overrides.get("device") or args.device or "auto")
    return device.startswith("cuda") or (device == "auto" and gpu_present())


def _command(args: argparse.Namespace, plan: RunPlan, threads: int | None) -> list[str]:
    """``shiftbench train`` for one run of the sweep, with the sweep's options and settings."""
    command = [
        sys.executable,
        "-m",
        "shiftbench.pipelines.cli",
        "train",
        plan.benchmark,
        "--seed",
        str(plan.config["seed"]),
    ]
    for name in _FORWARDED:
        value = getattr(args, name, None)
        if value:
            command += [f"--{name.replace('_', '-')}", str(value)]
    for item in args.set or []:
        command += ["--set", item]
    if plan.config.get("search"):  # the draw: the run derives its values from the space, as every backend does
        command += ["--set", f"search={plan.config['search']}", "--set", f"search_draw={plan.config['search_draw']}"]
    if threads is not None:
        command += ["--set", f"threads={threads}"]
    if args.in_process:
        command.append("--in-process")
    if args.restart:
        command.append("--restart")
    return command


def _register_partitions(settings: Settings, benchmarks: list[str]) -> None:
    """Every benchmark's ERM partition, added once here rather than by runs racing to add it."""
    from shiftbench.families import registry
    from shiftbench.pipelines.cli.common import dagster_instance

    dagster_kinds: dict[str, list[str]] = {}
    for benchmark in benchmarks:
        kind = registry.kind_of(settings, benchmark)
        if registry.family(kind.family).training_unavailable(settings) is None:
            dagster_kinds.setdefault(kind.qualified, []).append(benchmark)
    if not dagster_kinds:
        return
    instance = dagster_instance(settings)
    for qualified, names in dagster_kinds.items():
        known = set(instance.get_dynamic_partitions(qualified))
        new = [name for name in names if name not in known]
        if new:
            instance.add_dynamic_partitions(qualified, new)


class _Bar:
    """A bar over runs on a terminal (rich); one plain line per finished run everywhere."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> _Bar:
        if sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[sweep]"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn()
            )
            self.progress.start()
            self.task = self.progress.add_task("runs", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def finished(self, outcome: RunOutcome) -> None:
        self.done += 1
        line = f"[sweep {self.done}/{self.total}] {_describe(outcome)}"
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.advance(self.task)
        else:
            print(line, flush=True)


def _describe(outcome: RunOutcome) -> str:
    run = outcome.plan.run
    if outcome.interrupted:
        return f"{run} stopped ({outcome.seconds:.1f}s): {outcome.error}"
    if not outcome.ok:
        return f"{run} FAILED ({outcome.seconds:.1f}s): {outcome.error}; nothing published (log: {outcome.log})"
    became = "now latest" if outcome.became_latest else "already latest"
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in outcome.headline.items() if k in {"test/acc_avg", "test/acc_wg"})
    return f"{run} version {outcome.version} ({became}, {outcome.seconds:.1f}s)" + (f": {metrics}" if metrics else "")


def _summary(outcomes: list[RunOutcome], parallel: int, seconds: float) -> int:
    failed = [o for o in outcomes if not o.ok]
    print(
        f"[sweep] {_runs(len(outcomes))} in {seconds:.1f}s ({parallel} at a time): "
        f"{len(outcomes) - len(failed)} published, {len(failed)} failed"
    )
    if not failed:
        print(f'\nResults: {shiftbench_command()} sql "SELECT run, eval_split, metric, value FROM erm_results"')
        return 0
    for outcome in failed:
        print(f"error: {outcome.plan.run}: {outcome.error}", file=sys.stderr)
    return 2 if all(o.exit_code == 2 for o in failed) else 1


def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def wants_sweep(args: argparse.Namespace) -> bool:
    """A sweep when more than one benchmark, ``--seeds``, ``--parallel`` or a search's option is given."""
    searching = args.search is not None or args.trials is not None or args.select is not None
    searching = searching or args.search_space != "auto"
    return len(args.benchmarks) > 1 or args.seeds is not None or args.parallel is not None or searching
