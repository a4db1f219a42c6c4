"""``shiftbench train``: one ERM run through the kind's ERM job (the partition the UI would run), or a sweep.

Several benchmarks, ``--seeds`` or ``--parallel`` make a sweep (:mod:`shiftbench.pipelines.cli.sweep`): each run is then
``shiftbench train B --seed S`` in a process of its own.
"""

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, StoreError
from shiftbench.pipelines.cli.common import Subcommands, dagster_instance


def add_train(sub: Subcommands) -> None:
    train = sub.add_parser(
        "train", help="train ERM baselines on published splits and publish their results (several: a sweep)"
    )
    train.add_argument("benchmarks", nargs="+", metavar="benchmark")
    train.add_argument("--model", help="resnet18, resnet50, small_cnn or mlp (default: the preset's)")
    train.add_argument("--seed", type=int, help="the seed, 0..9 (default: 0)")
    train.add_argument("--seeds", help="a sweep over seeds: 0,1,2 or 0-2")
    train.add_argument(
        "--search", type=int, metavar="N", help="a random hyperparameter search of N draws (docs/erm.md)"
    )
    train.add_argument("--trials", type=int, metavar="K", help="with --search: K trials of every draw, seeds 0..K-1")
    train.add_argument(
        "--search-space",
        default="auto",
        help="with --search: a space of shiftbench/specs/search.yaml (default: by model)",
    )
    train.add_argument(
        "--select",
        metavar="M,...",
        help="with --search: the selection methods reported (default: all the split allows)",
    )
    train.add_argument("--parallel", type=int, help="runs at a time in a sweep (default: one per core; 4 on a GPU)")
    train.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    train.add_argument("--preset", help="a preset of shiftbench/specs/erm.yaml (default: the family's)")
    train.add_argument("--version", help="split version (default: latest)")
    train.add_argument("--image-root", help="image root (default: the split's); 'standin' renders stand-ins")
    train.add_argument("--path-template", help="image path under the root; {} is the example id")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a training parameter")
    train.add_argument("--in-process", action="store_true", help="train in this process, not a Pipes subprocess")
    train.add_argument(
        "--restart",
        action="store_true",
        help="discard the checkpoint an interrupted attempt of the run left and start over (default: resume from it)",
    )
    train.add_argument(
        "--backend", choices=("local", "slurm"), help="where runs train (default: SHIFTBENCH_TRAIN_BACKEND, local)"
    )
    train.add_argument("--slurm-settings", type=Path, help="the Slurm jobs' settings, a YAML file (docs/clusters.md)")
    train.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """One ERM run through the kind's ERM job: the partition (benchmark, seed) the UI would run; several: a sweep.

    The stop signals are held from the start, before any library starts threads of its own: every way of training
    then answers a stop sent to the command, its process group or the job the same way (the job checkpoints; exit
    130 for SIGINT, 75 for SIGTERM, SIGUSR1 and SIGHUP; docs/erm.md)."""
    from shiftbench.erm.stops import held_stops

    with held_stops():
        return _cmd_train(args)


def _cmd_train(args: argparse.Namespace) -> int:
    from shiftbench.families.plans import training_overrides
    from shiftbench.pipelines.cli.slurm_sweep import chosen_backend, cmd_slurm_sweep
    from shiftbench.pipelines.cli.sweep import cmd_sweep, wants_sweep

    settings = Settings.from_env()
    overrides = training_overrides(args.set or [], model=args.model, device=args.device)
    if chosen_backend(args, settings) == "slurm":  # one run or a sweep: one job array
        typed_training(overrides)
        return cmd_slurm_sweep(args, overrides)
    if wants_sweep(args):
        typed_training(overrides)  # every value checked before any run is planned
        return cmd_sweep(args, overrides)
    if args.in_process:  # the job unblocks the held signals in this process (shiftbench.erm.interrupt)
        return _train_one(args, settings, overrides, None)
    from shiftbench.erm.stops import forwarded_stops

    with forwarded_stops() as forwarder:  # a stop sent to the command reaches the job as what it was
        return _train_one(args, settings, overrides, forwarder)


def _train_one(args: argparse.Namespace, settings: Settings, overrides: dict[str, Any], forwarder: Any) -> int:
    """One run: planned (a bad input is one line before anything trains), then trained through Dagster's ERM job or,
    for a family without one here, in this process."""
    from shiftbench.erm.launch import plan_run
    from shiftbench.erm.sweep import training_seed
    from shiftbench.families import registry
    from shiftbench.families.plans import trainable_kind

    args.benchmark = args.benchmarks[0]
    kind = trainable_kind(settings, args.benchmark)
    args.seed = training_seed(args.seed)
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
        return _train_outside_dagster(settings, plan, unavailable, started, restart=args.restart)
    return _train_in_dagster(settings, args, kind, plan, overrides, started, forwarder)


def _train_in_dagster(
    settings: Settings, args: argparse.Namespace, kind: Any, plan: Any, overrides: dict[str, Any], started: float,
    forwarder: Any,
) -> int:  # fmt: skip
    """The run of the kind's ERM job for the partition (benchmark, seed), and its lines."""
    import dagster as dg

    from shiftbench.assets.erm import RUN_FIELDS, STOP_TAG, baseline_job_name, baseline_keys
    from shiftbench.erm.launch import job_interrupted, scratch_dir
    from shiftbench.pipelines import runs
    from shiftbench.pipelines.terminal import Reporter

    config: dict[str, Any] = {key: getattr(args, key) for key in RUN_FIELDS if getattr(args, key, None)}
    config["preset"] = plan.preset  # the run planned above, never the last run's settings
    config.update(typed_training(overrides))
    instance = dagster_instance(settings)
    known = set(instance.get_dynamic_partitions(kind.qualified))
    if args.benchmark not in known:
        instance.add_dynamic_partitions(kind.qualified, [args.benchmark])
    key = dg.MultiPartitionKey({"benchmark": args.benchmark, "seed": str(args.seed)})
    _, publish_key = baseline_keys(kind)
    out_dir = scratch_dir(settings, plan)
    # A stop is the job's to answer (it checkpoints): held back from this process and Dagster's helpers and sent on
    # to the job as the signal it was; the command's exit code is the job's (130 for SIGINT, 75 for the others), a
    # stop is never retried inside the command (STOP_TAG).
    if forwarder is not None:
        forwarder.out_dir = out_dir
    with runs.dagster_keeps_sigterm(), Reporter().listening():
        run = runs.run_job(
            instance,
            baseline_job_name(kind),
            partition_key=key,
            config={"ops": {kind.baseline_op: {"config": config}}},
            tags={STOP_TAG: "exit"},
        )
    stopped = job_interrupted(out_dir) if not run.is_success else None
    if stopped is not None:
        print(f"[train] {stopped['line']}", file=sys.stderr, flush=True)
        return int(stopped["exit_code"])
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


def typed_training(overrides: dict[str, Any]) -> dict[str, Any]:
    """``--set`` values as the typed launchpad config of the ERM asset (nullable ones as YAML text)."""
    from dataclasses import fields

    from shiftbench.assets.erm import NULLABLE
    from shiftbench.config.located_yaml import format_value
    from shiftbench.erm.config import TrainConfig, coerce_value
    from shiftbench.erm.launch import EPOCH_PARAMETERS, epoch_counts, user_schedule

    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    user_schedule(overrides, overrides)  # a schedule in epochs and in iterations at once is refused
    typed: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in EPOCH_PARAMETERS:  # converted by the launcher, for the split it plans on
            counts = epoch_counts(key, value)
            typed[key] = list(counts) if EPOCH_PARAMETERS[key][1].startswith("tuple") else counts[0]
            continue
        if key not in types or key == "seed":
            TrainConfig.from_mapping({key: value})  # names the unknown parameter
            raise InputError("set the seed with --seed (seeds are partitions)", parameter="seed")
        if key in NULLABLE:
            typed[key] = format_value(value)
            continue
        coerced = coerce_value(value, types[key], key)
        typed[key] = list(coerced) if isinstance(coerced, tuple) else coerced
    TrainConfig.from_mapping({k: v for k, v in overrides.items() if k not in EPOCH_PARAMETERS})  # every value, now
    return typed


def _train_outside_dagster(settings: Settings, plan: Any, reason: str, started: float, *, restart: bool) -> int:
    import polars as pl

    from shiftbench.erm.interrupt import Stopped
    from shiftbench.erm.launch import headline, scratch_dir, train_in_process
    from shiftbench.scoring import worst_group

    print(f"[train] not a Dagster run ({reason}); training in this process", flush=True)
    out_dir = scratch_dir(settings, plan, restart=restart)
    try:
        outcome, summary = train_in_process(settings, plan, out_dir)
    except Stopped as stopped:  # on a signal, after its checkpoint (or at once, on a second Ctrl-C)
        print(f"[train] {stopped.line()}", file=sys.stderr, flush=True)
        return stopped.exit_code
    results = pl.read_parquet(outcome.staged.table_path("erm_results"))
    meta = {
        "run": plan.run,
        "version": outcome.staged.version,
        "became_latest": outcome.publication.changed_latest,
        "selection_split": summary["selection_split"],
        "best_iteration": summary["best_iteration"],
        "device": summary["device"],
        "train_images_per_s": summary["train_images_per_s"] or 0.0,
        "path": str(outcome.staged.path),
        **headline(results),
        **worst_group.metadata(results),
    }
    _print_training(meta, time.monotonic() - started)
    return 0


def _print_training(meta: dict[str, Any], seconds: float) -> None:
    from shiftbench.erm.launch import selection_label
    from shiftbench.scoring.worst_group import METADATA_PREFIX as WORST_GROUP_NOTE

    became = "now latest" if meta["became_latest"] else "already latest"
    print(f"[train] {meta['run']} version {meta['version']} ({became}, {seconds:.1f}s)")
    print(
        f"  selection on {selection_label(meta['selection_split'])}, "
        f"best iteration {meta['best_iteration']}, "
        f"{meta['device']}, {float(meta['train_images_per_s']):,.0f} training images/s"
    )
    for key, value in meta.items():
        if "/acc_" in key and value is not None:
            note = meta.get(f"{WORST_GROUP_NOTE}{key.split('/')[0]}") if key.endswith("/acc_wg") else None
            print(f"  {key:<28} {float(value):.4f}{f' ({note})' if note else ''}")
    from shiftbench.pipelines.cli.common import shiftbench_command

    print(f"\nResults: {shiftbench_command()} sql \"SELECT * FROM erm_results WHERE run = '{meta['run']}'\"")
    heatmap = Path(str(meta.get("path", ""))) / "files" / "training_conflicts.png"
    if meta.get("path") and heatmap.is_file():  # track_conflicts (MetaShift §4.3)
        print(
            f'Training conflicts: heatmap {heatmap}\n  strongest: {shiftbench_command()} sql "SELECT training_subset, '
            "evaluation_subset, evaluation_domain, round(normalized_coefficient, 2) AS normalized FROM "
            f"erm_training_conflicts WHERE run = '{meta['run']}' ORDER BY normalized_coefficient LIMIT 10\""
        )
