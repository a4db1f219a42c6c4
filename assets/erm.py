"""ERM baselines: one asset partitioned by (benchmark, seed), so a sweep is a backfill.

The asset plans the run (:mod:`shiftbench.erm.launch`: split version, preset, image root), then
launches the lean training job ``python -m shiftbench.erm.job`` through Dagster Pipes: locally
with ``PipesSubprocessClient``; on a cluster the same job runs in a GPU pod through
``PipesK8sClient`` (dagster-k8s) bound to the same resource key (README "ERM on GPU nodes").
The job's log lines stream into the run's event log; its outputs are checked against the
``erm_*`` contracts and published as a version of the run, with the plots as metadata.
Runs share the ``gpu`` concurrency pool, so a backfill never puts two trainings on one device.
"""

import shutil
import sys
from typing import Any

import dagster as dg
import polars as pl
from pydantic import Field

from assets.metadata import contract_check_result, contract_check_specs
from pipelines.resources import ShiftbenchSettings
from shiftbench.breeds.specs import load_specs as breeds_specs
from shiftbench.conds.specs import load_specs as conds_specs
from shiftbench.erm import launch
from shiftbench.errors import InputError
from shiftbench.metashift.specs import load_specs as metashift_specs
from shiftbench.plots import png_markdown

TABLES = ("erm_results", "erm_runs", "erm_curves")
BENCHMARKS = sorted(breeds_specs()) + sorted(metashift_specs().tasks) + list(conds_specs().cases)
SEEDS = [str(seed) for seed in range(10)]
PARTITIONS = dg.MultiPartitionsDefinition(
    {"benchmark": dg.StaticPartitionsDefinition(BENCHMARKS), "seed": dg.StaticPartitionsDefinition(SEEDS)}
)
JOB_COMMAND = [sys.executable, "-m", "shiftbench.erm.job"]


class BaselineConfig(dg.Config):
    """What to train; every field is optional (the family's preset and the latest split version)."""

    preset: str | None = Field(default=None, description="A preset of shiftbench/specs/erm.yaml (default: family's).")
    version: str | None = Field(default=None, description="Split version to train on (default: latest).")
    image_root: str | None = Field(
        default=None, description="Image root (default: the source's, e.g. SHIFTBENCH_IMAGENET_DIR); 'standin' renders"
    )
    path_template: str | None = Field(default=None, description="Image path under the root, '{}' = example_id.")
    overrides: dict[str, str] = Field(
        default_factory=dict, description="Training parameters as YAML scalars (model: resnet50, device: cuda, ...)."
    )
    in_process: bool = Field(default=False, description="Train in the Dagster process instead of a Pipes subprocess.")
    k8s_image: str | None = Field(default=None, description="With PipesK8sClient: the GPU image to run the job in.")
    k8s_namespace: str | None = Field(default=None, description="With PipesK8sClient: the namespace.")

    def parsed_overrides(self) -> dict[str, Any]:
        from shiftbench.breeds.specs import parse_override_value

        return {key: parse_override_value(value) for key, value in self.overrides.items()}


def _launch(context: dg.AssetExecutionContext, client: Any, job: dict[str, Any], config: BaselineConfig) -> None:
    """Run the job through whichever Pipes client the deployment bound (subprocess or Kubernetes)."""
    if type(client).__name__ == "PipesK8sClient":  # dagster-k8s is optional: no import here
        if not config.k8s_image:
            raise InputError("PipesK8sClient needs the GPU image to run", parameter="k8s_image")
        client.run(
            context=context,
            image=config.k8s_image,
            command=["python", "-m", "shiftbench.erm.job"],
            namespace=config.k8s_namespace,
            extras={"job": job},
            base_pod_spec={
                "containers": [{"name": "dagster-pipes-execution", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
            },
        )
        return
    client.run(command=JOB_COMMAND, context=context, extras={"job": job})


@dg.asset(
    key=["erm", "baseline"],
    partitions_def=PARTITIONS,
    group_name="erm",
    kinds={"pytorch", "parquet"},
    pool="gpu",
    code_version=launch.CODE_VERSION,
    check_specs=contract_check_specs(["erm", "baseline"], TABLES),
    description="Train an ERM baseline on the latest published split of a benchmark (one partition per "
    "benchmark and seed), evaluate it the WILDS way and publish erm_results, erm_runs and erm_curves.",
)
def baseline(
    context: dg.AssetExecutionContext,
    config: BaselineConfig,
    settings: ShiftbenchSettings,
    erm_pipes_client: dg.ResourceParam[dg.PipesClient],
) -> dg.MaterializeResult:
    keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
    resolved = settings.get()
    plan = launch.plan_run(
        resolved,
        keys["benchmark"],
        version=config.version,
        seed=int(keys["seed"]),
        preset=config.preset,
        overrides=config.parsed_overrides(),
        image_root=config.image_root,
        path_template=config.path_template,
    )
    out_dir = launch.scratch_dir(resolved, plan, context.run.run_id)
    job = plan.job(out_dir)
    context.log.info(f"{plan.run}: {plan.benchmark} version {plan.split_version}, images {plan.images.kind}")
    if config.in_process:
        from shiftbench.erm.job import run_job

        run_job(job, log=context.log.info)
    else:
        try:
            _launch(context, erm_pipes_client, job, config)
        except Exception:  # DagsterPipesExecutionError is not exported by dagster 1.13
            message = launch.job_error(out_dir)
            if message:  # a bad input the job named: show it, not Dagster's wrapper
                raise InputError(message) from None
            raise
    outcome, summary = launch.publish_run(resolved, plan, out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    staged = outcome.staged
    results = pl.read_parquet(staged.table_path("erm_results"))
    files = staged.path / "files"
    return dg.MaterializeResult(
        data_version=dg.DataVersion(staged.version),
        metadata={
            "run": plan.run,
            "version": staged.version,
            "became_latest": outcome.publication.changed_latest,
            "benchmark": plan.benchmark,
            "split_version": plan.split_version,
            "selection_split": str(summary["selection_split"]),
            "best_iteration": summary["best_iteration"],
            "device": summary["device"],
            "image_source": plan.images.kind,
            "train_images_per_s": float(summary["train_images_per_s"] or 0.0),
            **{key: float(value) for key, value in launch.headline(results).items() if value is not None},
            "dagster/row_count": results.height,
            "learning_curve": dg.MetadataValue.md(
                png_markdown((files / "learning_curve.png").read_bytes(), "learning curve")
            ),
            "id_vs_ood": dg.MetadataValue.md(png_markdown((files / "id_vs_ood.png").read_bytes(), "ID vs OOD")),
            "weights": dg.MetadataValue.path(str(files / "model.pt")),
            "path": dg.MetadataValue.path(str(staged.path)),
        },
        check_results=[contract_check_result(table, outcome.results[table]) for table in TABLES],
    )


erm_assets = [baseline]
