"""``shiftbench train B1 B2 --seeds 0-2 --backend slurm``: the sweep as one Slurm job array.

Every run is planned and the cluster settings checked before anything is submitted; each run is then taken where
an earlier command left it (one line each: published if finished, followed if still queued, resubmitted if stopped
or failed, :func:`shiftbench.erm.backends.take_stock`); the array runs ``--parallel`` (else the settings'
``array_parallelism``) tasks at a time; each task's log lines are printed as they come, prefixed by its run; each
finished run is published here, as it ends, by the code a local run publishes with, and a failed one is one line
naming the run, the job id and Slurm's reason. Ctrl-C cancels the jobs (exit 130); SIGTERM, SIGUSR1 or SIGHUP to
this process leave them running (exit 75): the same command collects them. The runs are not Dagster runs (the ERM
asset with ``SHIFTBENCH_TRAIN_BACKEND=slurm`` is).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from shiftbench.config.settings import Settings
from shiftbench.erm import backends
from shiftbench.erm.slurm_settings import load_cluster_settings
from shiftbench.erm.stops import take_stop
from shiftbench.erm.sweep import plan_sweep
from shiftbench.errors import InputError
from shiftbench.pipelines.cli.sweep import _Bar, _summary, checked_selections, report_search, sweep_shape


def chosen_backend(args: argparse.Namespace, settings: Settings) -> str:
    """``--backend``, else ``SHIFTBENCH_TRAIN_BACKEND``; the flags that only one backend takes are checked here."""
    backend = str(getattr(args, "backend", None) or settings.train_backend)
    if backend != "slurm" and getattr(args, "slurm_settings", None) is not None:
        raise InputError("only with --backend slurm", parameter="--slurm-settings")
    if backend == "slurm" and args.in_process:
        raise InputError(
            "a Slurm job trains on a node, not in this process: drop --in-process", parameter="--in-process"
        )
    return backend


def cmd_slurm_sweep(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    from shiftbench.families.plans import trainable_kind

    settings = Settings.from_env()
    settings_file: Path | None = args.slurm_settings or settings.slurm_settings
    cluster = load_cluster_settings(settings_file)  # a bad value: one line, nothing planned or submitted
    seeds, search = sweep_shape(args)
    for benchmark in args.benchmarks:
        trainable_kind(settings, benchmark)
    on_cpu = not str(overrides.get("device") or args.device or "auto").startswith("cuda") and not cluster.gres
    if on_cpu and "threads" not in overrides:  # the task's CPUs, recorded with the run (CPU bytes depend on it)
        overrides = {**overrides, "threads": cluster.cpus_per_task}
    plans = plan_sweep(
        settings, args.benchmarks, seeds, preset=args.preset, overrides=overrides, version=args.version,
        image_root=args.image_root, path_template=args.path_template, search=search,
    )  # fmt: skip
    selections = checked_selections(settings, args) if search else []
    parallel = backends.default_parallelism(cluster, args.parallel, len(plans))
    started = time.monotonic()
    with _Bar(len(plans)) as bar:

        def submitted(submission: backends.Submission | None, standings: list[backends.Standing]) -> None:
            for standing in standings:
                _say(bar, f"[sweep] {standing.plan.run}: {standing.line}")
            if submission is None:
                return
            n = len(submission.tasks)
            _say(
                bar,
                f"[sweep] {n} run{'s' * (n != 1)} as Slurm job array {submission.array_id}, "
                f"{min(parallel, n)} at a time, {cluster.cpus_per_task} CPU{'s' * (cluster.cpus_per_task > 1)} each"
                f"{f' ({settings_file})' if settings_file else ''}; logs in {submission.folder}",
            )

        try:
            outcomes = backends.run_sweep(
                settings, cluster, plans, parallel, lambda run, line: _say(bar, f"[{run}] {line}"), bar.finished,
                submitted, wait=take_stop, restart=args.restart,
            )  # fmt: skip
        except backends.SweepStopped as stopped:
            print(f"[sweep] {stopped}", file=sys.stderr, flush=True)
            return stopped.exit_code
    code = _summary(outcomes, parallel, time.monotonic() - started)
    return report_search(settings, args, selections) if search and code == 0 else code


def _say(bar: _Bar, line: str) -> None:
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP): the jobs go on, the lines are in the logs
        if bar.progress is not None:
            bar.progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)
