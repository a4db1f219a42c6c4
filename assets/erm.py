"""ERM baselines in the lineage: one multi-asset per trainable kind of benchmark, under its split.

``erm/staged_<family>_<kind>_baseline`` trains (the lean job ``python -m shiftbench.erm.job``
launched through Dagster Pipes: a local subprocess here, a GPU pod with ``PipesK8sClient``), stages
the results as a version of the run and runs the blocking ``erm_*`` contract checks;
``erm/<family>_<kind>_baseline`` publishes it (the store refuses a version whose checks failed).
Partitions are (benchmark, seed), the benchmark dimension being the split asset's own partitions,
so the UI shows each result under the split it was trained on, a republished split marks its
results stale, and the automation retrains the baselines that were trained on it.

A family whose images are not configured (BREEDS without ``SHIFTBENCH_IMAGENET_DIR``) gets no ERM
asset: partitions that can never run are not offered. Runs share the ``gpu`` pool, so a backfill
never puts two trainings on one device. This module imports no torch (only the job does).
"""

import json
import sys
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from shiftbench.assets.automation import publish, retrain
from shiftbench.assets.factory import partitions_of
from shiftbench.assets.metadata import contract_check_specs, contract_evaluations, published_metadata, render
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.config.settings import Settings
from shiftbench.erm import backends, launch, pods, sweep
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.interrupt import EXIT_REQUEUE, Stopped
from shiftbench.erm.slurm_settings import load_cluster_settings
from shiftbench.errors import InputError
from shiftbench.families.family import Family, Figure, FilePath, Kind, Markdown
from shiftbench.families.plans import override_value
from shiftbench.scoring import worst_group
from shiftbench.scoring.provenance import MEANINGS, data_tag, images_of
from shiftbench.store import Store
from shiftbench.warehouse import cards, publishing

# erm_training_conflicts: only a run with track_conflicts has it (its check holds no rules on the others).
TABLES = ("erm_results", "erm_runs", "erm_curves", "erm_training_conflicts")
SEEDS = [str(seed) for seed in sweep.SEEDS]  # one seed range: the sweep plans over the same
JOB_COMMAND = [sys.executable, "-m", "shiftbench.erm.job"]
# Seconds a stopped run's job is given to finish its step and write its checkpoint before it is left behind.
STOP_GRACE_S = 300
# A run tag: "exit" makes a stop on SIGTERM or SIGUSR1 end the run with its exit code instead of a retry (the
# command `shiftbench train` sets it: the person or scheduler that sent the signal decides what comes next).
STOP_TAG = "shiftbench/on_stop"
# Training parameters that may be null: launchpad text, as on the command line ("null" clears).
NULLABLE = tuple(f.name for f in fields(TrainConfig) if "None" in str(f.type))
# The materialization tag (and first metadata entry) that says whose images a run is on: real | generated | standin
# (shiftbench.scoring.provenance), so a stand-in partition never reads as a real one in the UI.
IMAGES_TAG = "shiftbench/images"


def _config_field(kind: str) -> Any:
    if kind.startswith("tuple"):
        return (list[float] if "float" in kind else list[int]) | None
    return {"int": int, "float": float, "bool": bool}.get(kind, str) | None


def _baseline_config() -> type[dg.Config]:
    values: dict[str, Any] = {
        "preset": (str | None, Field(None, description="A preset of shiftbench/specs/erm.yaml (default: family's).")),
        "version": (str | None, Field(None, description="Split version to train on (default: latest).")),
        "image_root": (
            str | None,
            Field(None, description="Image root (default: the split's, as its manifest records); 'standin' renders"),
        ),
        "path_template": (str | None, Field(None, description="Image path under the root, '{}' = example_id.")),
        "in_process": (bool, Field(False, description="Train in the Dagster process instead of a Pipes subprocess.")),
        "restart": (
            bool,
            Field(False, description="Discard the checkpoint an interrupted attempt left and start over."),
        ),
        "backend": (
            str | None,
            Field(None, description="Where the run trains: local or slurm (default: SHIFTBENCH_TRAIN_BACKEND)."),
        ),
        "k8s_image": (
            str | None,
            Field(None, description="With PipesK8sClient: the pod's image (over SHIFTBENCH_K8S_POD)."),
        ),
        "k8s_namespace": (
            str | None,
            Field(None, description="With PipesK8sClient: the namespace (over SHIFTBENCH_K8S_POD)."),
        ),
    }
    for item in fields(TrainConfig):
        if item.name == "seed":  # the partition's
            continue
        kind = "str" if item.name in NULLABLE else str(item.type)
        values[item.name] = (_config_field(kind), Field(None, description=f"training parameter {item.name}"))
    for name, (iterations, kind) in launch.EPOCH_PARAMETERS.items():  # converted by launch.resolve_config
        described = f"training parameter {name}: {iterations} in epochs of the training split"
        values[name] = (_config_field(kind), Field(None, description=described))
    return create_model("BaselineConfig", __base__=dg.Config, **values)  # type: ignore[no-any-return, call-overload]


BaselineConfig: Any = _baseline_config()
RUN_FIELDS = (
    "preset", "version", "image_root", "path_template", "in_process", "restart", "backend", "k8s_image",
    "k8s_namespace",
)  # fmt: skip
BACKENDS = ("local", "slurm")


def training_overrides(config: Any) -> dict[str, Any]:
    """The training parameters a run's config sets (nullable ones parsed from YAML text)."""
    overrides = {}
    for item in fields(TrainConfig):
        value = getattr(config, item.name, None)
        if value is not None:
            overrides[item.name] = override_value(item.name, value) if item.name in NULLABLE else value
    for name in launch.EPOCH_PARAMETERS:
        if getattr(config, name, None) is not None:
            overrides[name] = getattr(config, name)
    return overrides


def _launch(context: dg.AssetExecutionContext, client: Any, job: dict[str, Any], config: Any) -> None:
    """Run the job through whichever Pipes client the deployment bound (subprocess or Kubernetes).

    In a pod the job sees the warehouse and the images only where ``SHIFTBENCH_K8S_POD`` mounts them:
    its paths are rewritten to in-pod paths, and one under no mounted root is refused before submitting.
    """
    if _is_k8s_client(client):
        settings: Settings = context.resources.settings.get()
        pod = pods.load_pod_settings(settings.k8s_pod).with_overrides(
            image=config.k8s_image, namespace=config.k8s_namespace
        )
        client.run(context=context, **pod.run_kwargs(job))
        launch.record_execution(job["out_dir"], {"backend": "kubernetes", "namespace": pod.namespace})
        return
    client.run(command=JOB_COMMAND, context=context, extras={"job": job})


def _is_k8s_client(client: Any) -> bool:
    """Whether ``client`` is dagster-k8s's ``PipesK8sClient`` (or a subclass). dagster-k8s is optional:
    if it was never imported, no such client can exist, so the subprocess path never imports it."""
    module = sys.modules.get("dagster_k8s")
    k8s_client = getattr(module, "PipesK8sClient", None)
    return isinstance(k8s_client, type) and isinstance(client, k8s_client)


def baseline_keys(kind: Kind) -> tuple[dg.AssetKey, dg.AssetKey]:
    name = f"{kind.family}_{kind.name}_baseline"
    return dg.AssetKey(["erm", f"staged_{name}"]), dg.AssetKey(["erm", name])


def baseline_job_name(kind: Kind) -> str:
    return f"erm_{kind.qualified}"


def _baseline_specs(family: Family, kind: Kind) -> list[dg.AssetSpec]:
    """The staged results (under the published split, one partition per benchmark and seed) and their publication."""
    staged_key, publish_key = baseline_keys(kind)
    split = dg.AssetDep(
        dg.AssetKey(list(kind.publish_key)),
        partition_mapping=dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="benchmark"),
    )
    return [
        dg.AssetSpec(
            staged_key,
            deps=[split],
            group_name="erm",
            code_version=launch.CODE_VERSION,
            kinds={"pytorch", "parquet"},
            automation_condition=retrain(),
            skippable=True,
            description=f"Train an ERM baseline on the latest published {family.title} {kind.name} (one "
            "partition per benchmark and seed), evaluate it the WILDS way and stage erm_results, erm_runs "
            "and erm_curves (and erm_training_conflicts with track_conflicts); blocking contract checks.",
        ),
        dg.AssetSpec(
            publish_key,
            deps=[staged_key],
            group_name="erm",
            kinds={"duckdb", "parquet"},
            automation_condition=publish(),
            skippable=True,
            description="Publishes the staged results once their contracts passed (the store refuses others).",
        ),
    ]


def baseline_assets(family: Family, kind: Kind) -> tuple[dg.AssetsDefinition, Any]:
    staged_key, publish_key = baseline_keys(kind)
    partitions = dg.MultiPartitionsDefinition(
        {"benchmark": partitions_of(kind), "seed": dg.StaticPartitionsDefinition(SEEDS)}
    )

    @dg.multi_asset(
        name=kind.baseline_op,
        specs=_baseline_specs(family, kind),
        check_specs=contract_check_specs(staged_key, TABLES, partitions),
        partitions_def=partitions,
        can_subset=True,
        pool="gpu",
    )
    def _train(
        context: dg.AssetExecutionContext,
        config: BaselineConfig,  # type: ignore[valid-type]
        settings: ShiftbenchSettings,
        erm_pipes_client: dg.ResourceParam[dg.PipesClient],
    ) -> Iterator[Any]:
        yield from _run_baseline(context, kind, config, settings.get(), erm_pipes_client)

    job = dg.define_asset_job(
        baseline_job_name(kind),
        selection=dg.AssetSelection.assets(staged_key, publish_key),
        description=f"Train, check and publish one ERM baseline on a {family.title} {kind.name} per "
        "(benchmark, seed) partition; backfill to sweep.",
    )
    return _train, job


def _run_baseline(
    context: dg.AssetExecutionContext, kind: Kind, config: Any, settings: Settings, client: Any
) -> Iterator[Any]:
    """Train and stage (or find the staged results a publish-only run names), then publish if selected."""
    staged_key, publish_key = baseline_keys(kind)
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    store = Store(settings.store_dir)
    if staged_key in context.selected_asset_keys:
        if not _configured(config):  # a retrain (the automation, a click): the last run's settings
            config = _reused_config(context, staged_key, config)
        plan = _plan(settings, keys, config)
        staged, results = _train_and_stage(context, settings, plan, config, client)
        yield _staged_result(staged_key, plan, staged, results, config)
        publishing.require_passing(staged, results)
    elif _configured(config):  # publish-only for a run the config names
        plan = _plan(settings, keys, config)
        latest = store.layout.latest_staged(launch.FAMILY, plan.run)
        if latest is None:
            raise InputError(f"{plan.run} has no staged results: train it first", parameter="benchmark")
        staged = latest
    else:  # publish-only (the automation, a click in the UI): exactly what the staged asset recorded
        staged = _recorded_staged(context, staged_key, store)
    if publish_key in context.selected_asset_keys:
        publication = publishing.publish_staged(settings, staged)
        described = _describe(settings, staged)
        yield dg.MaterializeResult(
            asset_key=publish_key,
            metadata={"images": described["images"], **published_metadata(settings, staged, publication), **described},
            data_version=dg.DataVersion(staged.version),
            tags={IMAGES_TAG: str(described["images"]).split(":", 1)[0]},  # the label before its meaning
        )


def _staged_result(
    staged_key: dg.AssetKey, plan: launch.RunPlan, staged: Any, results: Any, config: Any
) -> dg.MaterializeResult:
    """Typed results (MaterializeResult, AssetCheckResult): a Pipes session asks for them, and a run of one
    partition needs nothing else."""
    images = images_of(plan.images.kind, data_tag(plan.benchmark))
    return dg.MaterializeResult(
        asset_key=staged_key,
        metadata={
            "images": _images_text(images),
            "run": plan.run,
            "version": staged.version,
            "split_version": plan.split_version,
            "launch": dg.MetadataValue.json(_launch_config(config)),
        },
        data_version=dg.DataVersion(staged.version),
        tags={IMAGES_TAG: images},
        check_results=[
            dg.AssetCheckResult(
                asset_key=staged_key,
                check_name=e.check_name,
                passed=e.passed,
                severity=e.severity,
                metadata=e.metadata,
                description=e.description,
            )
            for e in contract_evaluations(staged_key, None, TABLES, results)
        ],
    )


def _plan(settings: Settings, keys: dict[str, str], config: Any) -> launch.RunPlan:
    return launch.plan_run(
        settings,
        keys["benchmark"],
        version=config.version,
        seed=int(keys["seed"]),
        preset=config.preset,
        overrides=training_overrides(config),
        image_root=config.image_root,
        path_template=config.path_template,
    )


def _configured(config: Any) -> bool:
    """Whether a run's config names a run (a preset, a split version, training parameters)."""
    return config.preset is not None or config.version is not None or bool(training_overrides(config))


def _last_recorded(context: dg.AssetExecutionContext, staged_key: dg.AssetKey) -> dict[str, Any]:
    """The metadata of the staged asset's last materialization of this partition ({} if none)."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=staged_key, asset_partitions=[context.partition_key]), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    return dict(materialization.metadata) if materialization is not None else {}


def _launch_config(config: Any) -> dict[str, Any]:
    """What a retrain reuses: the config that was set, except the split version (a retrain takes the latest) and
    ``restart`` (a retrain resumes what an interrupted attempt left, as any run does)."""
    return {
        k: v
        for k, v in config.model_dump().items()
        if v is not None and v is not False and k not in {"version", "restart"}
    }


def _reused_config(context: dg.AssetExecutionContext, staged_key: dg.AssetKey, config: Any) -> Any:
    recorded = _last_recorded(context, staged_key).get("launch")
    if recorded is None:
        return config
    context.log.info(f"retraining with the settings of the last run: {recorded.value}")
    return type(config)(**recorded.value)


def _recorded_staged(context: dg.AssetExecutionContext, staged_key: dg.AssetKey, store: Store) -> Any:
    """The results version the staged asset last recorded for this partition (run name and version)."""
    metadata = _last_recorded(context, staged_key)
    run, version = metadata.get("run"), metadata.get("version")
    if run is None or version is None:
        raise InputError(f"{context.partition_key}: no staged results recorded: train it first", parameter="benchmark")
    return store.layout.staged(launch.FAMILY, str(run.value), str(version.value))


def _train_and_stage(
    context: dg.AssetExecutionContext, settings: Settings, plan: launch.RunPlan, config: Any, client: Any
) -> tuple[Any, Any]:
    # The run's folder is the same for every attempt: an interrupted attempt's checkpoint is resumed from (a retry
    # never restarts, whatever the first attempt was asked).
    out_dir = launch.scratch_dir(settings, plan, restart=config.restart and context.retry_number == 0)
    try:
        _train(context, settings, plan, config, client, out_dir)
    except Stopped as stopped:
        _retry_if_requeued(context, settings, stopped)
        raise
    staged, results, _summary = launch.stage_run(settings, plan, out_dir)
    launch.discard_scratch(out_dir)  # the results are in the store: the outputs (and any checkpoint) go
    return staged, results


def _retry_if_requeued(context: dg.AssetExecutionContext, settings: Settings, stopped: Stopped) -> None:
    """A training stopped by SIGTERM or SIGUSR1 (a pod deleted or evicted, a preemption) checkpointed and asks to
    run again: Dagster's retry runs the step again (on Kubernetes, a new pod), and the job resumes."""
    if stopped.exit_code != EXIT_REQUEUE or context.retry_number >= settings.train_retries:
        return
    if context.run.tags.get(STOP_TAG) == "exit":
        return
    attempt = context.retry_number + 2
    context.log.warning(
        f"{stopped.line()}: retrying (attempt {attempt} of at most {settings.train_retries + 1}, "
        "SHIFTBENCH_TRAIN_RETRIES); the retry resumes from the checkpoint"
    )
    raise dg.RetryRequested(max_retries=settings.train_retries) from None


def _train(
    context: dg.AssetExecutionContext, settings: Settings, plan: launch.RunPlan, config: Any, client: Any, out_dir: Any
) -> None:
    """Run the job where the settings say: in this process, as a Slurm job, or through the bound Pipes client."""
    job = {**plan.job(out_dir), "launch": context.run.run_id}  # retries of one run count its stalled attempts
    context.log.info(f"{plan.run}: {plan.benchmark} version {plan.split_version}, images {plan.images.kind}")
    if config.in_process:
        from shiftbench.erm.job import run_job  # torch, in this process: only when asked for

        run_job(job, log=context.log.info)
    elif _backend(settings, config) == "slurm":  # a Slurm job; its log lines in this run's event log
        cluster = load_cluster_settings(settings.slurm_settings)
        backends.train_one(settings, cluster, plan, out_dir, log=context.log.info)
    else:
        try:
            _launch(context, client, job, config)
        except Exception:  # DagsterPipesExecutionError is not exported by dagster 1.13
            message = launch.job_error(out_dir)
            if message:  # a bad input the job named: show it, not Dagster's wrapper
                raise InputError(message) from None
            stopped = launch.job_interrupted(out_dir)
            if stopped is not None:  # stopped on a signal after checkpointing: its one line
                raise Stopped.from_dict(stopped) from None
            killed = launch.job_killed(str(sys.exc_info()[1]))
            if killed is not None:  # SIGKILL (out of memory, by hand): its one line, the folder kept
                raise killed from None
            raise


def _backend(settings: Settings, config: Any) -> str:
    """The run's ``backend`` (run configuration: ``shiftbench train --backend`` sets it), else the setting."""
    backend = getattr(config, "backend", None) or settings.train_backend
    if backend not in BACKENDS:
        raise InputError(f"must be one of {', '.join(BACKENDS)}, got {backend!r}", parameter="backend")
    return str(backend)


def _describe(settings: Settings, staged: Any) -> dict[str, Any]:
    import polars as pl

    results = pl.read_parquet(staged.table_path("erm_results"))
    runs = pl.read_parquet(staged.table_path("erm_runs")).row(0, named=True)
    files = staged.path / "files"
    manifest = staged.manifest()
    images = images_of(runs["image_source"], data_tag(runs["benchmark"]))
    grouping = json.loads(runs["config"]).get("group_by") or "group"
    grouping = "the split's own groups" if grouping == "group" else f"the groups by {grouping}"
    metadata: dict[str, Any] = {
        "images": _images_text(images),
        "run": staged.benchmark,
        "split": runs["benchmark"],
        "split_version": runs["split_version"],
        "selection_split": launch.selection_label(runs["selection_split"]),
        "best_iteration": runs["best_iteration"],
        "device": runs["device"],
        "image_source": runs["image_source"],
        "grouping": f"acc_wg over {grouping}",
        "train_images_per_s": float(manifest.get("training", {}).get("train_images_per_s") or 0.0),
        **{key: float(value) for key, value in launch.headline(results).items() if value is not None},
        **worst_group.metadata(results),
        "learning_curve": Figure((files / "learning_curve.png").read_bytes(), "learning curve"),
        "id_vs_ood": Figure((files / "id_vs_ood.png").read_bytes(), "ID vs OOD"),
        "weights": FilePath(files / "model.pt"),
    }
    heatmap = files / launch.CONFLICTS_FIGURE
    if heatmap.is_file():  # track_conflicts: the paper's Figure 4 for this run
        metadata["training_conflicts"] = Figure(heatmap.read_bytes(), "training conflicts")
    card = staged.attachment("card.md")
    if card is not None:
        metadata = {"images": metadata["images"], "card": Markdown(cards.without_images(card.decode())), **metadata}
    return render(metadata, settings)


def _images_text(images: str) -> str:
    """The ``images`` metadata entry: the label, then what it means (``standin: generated stand-in images ...``)."""
    return f"{images}: {MEANINGS[images]}"


def trainable_kinds(family: Family, settings: Settings) -> list[Kind]:
    """The kinds of ``family`` an ERM baseline can train on with these settings (none if no images)."""
    if family.training_unavailable(settings) is not None:
        return []
    return [kind for kind in family.kinds if kind.trainable]
