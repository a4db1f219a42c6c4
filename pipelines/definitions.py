"""The Dagster code location: assets, checks, jobs, schedules and automation of shiftbench.

- ``breeds_inputs``: the unpartitioned inputs (ImageNet hierarchy and images, calibrated hierarchy).
- ``breeds_benchmarks``: one run per benchmark partition (stage -> blocking contract checks -> publish).
- ``metashift_inputs``, ``metashift_collections``, ``metashift_tasks``: the same for MetaShift
  (parsed annotations; one run per collection or task partition).
- ``conds_inputs``, ``conds_cases``: ConDS attribute tables (one run per dataset partition) and
  cases (one run per case partition: stage -> checks of the case's definition -> publish).
- ``erm_baselines``: one ERM training per (benchmark, seed) partition, the job launched through
  Dagster Pipes (a local subprocess here; a GPU pod with PipesK8sClient).
- ``observe_sources``: observes the raw files and specs (schedule at 02:50); the automation
  sensor (running by default) then rebuilds at 03:00 only what a changed data version or code
  version reaches, and never publishes past a failed blocking check.
"""

import warnings
from typing import Any

import dagster as dg

# observable_source_asset and Output(data_version=) are "beta" in 1.13 but are the documented
# way to get data versions; their warnings would bury every log line.
warnings.filterwarnings("ignore", message=r".*is currently in beta.*")

from assets import breeds, conds, erm, metashift  # noqa: E402
from pipelines.resources import ShiftbenchSettings  # noqa: E402

breeds_inputs_job = dg.define_asset_job(
    "breeds_inputs",
    selection=dg.AssetSelection.assets(*breeds.input_assets),
    description="Build the shared BREEDS inputs: WordNet/ImageNet hierarchy, image list, calibrated hierarchy.",
)
breeds_benchmarks_job = dg.define_asset_job(
    "breeds_benchmarks",
    selection=dg.AssetSelection.assets(*breeds.benchmark_assets),
    description="Build, check and publish one BREEDS benchmark per partition (backfill all partitions to build all).",
)
metashift_inputs_job = dg.define_asset_job(
    "metashift_inputs",
    selection=dg.AssetSelection.assets(*metashift.input_assets),
    description="Parse the MetaShift annotations (GQA scene graphs, tag table or generated sample).",
)
metashift_collections_job = dg.define_asset_job(
    "metashift_collections",
    selection=dg.AssetSelection.assets(*metashift.collection_assets),
    description="Build, check and publish one MetaShift subset collection per partition.",
)
metashift_tasks_job = dg.define_asset_job(
    "metashift_tasks",
    selection=dg.AssetSelection.assets(*metashift.task_assets),
    description="Build, check and publish one MetaShift shift task per partition.",
)
conds_inputs_job = dg.define_asset_job(
    "conds_inputs",
    selection=dg.AssetSelection.assets(*conds.input_assets),
    description="Read one ConDS dataset's attribute table per partition (CelebA, generated sprites, user tables).",
)
conds_cases_job = dg.define_asset_job(
    "conds_cases",
    selection=dg.AssetSelection.assets(*conds.case_assets),
    description="Build, check and publish one ConDS case per partition.",
)
erm_baselines_job = dg.define_asset_job(
    "erm_baselines",
    selection=dg.AssetSelection.assets(*erm.erm_assets),
    description="Train, evaluate and publish one ERM baseline per (benchmark, seed) partition; backfill to sweep.",
)
observe_conds_attribute_sources_job = dg.define_asset_job(
    "observe_conds_attribute_sources",
    selection=dg.AssetSelection.assets(conds.conds_attribute_sources.key),
    description="Observe the ConDS attribute sources (one data version per dataset).",
)
observe_conds_case_specs_job = dg.define_asset_job(
    "observe_conds_case_specs",
    selection=dg.AssetSelection.assets(conds.conds_case_specs.key),
    description="Observe the ConDS case specs (one data version per case).",
)
observe_sources_job = dg.define_asset_job(
    "observe_sources",
    selection=dg.AssetSelection.assets(
        *[source.key for source in breeds.raw_sources[:-1]], metashift.metashift_annotations.key
    ),
    description="Observe the raw source files so that changed inputs show as new data versions.",
)
observe_specs_job = dg.define_asset_job(
    "observe_specs",
    selection=dg.AssetSelection.assets(breeds.breeds_specs.key),
    description="Observe the benchmark specs (one data version per benchmark).",
)
observe_metashift_collection_specs_job = dg.define_asset_job(
    "observe_metashift_collection_specs",
    selection=dg.AssetSelection.assets(metashift.metashift_collection_specs.key),
    description="Observe the MetaShift collection specs (one data version per collection).",
)
observe_metashift_task_specs_job = dg.define_asset_job(
    "observe_metashift_task_specs",
    selection=dg.AssetSelection.assets(metashift.metashift_task_specs.key),
    description="Observe the MetaShift task specs (one data version per task).",
)

observe_sources_schedule = dg.ScheduleDefinition(
    name="observe_sources_nightly",
    job=observe_sources_job,
    cron_schedule="50 2 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)


@dg.schedule(
    name="observe_specs_nightly",
    job=observe_specs_job,
    cron_schedule="50 2 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def observe_specs_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    # Observation of a partitioned source returns every partition's version in one run.
    first = breeds.BREEDS_PARTITIONS.get_partition_keys()[0]
    return dg.RunRequest(run_key=None, partition_key=first)


def _observe_partitioned(job: Any, partitions: dg.StaticPartitionsDefinition) -> dg.ScheduleDefinition:
    """A nightly observation of a partitioned source: one run reports every partition's version."""

    @dg.schedule(
        name=f"{job.name}_nightly", job=job, cron_schedule="50 2 * * *", default_status=dg.DefaultScheduleStatus.RUNNING
    )
    def _schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(run_key=None, partition_key=partitions.get_partition_keys()[0])

    return _schedule


automation_sensor = dg.AutomationConditionSensorDefinition(
    "shiftbench_automation",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
)

defs = dg.Definitions(
    assets=[
        *breeds.raw_sources,
        *breeds.input_assets,
        *breeds.benchmark_assets,
        *metashift.raw_sources,
        *metashift.input_assets,
        *metashift.collection_assets,
        *metashift.task_assets,
        *conds.raw_sources,
        *conds.input_assets,
        *conds.case_assets,
        *erm.erm_assets,
    ],
    jobs=[
        breeds_inputs_job,
        breeds_benchmarks_job,
        metashift_inputs_job,
        metashift_collections_job,
        metashift_tasks_job,
        observe_sources_job,
        observe_specs_job,
        observe_metashift_collection_specs_job,
        observe_metashift_task_specs_job,
        conds_inputs_job,
        conds_cases_job,
        observe_conds_attribute_sources_job,
        observe_conds_case_specs_job,
        erm_baselines_job,
    ],
    schedules=[
        observe_sources_schedule,
        observe_specs_schedule,
        _observe_partitioned(observe_metashift_collection_specs_job, metashift.COLLECTION_PARTITIONS),
        _observe_partitioned(observe_metashift_task_specs_job, metashift.TASK_PARTITIONS),
        _observe_partitioned(observe_conds_attribute_sources_job, conds.DATASET_PARTITIONS),
        _observe_partitioned(observe_conds_case_specs_job, conds.CASE_PARTITIONS),
    ],
    sensors=[automation_sensor],
    resources={
        "settings": ShiftbenchSettings(),
        # The training job as a local subprocess; bind dagster_k8s.PipesK8sClient here for GPU pods.
        "erm_pipes_client": dg.PipesSubprocessClient(forward_termination=True),
    },
    # One process per run: steps are short and a subprocess per step costs seconds each.
    executor=dg.in_process_executor,
)
