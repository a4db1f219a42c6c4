"""Fanned-out builds: one benchmark's units as the steps of one Dagster run, on Dagster's own executors.

For a kind whose build splits into units (:class:`shiftbench.families.family.Fanout`: MetaShift collections, in buckets
of
classes), the job ``<family>_<kinds>_fanout`` builds one benchmark as

    plan (once: the work folder and the units) -> unit (one step per unit, mapped) -> publish (once: stage, check,
    publish, catalog)

on the multiprocess executor (the units run side by side, ``max_concurrent`` at a time; one per core by default).
The same job runs each unit in its own Kubernetes pod with dagster-k8s' ``k8s_job_executor`` (docs/kubernetes.md):
the steps share nothing but the work folder, which must then be on a volume every pod mounts. The version is the
one a build in one piece gives; the materializations are recorded on the kind's staged and published assets, under
the benchmark's partition.
"""

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg

from shiftbench.assets.factory import load_input
from shiftbench.assets.metadata import data_version_tags, published_metadata, render, staged_metadata
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families import benchmark_builds, variants
from shiftbench.families.family import Family, Kind
from shiftbench.warehouse import publishing

DEFAULT_UNITS = 8


class FanoutConfig(dg.Config):
    benchmark: str  # a spec or a named variant of the kind
    units: int = DEFAULT_UNITS  # how many units (buckets) the build is split into


def work_folder(settings: Settings, run_id: str) -> Path:
    """Where one run's units meet (under the cache: on Kubernetes, a volume every pod mounts)."""
    return settings.cache_dir / "fanout" / run_id


def executor(settings: Settings | None) -> dg.ExecutorDefinition:
    """Dagster's multiprocess executor, or with ``SHIFTBENCH_FANOUT_EXECUTOR=k8s`` dagster-k8s' job executor: the
    same job, each step in a pod (the run itself launched by the ``K8sRunLauncher``; docs/kubernetes.md)."""
    if settings is not None and settings.fanout_executor == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor  # type: ignore[no-any-return]
    return dg.multiprocess_executor


def fanout_job(family: Family, kind: Kind, settings: Settings | None = None) -> dg.JobDefinition | None:
    """The fanned-out build of one benchmark of ``kind``, or None when the kind does not split."""
    fanout = kind.fanout
    if fanout is None:
        return None
    prefix = kind.fanout_prefix

    def inputs_of(context: dg.OpExecutionContext, settings: Settings, target: Any) -> dict[str, Any]:
        return {
            name: load_input(context.instance, family.input(name), settings)
            for name in kind.inputs_needed(settings, [target.spec])
        }

    @dg.op(name=f"{prefix}_plan", out=dg.DynamicOut(str))
    def plan(context: dg.OpExecutionContext, config: FanoutConfig, settings: ShiftbenchSettings) -> Iterator[Any]:  # type: ignore[valid-type]
        resolved = settings.get()
        if config.units < 1:
            raise InputError(f"must be at least 1, got {config.units}", parameter="units")
        target = variants.resolve(resolved, kind, config.benchmark)
        units = fanout.plan(
            resolved, target, inputs_of(context, resolved, target), work_folder(resolved, context.run_id), config.units
        )
        context.log.info(f"{config.benchmark}: {len(units)} units")
        for unit in units:
            yield dg.DynamicOutput(unit, mapping_key=f"unit_{unit}")

    @dg.op(name=f"{prefix}_unit")
    def unit(context: dg.OpExecutionContext, name: str, settings: ShiftbenchSettings) -> str:  # type: ignore[valid-type]
        fanout.unit(work_folder(settings.get(), context.run_id), name)
        return name

    @dg.op(name=f"{prefix}_publish", out={})
    def publish(
        context: dg.OpExecutionContext,
        config: FanoutConfig,
        settings: ShiftbenchSettings,  # type: ignore[valid-type]
        units: list[str],
    ) -> Iterator[Any]:
        import shutil

        resolved = settings.get()
        work = work_folder(resolved, context.run_id)
        target = variants.resolve(resolved, kind, config.benchmark)
        whole = replace(kind, stage=lambda s, t, i: fanout.stage(s, t, i, work))
        try:
            outcome = benchmark_builds.stage_benchmark(resolved, whole, target, inputs_of(context, resolved, target))
            outcome = benchmark_builds.publish_outcome(resolved, outcome)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        yield from materializations(resolved, kind, outcome)
        if outcome.publication is not None and outcome.staged is not None:
            publishing.refresh_catalog(resolved)
            context.log.info(f"published {outcome.benchmark} version {outcome.staged.version}")
        if outcome.traceback is not None:  # a bug: the run's log keeps its traceback beside the one line
            said = f"{config.benchmark}: a failure of shiftbench itself, its traceback:"
            context.log.error(f"{said}\n{outcome.traceback}")
        if outcome.error is not None or outcome.publication is None:
            raise dg.Failure(
                description=f"{config.benchmark}: {outcome.error or 'not published'}",
                metadata={"traceback": dg.MetadataValue.text(outcome.traceback)} if outcome.traceback else None,
                allow_retries=False,
            )

    @dg.job(
        name=f"{kind.qualified}_fanout",
        description=f"Build one {family.title} {kind.name} in units run side by side (plan -> units -> publish), "
        "on the multiprocess executor; the same version as one piece.",
        executor_def=executor(settings),
    )
    def _job() -> None:
        publish(plan().map(unit).collect())

    return _job


def materializations(
    settings: Settings, kind: Kind, outcome: benchmark_builds.Outcome
) -> Iterator[dg.AssetMaterialization]:
    """The staged and published versions, recorded on the kind's assets under the benchmark's partition."""
    if outcome.staged is None:
        return
    staged_key, publish_key = dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))
    yield dg.AssetMaterialization(
        asset_key=staged_key,
        partition=outcome.benchmark,
        metadata=staged_metadata(outcome.staged, outcome.rules, len(outcome.failed_rules)),
        tags=data_version_tags(outcome.staged.version),
    )
    if outcome.publication is not None:
        description = outcome.description or benchmark_builds.describe(kind, outcome.staged)
        yield dg.AssetMaterialization(
            asset_key=publish_key,
            partition=outcome.benchmark,
            metadata={
                **published_metadata(settings, outcome.staged, outcome.publication),
                "summary": description.summary,
                **render(description.metadata, settings),
            },
            tags=data_version_tags(outcome.staged.version),
        )
