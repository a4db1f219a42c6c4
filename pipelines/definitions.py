"""The Dagster code location: assets, checks, jobs, schedules and automation of shiftbench.

- ``breeds_inputs``: the unpartitioned inputs (ImageNet hierarchy and images, calibrated hierarchy).
- ``breeds_benchmarks``: one run per benchmark partition (stage -> blocking contract checks -> publish).
- ``observe_sources``: observes the raw files and specs (schedule at 02:50); the automation
  sensor (running by default) then rebuilds at 03:00 only what a changed data version or code
  version reaches, and never publishes past a failed blocking check.
"""

import warnings

import dagster as dg

# observable_source_asset and Output(data_version=) are "beta" in 1.13 but are the documented
# way to get data versions; their warnings would bury every log line.
warnings.filterwarnings("ignore", message=r".*is currently in beta.*")

from assets import breeds  # noqa: E402
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
observe_sources_job = dg.define_asset_job(
    "observe_sources",
    selection=dg.AssetSelection.assets(*[source.key for source in breeds.raw_sources[:-1]]),
    description="Observe the raw source files so that changed inputs show as new data versions.",
)
observe_specs_job = dg.define_asset_job(
    "observe_specs",
    selection=dg.AssetSelection.assets(breeds.breeds_specs.key),
    description="Observe the benchmark specs (one data version per benchmark).",
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


automation_sensor = dg.AutomationConditionSensorDefinition(
    "shiftbench_automation",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
)

defs = dg.Definitions(
    assets=[*breeds.raw_sources, *breeds.input_assets, *breeds.benchmark_assets],
    jobs=[breeds_inputs_job, breeds_benchmarks_job, observe_sources_job, observe_specs_job],
    schedules=[observe_sources_schedule, observe_specs_schedule],
    sensors=[automation_sensor],
    resources={"settings": ShiftbenchSettings()},
    # One process per run: steps are short and a subprocess per step costs seconds each.
    executor=dg.in_process_executor,
)
