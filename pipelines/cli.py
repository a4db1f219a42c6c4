"""The ``shiftbench`` command: the same Dagster jobs the UI runs, from a terminal.

    shiftbench build [FAMILY] [--benchmark NAME ...] [--set KEY=VALUE ... --name NEW] [--list]
    shiftbench sql "SELECT ..." [--csv]
    shiftbench versions [BENCHMARK]
    shiftbench check [BENCHMARK ...]      re-check published versions against their contracts
    shiftbench catalog                    recreate the DuckDB views
    shiftbench gc [--keep N] [--dry-run]  delete all but the N most recent versions
    shiftbench train BENCHMARK [--model M] [--seed N] [--device D] [--preset P] [--set KEY=VALUE ...]
    shiftbench train BENCHMARK [BENCHMARK ...] --seeds 0,1,2 [--parallel K] [...]   (a sweep)
    shiftbench export BENCHMARK DIR --layout imagefolder

Runs go to the Dagster instance in ``$DAGSTER_HOME`` (default ``$SHIFTBENCH_HOME/dagster_home``)
with the code location's origin, so ``dagster dev`` on the same DAGSTER_HOME lists them under their
jobs. Building any number of benchmarks of a kind is one run. Every user error, before or inside a
run, is one line naming the file, line or parameter, with exit code 2 (1 when a benchmark failed
its contract checks, the store is damaged, shiftbench itself failed or the disk is full); nothing is
published then and previous versions stay latest.
"""

import argparse
import atexit
import contextlib
import dataclasses
import os
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from shiftbench.errors import ContractViolation, InputError, ShiftbenchError, StoreError, disk_full, free_bytes
from shiftbench.outputs import output_file, write_output_file
from shiftbench.settings import Settings

_DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\npython_logs:\n  python_log_level: WARNING\n"


def ensure_dagster_home(settings: Settings) -> Path:
    """A persistent instance with telemetry off (this machine is offline; users may be too)."""
    home = Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(_DAGSTER_YAML, encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(home.absolute())
    return home


def _instance(settings: Settings) -> Any:
    """The Dagster instance, created by one process at a time.

    Dagster's SQLite storages create their tables and stamp their schema version when first
    opened; two processes doing that at once in a new home race (duplicate alembic heads leave the
    home unusable). Opening under a lock costs milliseconds once the home exists.
    """
    import dagster as dg
    from filelock import FileLock

    home = ensure_dagster_home(settings)
    with FileLock(home / ".instance.lock"):
        instance = dg.DagsterInstance.get()
        instance.get_runs(limit=1)  # run storage
        instance.get_dynamic_partitions("shiftbench")  # event log storage
        instance.all_instigator_state()  # schedule storage
    return instance


def _parse_sets(items: Sequence[str]) -> dict[str, Any]:
    from shiftbench.spec_files import parse_value

    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {item!r}", parameter="--set")
        overrides[key.strip()] = parse_value(value.strip())
    return overrides


# -- build ------------------------------------------------------------------------------------------
def _plan(settings: Settings, args: argparse.Namespace) -> tuple[Any, dict[Any, list[str]], list[str], str | None]:
    """(family, names per kind, skipped lines, a variant this call registered): checked before any run."""
    from shiftbench import registry, variants

    overrides = _parse_sets(args.set or [])
    names = list(dict.fromkeys(args.benchmark or []))
    kinds = [registry.kind_of(settings, name) for name in names]
    family_name = args.family or (kinds[0].family if kinds else "breeds")
    family = registry.family(family_name)
    for name, kind in zip(names, kinds, strict=True):
        if kind.family != family.name:
            raise InputError(f"{name} is a {kind.family} {kind.name}, not {family.name}", parameter="--benchmark")
    plan: dict[Any, list[str]] = {}
    skipped: list[str] = []
    registered = None
    if args.name is not None:
        if len(names) != 1:
            raise InputError("--name needs exactly one --benchmark (the spec it varies)", parameter="--name")
        known = set(variants.load_variants(settings))
        variant = registry.register_variant(settings, kinds[0], args.name, names[0], overrides)
        plan[kinds[0]] = [variant.name]
        registered = None if variant.name in known else variant.name
    elif overrides:
        shown = ", ".join(names) or f"the {family.name} benchmarks"
        raise InputError(
            f"overriding parameters of {shown} needs --name NEW: a benchmark's name always means the same content",
            parameter="--set",
        )
    elif names:
        for name, kind in zip(names, kinds, strict=True):
            variants.resolve(settings, kind, name)  # unavailable here: says why
            plan.setdefault(kind, []).append(name)
    else:
        for kind in family.kinds:
            plan[kind] = list(variants.targets(settings, kind))
            missing = variants.unavailable(settings, kind)
            reasons = sorted(set(missing.values()))
            for reason in reasons:
                count = sum(1 for r in missing.values() if r == reason)
                skipped.append(f"skipped {count} {kind.plural if count > 1 else kind.name}: {reason}")
    return family, {kind: batch for kind, batch in plan.items() if batch}, skipped, registered


def cmd_build(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    settings = Settings.from_env()
    if args.units is not None and args.units < 1:
        raise InputError(f"must be at least 1, got {args.units}", parameter="--units")
    family, plan, skipped, registered = _plan(settings, args)
    from assets.factory import forget_variant
    from pipelines.terminal import Reporter

    instance = _instance(settings)
    reporter = Reporter()
    for line in skipped:
        reporter.line(line)
    # The first run builds every input the plan reads (later runs of other kinds load them).
    from shiftbench import variants

    needed: list[str] = []
    for kind, names in plan.items():
        specs = [target.spec for name, target in variants.targets(settings, kind).items() if name in names]
        needed += kind.inputs_needed(settings, specs)
    run_failures: list[tuple[bool, int]] = []  # failed runs not explained by their benchmarks: (bad input?, count)
    full: Exception | None = None
    try:
        if args.units is not None:
            _run_fanned_out(instance, reporter, family, plan, needed, run_failures, args.units)
        else:
            _run_plan(instance, reporter, family, plan, needed, run_failures)
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
        failed = max(failed, sum(len(names) for names in plan.values()) - published)
        free = f"{free_bytes(settings.home) >> 10:,} KiB free"
        if failed:
            message = f"error: the disk holding {settings.home} is full ({free}): what is listed as published stands "
            reporter.line(message + "whole; free space and rerun", error=True)
        else:
            message = f"warning: the disk holding {settings.home} is full ({free}), after every benchmark was "
            reporter.line(message + "published whole: free space before the next build", error=True)
    if registered is not None and not published:  # a new name whose build failed stays free
        forget_variant(instance, settings, next(iter(plan)), registered)
    total = published + failed
    summary = f"{published} of {total} published" if failed else f"{published} published"
    print(f"\n{summary} in {time.monotonic() - reporter.started:.1f}s")
    print(f"Store:   {settings.store_dir}\nCatalog: {settings.catalog_path}")
    if reporter.user_errors or any(is_input for is_input, _ in run_failures):
        return 2
    return 1 if failed else 0


def _run_plan(
    instance: Any,
    reporter: Any,
    family: Any,
    plan: dict[Any, list[str]],
    needed: list[str],
    run_failures: list[tuple[bool, int]],
) -> None:
    """One Dagster run per block of partitions of each kind; failures not explained by a benchmark are counted."""
    from assets.factory import inputs_read
    from pipelines import runs

    first = True
    with reporter.listening():
        for kind, names in plan.items():
            known = set(instance.get_dynamic_partitions(kind.qualified))
            instance.add_dynamic_partitions(kind.qualified, [n for n in names if n not in known])
            order = instance.get_dynamic_partitions(kind.qualified)
            keys = [_key(kind.staged_key), _key(kind.publish_key)]
            for block in runs.contiguous_blocks(names, order):
                selection = [*(inputs_read(family, kind, needed) if first else []), *keys]
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
    instance: Any,
    reporter: Any,
    family: Any,
    plan: dict[Any, list[str]],
    needed: list[str],
    run_failures: list[tuple[bool, int]],
    units: int,
) -> None:
    """Each benchmark in ``units`` units side by side: one run of the kind's fan-out job (plan -> units -> publish)
    on Dagster's multiprocess executor, after one run that builds the inputs."""
    import dagster as dg

    from assets.factory import inputs_read
    from pipelines import runs

    kinds = [kind for kind in plan if kind.fanout is not None]
    if len(kinds) != len(plan):
        other = next(kind for kind in plan if kind.fanout is None)
        raise InputError(f"{family.name} {other.plural} are built in one piece (no units)", parameter="--units")
    with reporter.listening():
        inputs = inputs_read(family, kinds[0], needed)
        if inputs:
            run = runs.run_job(instance, kinds[0].qualified, assets=inputs)
            if not run.is_success:
                message, is_input = runs.run_error(instance, run)
                reporter.line(f"error: {message}; nothing published", error=True)
                run_failures.append((is_input, sum(len(names) for names in plan.values())))
                return
    total = sum(len(names) for names in plan.values())
    done = 0
    for kind in kinds:
        known = set(instance.get_dynamic_partitions(kind.qualified))
        instance.add_dynamic_partitions(kind.qualified, [n for n in plan[kind] if n not in known])
        prefix = f"{kind.family}__{kind.name}"
        for name in plan[kind]:
            config = {"benchmark": name, "units": units}
            ops = {f"{prefix}_plan": {"config": config}, f"{prefix}_publish": {"config": config}}
            started = time.monotonic()
            run = runs.run_job(instance, f"{kind.qualified}_fanout", config={"ops": ops})
            done += 1
            if not run.is_success:
                message, is_input = runs.run_error(instance, run)
                reporter.line(f"[{done}/{total}] {name}: error: {message}; nothing published", error=True)
                run_failures.append((is_input, 1))
                continue
            records = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
            events = [r.asset_materialization for r in records if r.asset_materialization is not None]
            mine = [m for m in events if m.asset_key == _key(kind.publish_key)][-1]
            meta = {k: v.value for k, v in mine.metadata.items()}
            state = "now latest" if meta["became_latest"] else "already latest"
            reporter.line(
                f"[{done}/{total}] {name}: version {meta['version']} ({state}; {meta['summary']}; {units} units, "
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


def _key(path: tuple[str, ...]) -> Any:
    import dagster as dg

    return dg.AssetKey(list(path))


def _list(args: argparse.Namespace) -> int:
    from shiftbench import registry, variants

    settings = Settings.from_env()
    family = registry.family(args.family or "breeds")
    registry.spec_kinds(settings)  # names clashing across families are an error here too
    for kind in family.kinds:
        missing = variants.unavailable(settings, kind)
        for name in kind.specs(settings):
            print(f"{name}" + (f"  (not here: {missing[name]})" if name in missing else ""))
        for variant in variants.load_variants(settings).values():
            if variant.family == family.name and variant.kind == kind.name:
                print(f"{variant.name}  (variant of {variant.base}: {variant.overrides})")
    return 0


# -- train ------------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    """One ERM run through the kind's ERM job: the partition (benchmark, seed) the UI would run."""
    from pipelines import runs
    from pipelines.sweep import cmd_sweep, wants_sweep
    from pipelines.terminal import Reporter
    from shiftbench import registry
    from shiftbench.erm.launch import plan_run

    settings = Settings.from_env()
    overrides = _parse_sets(args.set or [])
    for key in ("model", "device"):
        if getattr(args, key):
            overrides[key] = getattr(args, key)
    if wants_sweep(args):
        _typed_training(overrides)  # every value checked before any run is planned
        return cmd_sweep(args, overrides)
    args.benchmark, args.seed = args.benchmarks[0], 0 if args.seed is None else args.seed
    kind = registry.kind_of(settings, args.benchmark)
    if not kind.trainable:
        raise InputError(f"{args.benchmark} is a {kind.family} {kind.name}: it has no examples to train on")
    if not 0 <= args.seed <= 9:
        raise InputError("seeds are partitions 0..9", parameter="--seed")
    # Plan first: a missing split, image root or a bad parameter fails here, before a run starts.
    plan = plan_run(
        settings,
        args.benchmark,
        version=args.version,
        seed=args.seed,
        preset=args.preset,
        overrides=overrides,
        image_root=args.image_root,
        path_template=args.path_template,
    )
    print(
        f"[train] {plan.run}: {plan.benchmark} version {plan.split_version}, {plan.n_train:,} training examples, "
        f"images {plan.images.kind} ({plan.images.root})",
        flush=True,
    )
    unavailable = registry.family(kind.family).training_unavailable(settings)
    started = time.monotonic()
    if unavailable is not None:  # no ERM asset for this family here: the library path, said so
        return _train_outside_dagster(settings, plan, unavailable, started)
    import dagster as dg

    from assets.erm import RUN_FIELDS, baseline_job_name, baseline_keys

    config: dict[str, Any] = {key: getattr(args, key) for key in RUN_FIELDS if getattr(args, key, None)}
    config["preset"] = plan.preset  # the run planned above, never the last run's settings
    config.update(_typed_training(overrides))
    instance = _instance(settings)
    known = set(instance.get_dynamic_partitions(kind.qualified))
    if args.benchmark not in known:
        instance.add_dynamic_partitions(kind.qualified, [args.benchmark])
    key = dg.MultiPartitionKey({"benchmark": args.benchmark, "seed": str(args.seed)})
    _, publish_key = baseline_keys(kind)
    with Reporter().listening():
        run = runs.run_job(
            instance,
            baseline_job_name(kind),
            partition_key=key,
            config={"ops": {f"erm__{kind.family}_{kind.name}_baseline": {"config": config}}},
        )
    if not run.is_success:
        message, is_input = runs.run_error(instance, run)
        print(f"error: {message}; nothing was published", file=sys.stderr)
        return 2 if is_input else 1
    records = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    materialized = [r.asset_materialization for r in records if r.asset_materialization is not None]
    mine = [m for m in materialized if m.asset_key == publish_key]
    if not mine:
        raise StoreError(f"run {run.run_id} published no results (see it in the UI)")
    meta = {k: v.value for k, v in mine[-1].metadata.items()}
    _print_training(meta, time.monotonic() - started)
    return 0


def _typed_training(overrides: dict[str, Any]) -> dict[str, Any]:
    """``--set`` values as the typed launchpad config of the ERM asset (nullable ones as YAML text)."""
    from dataclasses import fields

    from assets.erm import NULLABLE
    from shiftbench.erm.config import TrainConfig, coerce_value
    from shiftbench.spec_files import format_value

    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    typed: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in types or key == "seed":
            TrainConfig.from_mapping({key: value})  # names the unknown parameter
            raise InputError("set the seed with --seed (seeds are partitions)", parameter="seed")
        if key in NULLABLE:
            typed[key] = format_value(value)
            continue
        coerced = coerce_value(value, types[key], key)
        typed[key] = list(coerced) if isinstance(coerced, tuple) else coerced
    TrainConfig.from_mapping(overrides)  # validates every value now
    return typed


def _train_outside_dagster(settings: Settings, plan: Any, reason: str, started: float) -> int:
    from shiftbench.erm.launch import scratch_dir, train_in_process

    print(f"[train] not a Dagster run ({reason}); training in this process", flush=True)
    out_dir = scratch_dir(settings, plan, f"cli-{os.getpid()}")
    outcome, summary = train_in_process(settings, plan, out_dir)
    import polars as pl

    from shiftbench.erm.launch import headline

    results = pl.read_parquet(outcome.staged.table_path("erm_results"))
    meta = {
        "run": plan.run,
        "version": outcome.staged.version,
        "became_latest": outcome.publication.changed_latest,
        "selection_split": summary["selection_split"],
        "best_iteration": summary["best_iteration"],
        "device": summary["device"],
        "train_images_per_s": summary["train_images_per_s"] or 0.0,
        **headline(results),
    }
    _print_training(meta, time.monotonic() - started)
    return 0


def _print_training(meta: dict[str, Any], seconds: float) -> None:
    became = "now latest" if meta["became_latest"] else "already latest"
    print(f"[train] {meta['run']} version {meta['version']} ({became}, {seconds:.1f}s)")
    print(
        f"  selection on {meta['selection_split']}, best iteration {meta['best_iteration']}, "
        f"{meta['device']}, {float(meta['train_images_per_s']):,.0f} training images/s"
    )
    for key, value in meta.items():
        if "/acc_" in key and value is not None:
            print(f"  {key:<28} {float(value):.4f}")
    print(f"\nResults: shiftbench sql \"SELECT * FROM erm_results WHERE run = '{meta['run']}'\"")


def cmd_export(args: argparse.Namespace) -> int:
    from shiftbench.erm.export import EXPORTS, check_target, export_domainbed
    from shiftbench.erm.launch import published_split, resolve_images

    settings = Settings.from_env()
    check_target(args.dir)  # before anything is read: a file, a full or read-only place is one line
    if args.environment and args.layout != "domainbed":
        raise InputError("--environment is for --layout domainbed", parameter="--environment")
    split = published_split(settings, args.benchmark, args.version)
    images = resolve_images(settings, split, args.image_root, args.path_template)
    if args.layout == "domainbed":
        counts = export_domainbed(split, images, args.dir, args.environment or "group")
    else:
        counts = EXPORTS[args.layout](split, images, args.dir)
    total = sum(counts.values())
    detail = ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))
    if len(counts) > 8:
        detail = f"{len(counts)} environments of {min(counts.values()):,} to {max(counts.values()):,} images"
    print(
        f"{args.dir}: {args.layout} layout, {total:,} {images.kind} images of {split.benchmark} {split.version} "
        f"({detail})"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Score a predictions file on a published split and publish the results (shiftbench.scoring)."""
    import polars as pl

    from shiftbench.erm.launch import published_split
    from shiftbench.scoring import check_method, check_seed, publish_scores, read_predictions

    settings = Settings.from_env()
    check_method(args.method)
    check_seed(args.seed)
    split = published_split(settings, args.benchmark, args.version)
    predictions = read_predictions(args.predictions, int(split.examples.select(pl.col("y").max()).item()) + 1)
    group_by = [f.strip() for f in args.group_by.split(",") if f.strip()] if args.group_by else []
    outcome, tables = publish_scores(settings, split, predictions, args.method, args.seed, group_by)
    run = tables["eval_runs"].row(0, named=True)
    state = "now latest" if outcome.publication.changed_latest else "already latest"
    print(
        f"{run['run']}: version {outcome.staged.version} ({state}; {split.benchmark} {split.version}, "
        f"splits {', '.join(run['covered_splits'])})"
    )
    headline = tables["eval_results"].filter(pl.col("metric").is_in(["acc_avg", "acc_wg", "f1_macro", "ece"]))
    for row in headline.sort("eval_split", "metric").iter_rows(named=True):
        group = f" ({row['group']})" if row["metric"] == "acc_wg" and row["group"] else ""
        value = "NULL" if row["value"] is None else f"{row['value']:.4f}"
        print(f"  {row['eval_split']}/{row['metric']:<12} {value}{group}")
    print(f"\nResults: shiftbench sql \"SELECT * FROM results WHERE run = '{run['run']}'\"")
    return 0


def cmd_generate_metashift_dg(args: argparse.Namespace) -> int:
    """Write a distance-controlled MetaShift domain-generalization task spec (shiftbench.metashift.generate)."""

    from shiftbench import building
    from shiftbench.metashift import family as metashift
    from shiftbench.metashift.generate import DgRequest, generate_dg
    from shiftbench.metashift.specs import load_specs
    from shiftbench.registry import check_new_name

    settings = Settings.from_env()
    if args.out is not None:
        output_file(args.out, "--out")  # before the scenes are read: a directory or a missing folder is one line
    if args.name is not None:
        check_new_name(settings, args.name, "--name")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    if len(classes) != 2:
        raise InputError(f"expected two classes A,B, got {args.classes!r}", parameter="--classes")
    try:
        quantiles = tuple(float(q) for q in args.quantiles.split(",")) if args.quantiles else None
    except ValueError:
        raise InputError(f"expected numbers Q,Q,..., got {args.quantiles!r}", parameter="--quantiles") from None
    kinds = tuple(k.strip() for k in args.context_kinds.split(",")) if args.context_kinds else ("object", "general")
    request = DgRequest(
        classes=(classes[0], classes[1]),
        test=args.test,
        n=args.n,
        quantiles=quantiles,
        name=args.name,
        train_size=args.train_size,
        context_kinds=kinds,
    )
    released = kinds == ("attribute",) and not settings.gqa_scene_graphs
    scenes_input = metashift.RELEASED if released else metashift.SCENES
    artifact = building.build_inputs(settings, metashift.METASHIFT, [scenes_input.name])[scenes_input.name]
    objects, images = metashift.read_scenes(artifact)
    source = f"{artifact.meta['dataset']} ({artifact.meta['kind']}, {artifact.fingerprint[:16]})"
    task = generate_dg(objects, images, load_specs(settings.metashift_specs).general_contexts, request, source)
    if args.out is None:
        sys.stdout.write(task.text)
    else:
        write_output_file(args.out, task.text, "--out")
    print(f"{task.name}: {len(task.choices)} variants from {task.n_candidates} candidates", file=sys.stderr)
    for choice in task.choices:
        print(f"  {choice.subset:<30} quantile {choice.quantile:<6g} d={choice.distance:.4f}", file=sys.stderr)
    if args.out is not None:
        print(f"wrote {args.out}: SHIFTBENCH_METASHIFT_SPECS={args.out} shiftbench build metashift", file=sys.stderr)
    return 0


# -- the warehouse ----------------------------------------------------------------------------------
def cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from shiftbench.catalog import open_catalog

    settings = Settings.from_env()
    if args.max_rows < 1:
        raise InputError(f"must be at least 1, got {args.max_rows}", parameter="--max-rows")
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)  # rebuilt first if not this store's
    with con:
        [(left_out,)] = con.execute("SELECT count(*) FROM catalog_problems").fetchall()
        if left_out:
            warning = f"warning: {left_out} damaged file(s) left out of the catalog: see `shiftbench check`"
            print(warning, file=sys.stderr)
        try:
            relation = con.sql(args.query)
        except duckdb.Error as exc:
            print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        if relation is None:
            return 0
        if args.csv:
            sys.stdout.write(relation.pl().write_csv())
        else:
            relation.show(max_rows=args.max_rows, max_width=200)
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """The leaderboard view as a table for a paper (Markdown) or the terminal."""
    from shiftbench.catalog import open_catalog
    from shiftbench.reporting import check_request, leaderboard_table, to_markdown, to_text

    settings = Settings.from_env()
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        check_request(con, args.benchmark, metrics, splits)
        table = leaderboard_table(con, args.benchmark, metrics, splits)
    if table.is_empty():
        print("no results on the latest split versions (shiftbench train, shiftbench eval)", file=sys.stderr)
        return 0
    sys.stdout.write(to_markdown(table) if args.format == "markdown" else to_text(table))
    return 0


def cmd_analyse(args: argparse.Namespace) -> int:
    """Rebuild the papers' analyses from the results in the catalog and publish the ones with data."""
    from shiftbench.analysis import ANALYSES, publish

    settings = Settings.from_env()
    unknown = [n for n in args.analysis if n not in ANALYSES]
    if unknown:
        raise InputError(f"unknown analysis {unknown[0]!r}; known: {', '.join(ANALYSES)}", parameter="analysis")
    for name in args.analysis or list(ANALYSES):
        outcome, frame = publish(settings, ANALYSES[name])
        if outcome is None:
            print(f"{name}: no results yet (shiftbench train, shiftbench eval)")
            continue
        figure = outcome.staged.path / "files" / ANALYSES[name].figure_file
        print(f"{name}: version {outcome.staged.version}, {frame.height} rows; table {ANALYSES[name].table}; {figure}")
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    from pipelines.terminal import table
    from shiftbench.store import Store

    settings = Settings.from_env()
    store = Store(settings.store_dir)
    versions = store.versions(args.benchmark)
    for problem in sorted(store.problems):
        print(f"warning: {problem}", file=sys.stderr)
    if not versions:
        print("no published versions" + (f" of {args.benchmark}" if args.benchmark else ""))
        return 1 if args.benchmark else 0
    rows = [
        (
            info.family,
            info.benchmark,
            info.version,
            info.published_at[:19].replace("T", " "),
            "*" if info.is_latest else "",
            info.n_examples,
            info.params.get("hierarchy") or info.params.get("dataset") or "",
        )
        for info in versions
    ]
    print(table(rows, ("family", "benchmark", "version", "first published (UTC)", "latest", "examples", "source")))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Re-verify the latest versions: every file against the manifest's checksums, then every contract."""
    from shiftbench.publishing import check_version
    from shiftbench.store import Store

    settings = Settings.from_env()
    store = Store(settings.store_dir)
    latest = [v for v in store.versions() if v.is_latest and (not args.benchmark or v.benchmark in args.benchmark)]
    unpublished = sorted(set(args.benchmark or []) - {v.benchmark for v in latest})
    if unpublished:
        raise InputError(f"{unpublished[0]!r} has no published version", parameter="BENCHMARK")
    bad = 0
    for info in latest:
        staged = store.staged(info.family, info.benchmark, info.version)
        damage = store.damage(staged)
        if damage is not None:  # name the damaged file; the other versions are still checked
            print(f"{info.benchmark} {info.version}: DAMAGED: {damage} (rebuild it to repair)")
            bad += 1
            continue
        results = check_version(store, staged, reuse=False)
        failed = [r for rules in results.values() for r in rules if not r.passed]
        total = sum(len(r) for r in results.values())
        files = len(staged.manifest()["tables"])
        held = f"{total - len(failed)}/{total} rules hold"
        print(f"{info.benchmark} {info.version}: {files} files match their checksums, {held}")
        for rule in failed:
            print(f"  {rule.line()}")
        bad += bool(failed)
    for problem in sorted(store.problems):
        print(f"DAMAGED: {problem}")
        bad += 1
    return 1 if bad else 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from shiftbench.catalog import refresh_catalog

    settings = Settings.from_env()
    result = refresh_catalog(settings.catalog_path, settings.store_dir)
    for problem in result.problems:
        print(f"left out (damaged): {problem}")
    print(f"{settings.catalog_path}: {'views refreshed' if result.ok else result.reason}")
    return 0 if result.ok else 1


def cmd_gc(args: argparse.Namespace) -> int:
    from shiftbench.catalog import refresh_and_report
    from shiftbench.store import Store

    settings = Settings.from_env()
    removed = Store(settings.store_dir).garbage_collect(keep=args.keep, dry_run=args.dry_run)
    for path in removed:
        print(("would remove " if args.dry_run else "removed ") + str(path))
    if not removed:
        print(f"nothing to delete: every benchmark has at most {args.keep} published version(s) and nothing stale")
    if not args.dry_run and removed:
        refresh_and_report(settings.catalog_path, settings.store_dir)
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line on stderr and exit code 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    # No family names from the registry here: importing every family costs `sql` and `versions` 0.8 s.
    # An unknown family is one line naming those there are (registry.family).
    parser = OneLineParser(prog="shiftbench", description="Distribution-shift benchmark splits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
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
    sql = sub.add_parser("sql", help="run SQL against the catalog")
    sql.add_argument("query")
    sql.add_argument("--csv", action="store_true", help="write CSV to stdout")
    sql.add_argument("--max-rows", type=int, default=40)
    sql.set_defaults(func=cmd_sql)
    board = sub.add_parser("leaderboard", help="methods side by side: mean ± 95%% interval over seeds")
    board.add_argument("benchmark", nargs="*", help="default: every benchmark with results")
    board.add_argument("--metrics", default="acc_avg,acc_wg", metavar="M,...")
    board.add_argument("--splits", default="test", metavar="SPLIT,...")
    board.add_argument("--format", choices=("text", "markdown"), default="text")
    board.set_defaults(func=cmd_leaderboard)
    analyse = sub.add_parser("analyse", help="the papers' analyses over the results (tables + plots)")
    analyse.add_argument("analysis", nargs="*", help="default: all (metashift-accuracy-vs-distance, ...)")
    analyse.set_defaults(func=cmd_analyse)
    versions = sub.add_parser("versions", help="list published versions")
    versions.add_argument("benchmark", nargs="?")
    versions.set_defaults(func=cmd_versions)
    check = sub.add_parser("check", help="re-check the latest versions against their contracts")
    check.add_argument("benchmark", nargs="*")
    check.set_defaults(func=cmd_check)
    catalog = sub.add_parser("catalog", help="recreate the catalog views")
    catalog.set_defaults(func=cmd_catalog)
    gc = sub.add_parser("gc", help="delete old versions")
    gc.add_argument("--keep", type=int, default=1)
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(func=cmd_gc)
    train = sub.add_parser(
        "train", help="train ERM baselines on published splits and publish their results (several: a sweep)"
    )
    train.add_argument("benchmarks", nargs="+", metavar="benchmark")
    train.add_argument("--model", help="resnet18, resnet50, small_cnn or mlp (default: the preset's)")
    train.add_argument("--seed", type=int, help="the seed, 0..9 (default: 0)")
    train.add_argument("--seeds", help="a sweep over seeds: 0,1,2 or 0-2")
    train.add_argument("--parallel", type=int, help="runs at a time in a sweep (default: one per core; 4 on a GPU)")
    train.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    train.add_argument("--preset", help="a preset of shiftbench/specs/erm.yaml (default: the family's)")
    train.add_argument("--version", help="split version (default: latest)")
    train.add_argument("--image-root", help="image root (default: the split's); 'standin' renders stand-ins")
    train.add_argument("--path-template", help="image path under the root; {} is the example id")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a training parameter")
    train.add_argument("--in-process", action="store_true", help="train in this process, not a Pipes subprocess")
    train.set_defaults(func=cmd_train)
    export = sub.add_parser("export", help="export a split for other trainers: ImageFolder, WILDS, DomainBed, HF")
    export.add_argument("benchmark")
    export.add_argument("dir", type=Path)
    export.add_argument("--layout", choices=("imagefolder", "wilds", "domainbed", "hf"), default="imagefolder")
    export.add_argument(
        "--environment", metavar="FIELD[,FIELD]", help="domainbed: the fields whose values are the environments (group)"
    )
    export.add_argument("--version", help="split version (default: latest)")
    export.add_argument("--image-root", help="image root (default: the split's); 'standin' renders stand-ins")
    export.add_argument("--path-template", help="image path under the root; {} is the example id")
    export.set_defaults(func=cmd_export)
    scored = sub.add_parser("eval", help="score a predictions file on a published split and publish the results")
    scored.add_argument("benchmark")
    scored.add_argument("predictions", type=Path, help="Parquet/CSV: example_id, y_pred[, p_0 ... p_K-1]")
    scored.add_argument("--method", required=True, help="the method's name (results view: method)")
    scored.add_argument("--seed", type=int, default=0)
    scored.add_argument("--version", help="split version (default: latest)")
    scored.add_argument("--group-by", metavar="FIELD,...", help="worst-group over these metadata fields")
    scored.set_defaults(func=cmd_eval)
    generate = sub.add_parser("generate", help="write a benchmark spec chosen from the data (e.g. by distance)")
    generators = generate.add_subparsers(dest="generator", required=True, parser_class=OneLineParser)
    dg = generators.add_parser(
        "metashift-dg", help="a MetaShift domain-generalization task whose training subsets have increasing distance"
    )
    dg.add_argument("--classes", required=True, metavar="A,B", help="the two classes; B's training varies")
    dg.add_argument("--test", required=True, metavar="B(context)", help="B's test subset, e.g. 'dog(shelf)'")
    dg.add_argument("--n", type=int, default=4, help="number of variants (default 4)")
    dg.add_argument("--quantiles", metavar="Q,...", help="distance quantiles of the variants (default: evenly spaced)")
    dg.add_argument("--name", help="the task's name (default A-B-CONTEXT-dg)")
    dg.add_argument("--train-size", type=int, default=400, help="training images, split over the classes")
    dg.add_argument("--context-kinds", metavar="K,...", help="object,general (default) or attribute")
    dg.add_argument("--out", type=Path, help="write the spec file here (default: stdout)")
    dg.set_defaults(func=cmd_generate_metashift_dg)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help (0), or a bad command line, said in one line (OneLineParser): 2
            return exc.code if isinstance(exc.code, int) else 2
        code: int = args.func(args)
    except BrokenPipeError:  # `shiftbench ... | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ContractViolation, StoreError) as exc:  # failed contracts, a damaged store: not the input's fault
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ShiftbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
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
            raise  # a bug: its traceback is what a report needs
        print(
            f"error: the disk holding {home} is full ({free_bytes(home) >> 10:,} KiB free): the command stopped; "
            "a version is published whole or not at all (`shiftbench versions` lists them); free space and rerun",
            file=sys.stderr,
        )
        return 1
    return code


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


if __name__ == "__main__":
    entry()
