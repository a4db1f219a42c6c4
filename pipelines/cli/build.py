"""``shiftbench build``: build, check and publish benchmarks, one Dagster run per kind (the jobs the UI runs).

The plan (which benchmarks and variants, what is skipped and why) is the library's
(:func:`shiftbench.families.plans.build_plan`); this shell launches the runs, prints a line per benchmark and the
summary.
"""

import argparse
import dataclasses
import time
from typing import Any

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, disk_full, free_bytes
from shiftbench.pipelines.cli.common import Subcommands, asset_key, dagster_instance

MAX_UNITS = 2**31 - 1  # units are steps and processes: past a 32-bit count it is a typo (the plan refuses more
# units than the benchmark splits into)


def add_build(sub: Subcommands) -> None:
    # No family names from the registry here: importing every family costs `sql` and `versions` 0.8 s.
    # An unknown family is one line naming those there are (registry.family).
    build = sub.add_parser("build", help="build, check and publish benchmarks (same jobs as the UI)")
    build.add_argument(
        "family", nargs="?", metavar="FAMILY", help="breeds, metashift, ... (default: the benchmarks' family or breeds)"
    )
    build.add_argument("--benchmark", action="append", metavar="NAME", help="repeatable; default: all")
    build.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec parameter (needs --name)")
    build.add_argument("--name", metavar="NEW", help="build the overridden spec as a new benchmark NEW")
    build.add_argument("--list", action="store_true", help="list the family's benchmark names and exit")
    build.add_argument(
        "--units",
        type=int,
        metavar="N",
        help="build each benchmark in N units side by side (MetaShift collections: buckets of classes), one Dagster "
        "run on its multiprocess executor; the same version as one piece",
    )
    build.set_defaults(func=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    from shiftbench.families.plans import build_plan, parse_overrides

    settings = Settings.from_env()
    if args.units is not None and not 1 <= args.units <= MAX_UNITS:
        raise InputError(
            f"must be in 1..{MAX_UNITS:,} (and at most what the benchmark splits into), got {args.units}",
            parameter="--units",
        )
    overrides = parse_overrides(args.set or [])
    plan = build_plan(settings, args.family, args.benchmark or [], overrides, args.name)
    from shiftbench.assets.factory import forget_variant
    from shiftbench.pipelines.terminal import Reporter

    instance = dagster_instance(settings)
    reporter = Reporter()
    for line in plan.skipped:
        reporter.line(line)
    needed = plan.inputs_needed(settings)  # the first run builds every input the plan reads
    run_failures: list[tuple[bool, int]] = []  # failed runs not explained by their benchmarks: (bad input?, count)
    full: Exception | None = None
    try:
        if args.units is not None:
            _run_fanned_out(instance, reporter, plan, needed, run_failures, args.units)
        else:
            _run_plan(instance, reporter, plan, needed, run_failures)
    except Exception as exc:  # a full disk after some publications: those stand, and the exit code says so
        if not disk_full(exc, settings.home):
            raise
        full = exc
    for outcome in reporter.outcomes:
        if outcome is not None and outcome.description is not None and outcome.publication is not None:
            for warning in outcome.description.warnings:
                reporter.warn(f"{outcome.benchmark}: {warning}")
    published = sum(1 for o in reporter.outcomes if o is not None and o.publication is not None)
    failed = reporter.failed_checks + reporter.errors + sum(count for _, count in run_failures)
    if full is not None:
        failed = max(failed, plan.total - published)
        _report_full_disk(reporter, settings, failed)
    if plan.registered is not None and not published:  # a new name whose build failed stays free
        forget_variant(instance, settings, next(iter(plan.names)), plan.registered)
    total = published + failed
    summary = f"{published} of {total} published" if failed else f"{published} published"
    print(f"\n{summary} in {time.monotonic() - reporter.started:.1f}s")
    print(f"Store:   {settings.store_dir}\nCatalog: {settings.catalog_path}")
    if reporter.user_errors or any(is_input for is_input, _ in run_failures):
        return 2
    return 1 if failed else 0


def _report_full_disk(reporter: Any, settings: Settings, failed: int) -> None:
    free = f"{free_bytes(settings.home) >> 10:,} KiB free"
    if failed:
        message = f"error: the disk holding {settings.home} is full ({free}): what is listed as published stands "
        reporter.line(message + "whole; free space and rerun", error=True)
    else:
        message = f"warning: the disk holding {settings.home} is full ({free}), after every benchmark was "
        reporter.line(message + "published whole: free space before the next build", error=True)


def _run_plan(instance: Any, reporter: Any, plan: Any, needed: list[str], run_failures: list[tuple[bool, int]]) -> None:
    """One Dagster run per block of partitions of each kind; failures not explained by a benchmark are counted."""
    from shiftbench.assets.factory import inputs_read
    from shiftbench.pipelines import runs

    first = True
    with reporter.listening():
        for kind, names in plan.names.items():
            known = set(instance.get_dynamic_partitions(kind.qualified))
            instance.add_dynamic_partitions(kind.qualified, [n for n in names if n not in known])
            order = instance.get_dynamic_partitions(kind.qualified)
            keys = [asset_key(kind.staged_key), asset_key(kind.publish_key)]
            for block in runs.contiguous_blocks(names, order):
                selection = [*(inputs_read(plan.family, kind, needed) if first else []), *keys]
                first = False
                before = len(reporter.outcomes)
                run = runs.run_job(instance, kind.qualified, assets=selection, partitions=block)
                reported = {o.benchmark for o in reporter.outcomes[before:] if o is not None}
                unreported = [name for name in block if name not in reported]
                if not run.is_success and unreported:  # the run stopped before these: say so, count them
                    message, is_input = runs.run_error(instance, run)
                    shown = ", ".join(unreported) if len(unreported) <= 3 else f"{len(unreported)} {kind.plural}"
                    reporter.line(f"error: {message}; nothing published for {shown}", error=True)
                    run_failures.append((is_input, len(unreported)))


def _run_fanned_out(
    instance: Any, reporter: Any, plan: Any, needed: list[str], run_failures: list[tuple[bool, int]], units: int
) -> None:
    """Each benchmark in ``units`` units side by side: one run of the kind's fan-out job (plan -> units -> publish)
    on Dagster's multiprocess executor, after one run that builds the inputs."""
    from shiftbench.assets.factory import inputs_read
    from shiftbench.pipelines import runs

    kinds = plan.fanned_out_kinds()
    with reporter.listening():
        inputs = inputs_read(plan.family, kinds[0], needed)
        if inputs:
            run = runs.run_job(instance, kinds[0].qualified, assets=inputs)
            if not run.is_success:
                message, is_input = runs.run_error(instance, run)
                reporter.line(f"error: {message}; nothing published", error=True)
                run_failures.append((is_input, plan.total))
                return
    done = 0
    for kind in kinds:
        known = set(instance.get_dynamic_partitions(kind.qualified))
        instance.add_dynamic_partitions(kind.qualified, [n for n in plan.names[kind] if n not in known])
        for name in plan.names[kind]:
            done += 1
            _run_units(instance, reporter, kind, name, units, f"[{done}/{plan.total}] {name}", run_failures)


def _run_units(
    instance: Any, reporter: Any, kind: Any, name: str, units: int, shown: str, run_failures: list[tuple[bool, int]]
) -> None:
    """One run of the kind's fan-out job for one benchmark, and its line."""
    import dagster as dg

    from shiftbench.pipelines import runs

    prefix = kind.fanout_prefix
    config = {"benchmark": name, "units": units}
    ops = {f"{prefix}_plan": {"config": config}, f"{prefix}_publish": {"config": config}}
    started = time.monotonic()
    run = runs.run_job(instance, f"{kind.qualified}_fanout", config={"ops": ops})
    if not run.is_success:
        message, is_input = runs.run_error(instance, run)
        reporter.line(f"{shown}: error: {message}; nothing published", error=True)
        run_failures.append((is_input, 1))
        return
    records = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    events = [r.asset_materialization for r in records if r.asset_materialization is not None]
    mine = [m for m in events if m.asset_key == asset_key(kind.publish_key)][-1]
    meta = {k: v.value for k, v in mine.metadata.items()}
    state = "now latest" if meta["became_latest"] else "already latest"
    reporter.line(
        f"{shown}: version {meta['version']} ({state}; {meta['summary']}; {units} units, "
        f"{time.monotonic() - started:.1f}s)"
    )
    reporter.outcomes.append(_Published(name))


@dataclasses.dataclass
class _Published:
    """A benchmark a fanned-out run published (what the summary counts)."""

    benchmark: str
    publication: object = True
    description: object = None
    status: str = "published"
    user_error: bool = False


def _list(args: argparse.Namespace) -> int:
    from shiftbench.families.plans import listing

    for name, note in listing(Settings.from_env(), args.family):
        print(name + (f"  ({note})" if note is not None else ""))
    return 0
