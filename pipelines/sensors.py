"""The partition sensor: benchmark partitions equal the benchmarks that can be built here.

Every tick it reads the spec files (shipped and ``SHIFTBENCH_*_SPECS``) and the named variants,
adds a dynamic partition for each new benchmark, removes those whose spec is gone or whose source
is not configured (CelebA's cases without ``SHIFTBENCH_CELEBA_DIR``), and observes each spec's
definition: a changed spec gets a new data version on ``raw/<family>_<kind>_specs``, which the
automation turns into a rebuild of exactly that benchmark. So a spec added to a user's file
appears without reloading the code location, and nothing that cannot run is ever requested.
"""

import json
from typing import Any

import dagster as dg

from shiftbench.assets.factory import spec_fingerprints, spec_source_key
from shiftbench.assets.metadata import data_version_tags
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.config.settings import Settings
from shiftbench.errors import ShiftbenchError
from shiftbench.families import registry
from shiftbench.families.family import Kind

SYNC_INTERVAL_S = 30


def partition_changes(
    settings: Settings, instance: dg.DagsterInstance, kind: Kind
) -> tuple[list[str], list[str], dict[str, str]]:
    """(names to add, names to delete, fingerprints now) for one kind's partitions."""
    wanted = spec_fingerprints(settings, kind)
    current = set(instance.get_dynamic_partitions(kind.qualified))
    added = [name for name in wanted if name not in current]
    removed = sorted(current - set(wanted))
    return added, removed, wanted


def sync_requests(
    settings: Settings, instance: dg.DagsterInstance, cursor: dict[str, dict[str, str]]
) -> tuple[list[Any], list[dg.AssetObservation], dict[str, dict[str, str]]]:
    """Partition requests and spec observations that bring Dagster in line with the spec files."""
    requests: list[Any] = []
    observations: list[dg.AssetObservation] = []
    new_cursor: dict[str, dict[str, str]] = {}
    registry.spec_kinds(settings)  # a name two families define: the tick says which, nothing changes
    for kind in registry.kinds():
        seen = cursor.get(kind.qualified, {})
        added, removed, wanted = partition_changes(settings, instance, kind)
        partitions = dg.DynamicPartitionsDefinition(name=kind.qualified)
        if added:
            requests.append(partitions.build_add_request(added))
        if removed:
            requests.append(partitions.build_delete_request(removed))
        for name, fingerprint in wanted.items():
            if seen.get(name) != fingerprint:
                observations.append(
                    dg.AssetObservation(spec_source_key(kind), partition=name, tags=data_version_tags(fingerprint))
                )
        new_cursor[kind.qualified] = wanted
    return requests, observations, new_cursor


@dg.sensor(
    name="shiftbench_partitions",
    minimum_interval_seconds=SYNC_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps benchmark partitions equal to the specs and named variants that can be built here, and "
    "observes every spec's definition (a changed spec gets a new data version).",
)
def partitions_sensor(context: dg.SensorEvaluationContext, settings: ShiftbenchSettings) -> dg.SensorResult:
    cursor = json.loads(context.cursor) if context.cursor else {}
    try:
        requests, observations, new_cursor = sync_requests(settings.get(), context.instance, cursor)
    except ShiftbenchError as exc:  # a bad spec file: say so on the sensor's tick, change nothing
        return dg.SensorResult(skip_reason=dg.SkipReason(str(exc)))
    return dg.SensorResult(
        dynamic_partitions_requests=requests, asset_events=observations, cursor=json.dumps(new_cursor)
    )
