"""The ``shiftbench`` command: the same Dagster jobs the UI runs, from a terminal.

    shiftbench build [breeds|metashift|conds] [--benchmark NAME ...] [--set KEY=VALUE ...] [--name NEW]
    shiftbench sql "SELECT ..." [--csv]
    shiftbench versions [BENCHMARK]
    shiftbench check [BENCHMARK ...]      re-check published versions against their contracts
    shiftbench catalog                    recreate the DuckDB views
    shiftbench gc [--keep N] [--dry-run]  delete all but the N most recent versions
    shiftbench train BENCHMARK [--model M] [--seed N] [--device D] [--preset P] [--set KEY=VALUE ...]
    shiftbench export BENCHMARK --layout imagefolder DIR

Runs go to the Dagster instance in ``$DAGSTER_HOME`` (default ``$SHIFTBENCH_HOME/dagster_home``),
so they show in ``dagster dev`` started with the same DAGSTER_HOME.
"""

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shiftbench.errors import ShiftbenchError
from shiftbench.settings import Settings

FAMILIES = ("breeds", "metashift", "conds")
# Warnings and errors only on the terminal; the full event log is in the instance (UI).
_QUIET: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
_DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"


def ensure_dagster_home(settings: Settings) -> Path:
    """A persistent instance with telemetry off (this machine is offline; users may be too)."""
    home = Path(os.environ.get("DAGSTER_HOME") or settings.home / "dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(_DAGSTER_YAML, encoding="utf-8")
    os.environ["DAGSTER_HOME"] = str(home.absolute())
    return home


def _run_error(result: Any) -> str:
    """The innermost error of a failed run: the user's message, not Dagster's wrapper."""
    for event in result.all_events:
        if not event.is_step_failure or event.event_specific_data is None:
            continue
        error = event.event_specific_data.error
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            message = error.message.strip().removeprefix(f"shiftbench.errors.{error.cls_name}: ")
            return message if error.cls_name.endswith("InputError") else f"{error.cls_name}: {message}"
    return "run failed"


def _parse_sets(items: Sequence[str]) -> dict[str, Any]:
    from shiftbench.breeds.specs import parse_override_value
    from shiftbench.errors import InputError

    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {item!r}", parameter="--set")
        overrides[key.strip()] = parse_override_value(value.strip())
    return overrides


def _failed_checks(result: Any) -> list[str]:
    lines = []
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            detail = evaluation.metadata.get("results")
            lines.append(f"  check {evaluation.check_name} failed")
            if detail is not None:
                for row in str(detail.value).splitlines():
                    if "**NO**" in row:
                        lines.append(f"    {row.strip('| ').replace(' | ', ': ', 1)}")
    return lines


def _breeds_plan(
    names: list[str] | None, overrides: dict[str, Any], publish_as: str | None
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(benchmark, job, staging op, op config) for each BREEDS benchmark to build."""
    from shiftbench.breeds.specs import load_specs
    from shiftbench.errors import InputError

    specs = load_specs()
    unknown = [n for n in names or [] if n not in specs]
    if unknown:
        raise InputError(
            f"unknown benchmark {unknown[0]!r}; known: {', '.join(sorted(specs))}", parameter="--benchmark"
        )
    selected = names or sorted(specs)
    for name in selected:  # validate every override before anything runs
        specs[name].with_overrides(overrides)
    config: dict[str, Any] = {k: ("none" if k == "ancestor" and v is None else v) for k, v in overrides.items()}
    if publish_as:
        config["publish_as"] = publish_as
    return [(name, "breeds_benchmarks", "breeds__staged_benchmark", config) for name in selected]


def _metashift_plan(
    names: list[str] | None, overrides: dict[str, Any], publish_as: str | None
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Collections first, then tasks; each gets the overrides it knows (a key no one knows is an error)."""
    from dataclasses import fields

    from shiftbench.errors import InputError
    from shiftbench.metashift.specs import TASK_PARAMS, CollectionSpec, load_specs

    specs = load_specs()
    known = specs.names()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise InputError(f"unknown benchmark {unknown[0]!r}; known: {', '.join(known)}", parameter="--benchmark")
    selected = names or [*sorted(specs.collections), *sorted(specs.tasks)]
    collection_keys = {f.name for f in fields(CollectionSpec)} - {"name"}
    plan = []
    used: set[str] = set()
    for name in sorted(selected, key=lambda n: (n in specs.tasks, n)):
        is_task = name in specs.tasks
        accepted = set(TASK_PARAMS) if is_task else collection_keys
        mine = {k: v for k, v in overrides.items() if k in accepted}
        used |= set(mine)
        spec = specs.tasks[name] if is_task else specs.collections[name]
        spec.with_overrides(mine)
        config: dict[str, Any] = {"overrides": {k: yaml_text(v) for k, v in mine.items()}}
        if publish_as:
            config["publish_as"] = publish_as
        job, op = (
            ("metashift_tasks", "metashift__staged_task")
            if is_task
            else ("metashift_collections", "metashift__staged_collection")
        )
        plan.append((name, job, op, config))
    stray = sorted(set(overrides) - used)
    if stray:
        raise InputError("not a parameter of any selected benchmark", parameter=stray[0])
    return plan


def _conds_plan(
    names: list[str] | None, overrides: dict[str, Any], publish_as: str | None
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """ConDS cases; by default every case of every dataset whose source is configured."""
    from shiftbench.conds.specs import load_specs
    from shiftbench.errors import InputError

    specs = load_specs()
    unknown = [n for n in names or [] if n not in specs.cases]
    if unknown:
        shown = ", ".join(list(specs.cases)[:6])
        raise InputError(
            f"unknown benchmark {unknown[0]!r}; known: {shown}, ... ({len(specs.cases)} cases: see "
            "'shiftbench build conds --list')",
            parameter="--benchmark",
        )
    settings = Settings.from_env()
    available = [d for d, spec in specs.datasets.items() if spec.source != "celeba" or settings.celeba_dir]
    selected = names or [c for c, case in specs.cases.items() if case.dataset in available]
    config: dict[str, Any] = {"overrides": {k: yaml_text(v) for k, v in overrides.items()}}
    if publish_as:
        config["publish_as"] = publish_as
    for name in selected:  # validate every override before anything runs
        specs.cases[name].with_overrides(overrides)
    return [(name, "conds_cases", "conds__staged_case", config) for name in selected]


def yaml_text(value: Any) -> str:
    """An override value back as the YAML scalar text the Dagster config carries."""
    import yaml

    return str(yaml.safe_dump(value, default_flow_style=True)).strip().removesuffix("...").strip()


_INPUTS = {
    "breeds": ("breeds_inputs", "hierarchy, image list and calibrated hierarchy"),
    "metashift": ("metashift_inputs", "scene tables"),
    "conds": ("conds_inputs", "attribute tables"),
}


def _inputs_summary(family: str, result: Any) -> str:
    if family == "breeds":
        return f"hierarchy: {result.output_for_node('breeds__calibrated_hierarchy').meta['kind']}"
    if family == "conds":
        meta = result.output_for_node("conds__attribute_tables").meta
        return f"{meta['dataset']}: {meta['n_examples']} examples ({meta['source']})"
    meta = result.output_for_node("metashift__scene_tables").meta
    return f"annotations: {meta['dataset']}, {meta['n_images']} images, {meta['n_objects']} objects"


def _benchmark_names(family: str) -> list[str]:
    if family == "breeds":
        from shiftbench.breeds.specs import load_specs as breeds_specs

        return sorted(breeds_specs())
    if family == "metashift":
        from shiftbench.metashift.specs import load_specs as metashift_specs

        return metashift_specs().names()
    from shiftbench.conds.specs import load_specs as conds_specs

    return conds_specs().names()


def cmd_build(args: argparse.Namespace) -> int:
    from shiftbench.errors import InputError

    if args.list:
        print("\n".join(_benchmark_names(args.family)))
        return 0
    settings = Settings.from_env()
    ensure_dagster_home(settings)
    overrides = _parse_sets(args.set or [])
    if args.name and (not args.benchmark or len(args.benchmark) != 1):
        raise InputError("--name needs exactly one --benchmark", parameter="--name")
    planner = {"breeds": _breeds_plan, "metashift": _metashift_plan, "conds": _conds_plan}[args.family]
    plan = planner(args.benchmark, overrides, args.name)

    import dagster as dg

    from pipelines.definitions import defs

    instance = dg.DagsterInstance.get()
    started = time.monotonic()
    inputs_job, what = _INPUTS[args.family]
    # Partitioned inputs (ConDS: one attribute table per dataset) run once per partition needed.
    partitions: list[str | None] = [None]
    if args.family == "conds":
        from shiftbench.conds.specs import load_specs as load_conds_specs

        cases = load_conds_specs().cases
        partitions = list(dict.fromkeys(cases[name].dataset for name, *_ in plan))
    for partition in partitions:
        label = f" ({partition})" if partition else ""
        print(f"[inputs] building {what}{label} ...", flush=True)
        inputs = defs.resolve_job_def(inputs_job).execute_in_process(
            instance=instance, run_config=_QUIET, raise_on_error=False, partition_key=partition
        )
        if not inputs.success:
            print(f"error: {_run_error(inputs)}", file=sys.stderr)
            print("nothing was published; previous versions are unchanged", file=sys.stderr)
            return 2
        summary = _inputs_summary(args.family, inputs)
        print(f"[inputs] done in {time.monotonic() - started:.1f}s ({summary})", flush=True)

    failed = 0
    for index, (name, job_name, op, config) in enumerate(plan, start=1):
        t0 = time.monotonic()
        run_config = {**_QUIET, "ops": {op: {"config": config}}}
        result = defs.resolve_job_def(job_name).execute_in_process(
            instance=instance, partition_key=name, run_config=run_config, raise_on_error=False
        )
        prefix = f"[{index}/{len(plan)}] {name}"
        if result.success:
            publish_node = op.replace("staged_", "")
            meta = result.asset_materializations_for_node(publish_node)[0].metadata
            became = "now latest" if meta["became_latest"].value else "already latest"
            extra = (
                f", d={meta['distance'].value:.3f}" if "distance" in meta and meta["distance"].value != "NULL" else ""
            )
            print(
                f"{prefix}: {meta['benchmark'].value} version {meta['version'].value} ({became}, "
                f"{meta['dagster/row_count'].value} examples{extra}, {time.monotonic() - t0:.1f}s)",
                flush=True,
            )
            warnings = str(meta["warnings"].value) if "warnings" in meta else "none"
            for line in warnings.splitlines() if warnings != "none" else []:
                print(f"  warning: {line.removeprefix('- ').replace('**', '')}", flush=True)
            continue
        failed += 1
        lines = _failed_checks(result) or [f"  error: {_run_error(result)}"]
        print(f"{prefix}: FAILED, nothing published (run {result.run_id})", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr)
    print(f"\nStore:   {settings.store_dir}\nCatalog: {settings.catalog_path}")
    return 1 if failed else 0


def cmd_train(args: argparse.Namespace) -> int:
    """One ERM run through the ``erm_baselines`` job: the partition (benchmark, seed) the UI would run."""
    from shiftbench.errors import InputError

    settings = Settings.from_env()
    ensure_dagster_home(settings)
    overrides = _parse_sets(args.set or [])
    for key in ("model", "device"):
        if getattr(args, key):
            overrides[key] = getattr(args, key)
    import dagster as dg

    from assets.erm import BENCHMARKS, SEEDS
    from pipelines.definitions import defs

    if args.benchmark not in BENCHMARKS:
        raise InputError(
            f"{args.benchmark!r} is not a benchmark of the shipped or configured specs "
            "(the erm_baselines partitions); `shiftbench build --list` shows them",
            parameter="BENCHMARK",
        )
    if str(args.seed) not in SEEDS:
        raise InputError(f"seeds are partitions {SEEDS[0]}..{SEEDS[-1]}", parameter="--seed")
    from shiftbench.erm.launch import plan_run

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
    config: dict[str, Any] = {
        "overrides": {key: str(value) for key, value in overrides.items()},
        "in_process": args.in_process,
    }
    for key in ("preset", "version", "image_root", "path_template"):
        if getattr(args, key):
            config[key] = getattr(args, key)
    started = time.monotonic()
    result = defs.resolve_job_def("erm_baselines").execute_in_process(
        instance=dg.DagsterInstance.get(),
        partition_key=dg.MultiPartitionKey({"benchmark": args.benchmark, "seed": str(args.seed)}),
        run_config={**_QUIET, "ops": {"erm__baseline": {"config": config}}},
        raise_on_error=False,
    )
    if not result.success:
        print(f"error: {_run_error(result)}", file=sys.stderr)
        print("nothing was published; previous versions are unchanged", file=sys.stderr)
        return 1
    meta = result.asset_materializations_for_node("erm__baseline")[0].metadata
    became = "now latest" if meta["became_latest"].value else "already latest"
    print(f"[train] {meta['run'].value} version {meta['version'].value} ({became}, {time.monotonic() - started:.1f}s)")
    print(
        f"  selection on {meta['selection_split'].value}, best iteration {meta['best_iteration'].value}, "
        f"{meta['device'].value}, {meta['train_images_per_s'].value:,.0f} training images/s"
    )
    for key, value in meta.items():
        if "/acc_" in key:
            print(f"  {key:<28} {value.value:.4f}")
    print(f"\nResults: shiftbench sql \"SELECT * FROM erm_results WHERE run = '{meta['run'].value}'\"")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from shiftbench.erm.export import export_imagefolder
    from shiftbench.erm.launch import published_split, resolve_images

    settings = Settings.from_env()
    split = published_split(settings, args.benchmark, args.version)
    images = resolve_images(settings, split, args.image_root, args.path_template)
    counts = export_imagefolder(split, images, args.dir)
    total = sum(counts.values())
    detail = ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))
    print(f"{args.dir}: {total:,} links to {images.kind} images of {split.benchmark} {split.version} ({detail})")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import duckdb

    from shiftbench.catalog import refresh_catalog

    settings = Settings.from_env()
    if not settings.catalog_path.exists():
        refresh_catalog(settings.catalog_path, settings.store_dir)
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        try:
            relation = con.sql(args.query)
        except duckdb.Error as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if relation is None:
            return 0
        if args.csv:
            sys.stdout.write(relation.pl().write_csv())
        else:
            relation.show(max_rows=args.max_rows, max_width=200)
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    from shiftbench.store import Store

    settings = Settings.from_env()
    versions = Store(settings.store_dir).versions(args.benchmark)
    if not versions:
        print("no published versions" + (f" of {args.benchmark}" if args.benchmark else ""))
        return 1 if args.benchmark else 0
    print(f"{'benchmark':<24} {'version':<17} {'first published':<33} {'latest':<6} examples  hierarchy")
    for info in versions:
        print(
            f"{info.benchmark:<24} {info.version:<17} {info.published_at:<33} "
            f"{'*' if info.is_latest else '':<6} {info.n_examples!s:>8}  {info.params.get('hierarchy', '')}"
        )
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from shiftbench.contracts import failures
    from shiftbench.publishing import check_staged
    from shiftbench.store import Store

    settings = Settings.from_env()
    store = Store(settings.store_dir)
    latest = [v for v in store.versions() if v.is_latest and (not args.benchmark or v.benchmark in args.benchmark)]
    bad = 0
    for info in latest:
        results = check_staged(store.staged(info.family, info.benchmark, info.version))
        failed = failures(results)
        total = sum(len(r) for r in results.values())
        print(f"{info.benchmark} {info.version}: {total - len(failed)}/{total} rules hold")
        for rule in failed:
            print(f"  {rule.table}.{rule.rule}: observed {rule.observed}, expected {rule.expected}")
        bad += bool(failed)
    return 1 if bad else 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from shiftbench.catalog import refresh_catalog

    settings = Settings.from_env()
    ok = refresh_catalog(settings.catalog_path, settings.store_dir)
    print(f"{settings.catalog_path}: {'views refreshed' if ok else 'locked, not refreshed'}")
    return 0 if ok else 1


def cmd_gc(args: argparse.Namespace) -> int:
    from shiftbench.catalog import refresh_catalog
    from shiftbench.store import Store

    settings = Settings.from_env()
    removed = Store(settings.store_dir).garbage_collect(keep=args.keep, dry_run=args.dry_run)
    for path in removed:
        print(("would remove " if args.dry_run else "removed ") + str(path))
    if not args.dry_run:
        refresh_catalog(settings.catalog_path, settings.store_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shiftbench", description="Distribution-shift benchmark splits.")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build, check and publish benchmarks (same jobs as the UI)")
    build.add_argument("family", nargs="?", choices=FAMILIES, default="breeds")
    build.add_argument("--benchmark", action="append", metavar="NAME", help="repeatable; default: all")
    build.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec parameter")
    build.add_argument("--name", metavar="NEW", help="publish as a new benchmark NEW")
    build.add_argument("--list", action="store_true", help="list the family's benchmark names and exit")
    build.set_defaults(func=cmd_build)
    sql = sub.add_parser("sql", help="run SQL against the catalog")
    sql.add_argument("query")
    sql.add_argument("--csv", action="store_true", help="write CSV to stdout")
    sql.add_argument("--max-rows", type=int, default=40)
    sql.set_defaults(func=cmd_sql)
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
    train = sub.add_parser("train", help="train an ERM baseline on a published split and publish its results")
    train.add_argument("benchmark")
    train.add_argument("--model", help="resnet18, resnet50, small_cnn or mlp (default: the preset's)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    train.add_argument("--preset", help="a preset of shiftbench/specs/erm.yaml (default: the family's)")
    train.add_argument("--version", help="split version (default: latest)")
    train.add_argument("--image-root", help="image root (default: the source's); 'standin' renders stand-ins")
    train.add_argument("--path-template", help="image path under the root; {} is the example id")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a training parameter")
    train.add_argument("--in-process", action="store_true", help="train in this process, not a Pipes subprocess")
    train.set_defaults(func=cmd_train)
    export = sub.add_parser("export", help="export a split as folders of symlinks for other trainers")
    export.add_argument("benchmark")
    export.add_argument("dir", type=Path)
    export.add_argument("--layout", choices=("imagefolder",), default="imagefolder")
    export.add_argument("--version", help="split version (default: latest)")
    export.add_argument("--image-root", help="image root (default: the source's); 'standin' renders stand-ins")
    export.add_argument("--path-template", help="image path under the root; {} is the example id")
    export.set_defaults(func=cmd_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ShiftbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
