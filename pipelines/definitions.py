"""The Dagster code location: every family of the registry through one asset factory.

- ``<family>_inputs``: a family's shared inputs (hierarchies, scene tables, attribute tables).
- ``<family>_<kinds>`` (``breeds_benchmarks``, ``metashift_collections``, ``metashift_tasks``,
  ``conds_cases``): stage -> blocking contract checks -> publish, one run for any number of
  partitions (single-run backfill policy).
- ``<family>_<kinds>_fanout`` (``metashift_collections_fanout``): one benchmark built in units run side by side
  (buckets of classes), on the multiprocess executor (or dagster-k8s' executor): the version one piece gives.
- ``erm_<family>_<kinds>``: one ERM baseline per (benchmark, seed), under its split in the lineage,
  the job launched through Dagster Pipes; only for families whose images are configured.
- ``analysis/<name>``: the papers' analyses (MetaShift accuracy vs distance and Tables 2-3, BREEDS source vs target
  and Figures 5-6, ConDS accuracy by shift), rebuilt whenever a split or baseline they read publishes; job ``analyses``
  (what ``shiftbench analyse`` runs).
- ``observe_sources``: observe the raw source files now (the automation does it nightly).
- ``erm_search``: a random hyperparameter search (its draws x trials planned and requested); the sensor
  ``erm_search_runs`` asks for its runs of the ERM jobs (pipelines/search.py).
- Sensors: ``shiftbench_partitions`` (benchmark partitions = buildable specs and named variants;
  observes spec changes) and ``shiftbench_automation`` (the declarative automation conditions of
  ``assets/automation.py``), both running by default.

Importing this module imports no torch: the training job runs in its own process. A bad ``SHIFTBENCH_*`` value
changes nothing here (:func:`graph_settings`); the runs that read the settings fail with its message.
"""

import os
import warnings
from typing import Any

import dagster as dg

# multi_observable_source_asset, Output(data_version=) and partitioned check specs are "beta"/"preview"
# in 1.13 but are the documented way to get data versions; their warnings would bury every log line.
warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")

from shiftbench.assets.analysis import analyses_job, analysis_assets  # noqa: E402
from shiftbench.assets.erm import STOP_GRACE_S, baseline_assets, trainable_kinds  # noqa: E402
from shiftbench.assets.factory import family_assets  # noqa: E402
from shiftbench.assets.fanout import fanout_job  # noqa: E402
from shiftbench.assets.resources import settings_from_environment  # noqa: E402
from shiftbench.config.settings import ENV_PREFIX, Settings  # noqa: E402
from shiftbench.errors import InputError  # noqa: E402
from shiftbench.families import registry  # noqa: E402
from shiftbench.pipelines.search import search_job, search_sensor  # noqa: E402
from shiftbench.pipelines.sensors import partitions_sensor  # noqa: E402


def graph_settings() -> Settings:
    """The settings the asset graph is decided from (which families train here, the fan-out executor): those of
    the environment with every value that does not parse left out (a shared setting then takes its default).

    A bad value must never change the graph (it once removed every ERM asset): the location offers the graph it
    would offer without that value, and every run that reads the settings (each one, through the ``settings``
    resource) fails with the value's one-line message. A bad value is not an unset one: a family's images are
    configured when their variable is set, and a path always parses, so a bad value elsewhere leaves them so.
    """
    values: dict[str, Any] = {
        key.removeprefix(ENV_PREFIX).lower(): value
        for key, value in os.environ.items()
        if key.startswith(ENV_PREFIX) and value.strip()
    }
    left_out: set[str] = set()
    while True:
        try:
            return Settings.parse(values)
        except InputError as exc:
            name = (exc.parameter or "").removeprefix(ENV_PREFIX).lower()
            if name in left_out or name not in values:  # not a value of the environment: nothing to leave out
                raise
            left_out.add(name)
            if name in Settings.model_fields:  # its default, over the environment (which pydantic reads too)
                values[name] = Settings.model_fields[name].default
            else:
                del values[name]


def build_definitions() -> dg.Definitions:
    """The code location for the current environment (which settings are bound, which ERM assets exist).

    ``dagster dev`` loads it once as ``defs``; the CLI builds it afresh for each run (25 ms), so a run
    always sees the environment it was started in.
    """
    registered = registry.families()  # the registry's families, asked now: one registered later is in the next
    families = {name: family_assets(family) for name, family in registered.items()}
    settings = graph_settings()
    trained = [kind for family in registered.values() for kind in trainable_kinds(family, settings)]
    erm = [baseline_assets(registry.family(kind.family), kind) for kind in trained]
    observe_sources_job = dg.define_asset_job(
        "observe_sources",
        selection=dg.AssetSelection.assets(*[s.key for f in families.values() for s in f.raw_sources]),
        description="Observe the raw source files now, so that changed inputs show as new data versions.",
    )
    automation_sensor = dg.AutomationConditionSensorDefinition(
        "shiftbench_automation",
        target=dg.AssetSelection.all(include_sources=True),  # the raw sources are observed by it
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
    )
    return dg.Definitions(
        assets=[
            *[asset for family in families.values() for asset in family.assets],
            *[asset for asset, _ in erm],
            *analysis_assets(trained),
        ],
        jobs=[
            *[job for family in families.values() for job in family.jobs],
            *[
                job
                for family in registered.values()
                for kind in family.kinds
                if (job := fanout_job(family, kind, settings)) is not None
            ],
            *[job for _, job in erm],
            analyses_job(),
            observe_sources_job,
            *([search_job] if erm else []),
        ],
        sensors=[partitions_sensor, automation_sensor, *([search_sensor([job for _, job in erm])] if erm else [])],
        resources={
            "settings": settings_from_environment(),
            # The training job as a local subprocess; bind dagster_k8s.PipesK8sClient here for GPU pods. A stopped
            # run is sent SIGINT and given time to finish its step and write its checkpoint (shiftbench.erm.interrupt).
            "erm_pipes_client": dg.PipesSubprocessClient(
                forward_termination=True, termination_timeout_seconds=STOP_GRACE_S
            ),
        },
        # One process per run: steps are short and a subprocess per step costs seconds each.
        executor=dg.in_process_executor,
    )


defs = build_definitions()
