"""One asset factory for every family of the registry (``shiftbench.families.registry.families``).

For a family it makes:

- ``raw/<source>``: external assets (``AssetSpec``) observed for their content fingerprints at the
  nightly tick;
- its inputs (``sources/imagenet_hierarchy``, ``metashift/scene_tables``, ...): cached, parsed inputs
  handed to later steps by path;
- per kind of benchmark: ``raw/<family>_<kind>_specs`` (an external asset with one data version per
  benchmark, observed by the partition sensor), and one multi-asset that *stages* (``<family>/staged_<kind>``, with one
  blocking check per contract) and *publishes* (``<family>/<kind>``) every selected benchmark in a
  single run: a backfill of N partitions is one run, the catalog is refreshed once, and each
  partition gets its own materializations and check results;
- jobs ``<family>_inputs`` and ``<family>_<kinds>``.

Partitions are dynamic (``<family>_<kinds>``): the partition sensor keeps them equal to the specs
that can be built with the current settings plus the named variants, so a spec added to a user's
spec file appears without reloading the code location, and a dataset that is not configured
(CelebA without ``SHIFTBENCH_CELEBA_DIR``) has no partitions the automation could request.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NULL_EVENT_POINTER,
    extract_data_version_from_entry,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)
from pydantic import Field, create_model

from shiftbench.assets.automation import observe_nightly, publish, rebuild
from shiftbench.assets.metadata import (
    ARTIFACT_RECORD,
    artifact_metadata,
    contract_check_specs,
    contract_evaluations,
    data_version_tags,
    published_metadata,
    render,
    staged_metadata,
)
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families import benchmark_builds, registry, variants
from shiftbench.families.family import Family, Input, Kind, RawSource, Target
from shiftbench.families.plans import override_value
from shiftbench.runtime import progress
from shiftbench.runtime.cache import CachedArtifact, find_cached
from shiftbench.warehouse import publishing


def partitions_of(kind: Kind) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=kind.qualified)


def spec_source_key(kind: Kind) -> dg.AssetKey:
    return dg.AssetKey(["raw", f"{kind.family}_{kind.name}_specs"])


def load_input(instance: dg.DagsterInstance, item: Input, settings: Settings) -> CachedArtifact:
    """The input's latest build, by the path its materialization recorded (steps share paths, not pickles), in
    this warehouse: relative to it, or an older record's absolute path found where the warehouse is now."""
    event = instance.get_latest_materialization_event(dg.AssetKey(list(item.key)))
    materialization = event.asset_materialization if event is not None else None
    metadata = materialization.metadata if materialization is not None else {}
    path = metadata.get(ARTIFACT_RECORD) or metadata.get("path")
    if path is None:
        raise InputError(f"{item.name} has not been built yet: materialize it (job {item.key[0]}_inputs) first")
    return CachedArtifact.load(find_cached(str(path.value), settings.home, settings.cache_dir))


# -- raw sources ------------------------------------------------------------------------------------
def raw_source_asset(source: RawSource) -> dg.AssetsDefinition:
    """An external asset (``AssetSpec``) observed for its content fingerprint at the nightly tick."""

    @dg.multi_observable_source_asset(
        name=f"observe_{source.name}",
        specs=[
            dg.AssetSpec(
                ["raw", source.name],
                group_name="sources",
                description=source.description,
                automation_condition=observe_nightly(),
            )
        ],
    )
    def _observe(settings: ShiftbenchSettings) -> dg.ObserveResult:
        return dg.ObserveResult(data_version=dg.DataVersion(source.fingerprint(settings.get())))

    return _observe


def spec_fingerprints(settings: Settings, kind: Kind) -> dict[str, str]:
    """The data version of every buildable benchmark's definition (spec, overrides, context)."""
    return {name: kind.fingerprint(settings, target) for name, target in variants.targets(settings, kind).items()}


def spec_source_asset(kind: Kind) -> dg.AssetsDefinition:
    """An external asset with one data version per benchmark's definition.

    The partition sensor observes every changed spec on its tick (``pipelines/sensors.py``, runless
    observations); observing a partition from the UI reports the same fingerprint.
    """

    @dg.multi_observable_source_asset(
        name=f"observe_{kind.family}_{kind.name}_specs",
        partitions_def=partitions_of(kind),
        specs=[
            dg.AssetSpec(
                spec_source_key(kind),
                group_name="sources",
                description=f"The {kind.family} {kind.name} specs (shiftbench/specs/{kind.family}.yaml, "
                f"SHIFTBENCH_{kind.spec_source.upper()}) and named variants: one data version per benchmark, "
                "observed by the partition sensor.",
            )
        ],
    )
    def _observe(context: dg.AssetExecutionContext, settings: ShiftbenchSettings) -> dg.ObserveResult:
        resolved = settings.get()
        target = variants.targets(resolved, kind).get(context.partition_key)
        if target is None:
            raise InputError(f"{context.partition_key} is not a buildable {kind.name} here")
        return dg.ObserveResult(data_version=dg.DataVersion(kind.fingerprint(resolved, target)))

    return _observe


# -- inputs -----------------------------------------------------------------------------------------
def input_asset(family: Family, item: Input) -> dg.AssetsDefinition:
    deps = [dg.AssetKey(["raw", name]) for name in item.sources]
    deps += [dg.AssetKey(list(family.input(name).key)) for name in item.inputs]

    @dg.asset(
        key=list(item.key),
        deps=deps,
        group_name=item.key[0],
        code_version=item.code_version,
        kinds=set(item.compute_kinds),
        automation_condition=rebuild(),
        description=item.description,
    )
    def _build(context: dg.AssetExecutionContext, settings: ShiftbenchSettings) -> Iterator[Any]:
        resolved = settings.get()
        yield from _observe_sources_read(context, family, item, resolved)
        upstream = {name: load_input(context.instance, family.input(name), resolved) for name in item.inputs}
        progress.report(progress.Event("input", item.name, status="start"))
        artifact = item.build(resolved, upstream)
        summary = item.summary(artifact)
        for warning in item.warnings(artifact):  # in the run's log, and on the CLI's terminal
            context.log.warning(warning)
            progress.report(progress.Event("input", item.name, status="warning", detail=warning))
        progress.report(progress.Event("input", item.name, status="done", detail=summary))
        yield dg.MaterializeResult(
            data_version=dg.DataVersion(artifact.fingerprint),
            metadata=artifact_metadata(artifact, int(artifact.meta.get(item.rows, 0)), summary, resolved),
        )

    return _build


def _observe_sources_read(
    context: dg.AssetExecutionContext, family: Family, item: Input, settings: Settings
) -> Iterator[dg.AssetObservation]:
    """Observe the raw sources the input reads, now, and make its materialization's provenance record them.

    Dagster reads the versions of a step's upstream assets when the step starts, before this observation: without
    the refresh below, the first build of an input records ``INITIAL`` (or the last nightly observation) as the
    version it read, and the observation made here then shows the input as stale ("has a new dependency data
    version") right after it was built from exactly those files. Each observation is stored before the step goes
    on, so dropping the cached version makes Dagster read this one when it records the materialization. Dagster
    internals (the step context's version cache, which Dagster itself clears this way for an asset materialized
    within a step), guarded by the test that nothing shows stale after a fresh build (tests/test_dagster.py).
    """
    step = context.get_step_execution_context()  # the step's own context ("for framework authors")
    for name in item.sources:
        source = next(s for s in family.raw_sources if s.name == name)
        key = dg.AssetKey(["raw", name])
        yield dg.AssetObservation(asset_key=key, tags=data_version_tags(source.fingerprint(settings)))
        step.wipe_input_asset_version_info(key)


# -- benchmarks -------------------------------------------------------------------------------------
def _config_type(annotation: Any) -> Any:
    """A spec field's type as Dagster config: tuples are lists; everything is optional (unset = keep)."""
    text = str(annotation)
    if "tuple" in text:
        return list[str] | None
    return annotation | None


def overrides_config(kind: Kind) -> type[dg.Config]:
    """Typed launchpad config: one optional field per overridable parameter, plus ``publish_as``.

    Parameters that may be null (``ancestor``, ``train_size``...) are YAML text (``null`` clears,
    ``max`` for ConDS' train_size), as on the command line.
    """
    model = kind.spec_model
    fields: dict[str, Any] = {}
    for name in model.OVERRIDABLE:
        annotation = str | None if name in model.nullable() else _config_type(model.model_fields[name].annotation)
        fields[name] = (annotation, Field(None, description=f"override {name} (unset: the spec's value)"))
    fields["publish_as"] = (
        str | None,
        Field(
            None,
            description="overriding parameters needs a new benchmark name: the variant is built as its own partition",
        ),
    )
    title = "".join(part.title() for part in kind.qualified.split("_")) + "Config"
    return create_model(title, __base__=dg.Config, **fields)  # type: ignore[no-any-return, call-overload]


def config_overrides(kind: Kind, config: Any) -> dict[str, Any]:
    values = {name: getattr(config, name) for name in kind.spec_model.OVERRIDABLE if getattr(config, name) is not None}
    return {
        name: override_value(name, value) if name in kind.spec_model.nullable() and isinstance(value, str) else value
        for name, value in values.items()
    }


def inputs_read(family: Family, kind: Kind, names: Iterable[str] | None = None) -> list[dg.AssetKey]:
    """The family inputs a kind reads (or only ``names``), with what they read, in build order."""
    return [dg.AssetKey(list(item.key)) for item in family.inputs_for(kind.inputs if names is None else names)]


@dataclass(frozen=True)
class KindAssets:
    spec_source: dg.AssetsDefinition
    build: dg.AssetsDefinition
    job: Any


def forget_variant(instance: dg.DagsterInstance, settings: Settings, kind: Kind, name: str) -> None:
    """A name registered by a build that then published nothing stays free: forget it and its partition."""
    variants.unregister(settings, name)
    if name in instance.get_dynamic_partitions(kind.qualified):
        instance.delete_dynamic_partition(kind.qualified, name)


def _register_variant(
    context: dg.AssetExecutionContext, settings: Settings, kind: Kind, config: Any
) -> tuple[list[str], str | None]:
    """Launchpad overrides: record the named variant, add its partition, build it under its own name.

    Returns the partitions to build and the name if it is new (forgotten again if nothing publishes).
    """
    overrides = config_overrides(kind, config)
    keys = list(context.partition_keys)
    if not config.publish_as:
        raise InputError(
            f"overriding parameters of {', '.join(keys)} needs publish_as (a new name): a benchmark's name always "
            "means the same content",
            parameter="publish_as",
        )
    if len(keys) != 1:
        raise InputError("publish_as needs a run of exactly one partition", parameter="publish_as")
    known = set(variants.load_variants(settings))
    variant = registry.register_variant(settings, kind, config.publish_as, keys[0], overrides)
    new = variant.name not in known
    context.instance.add_dynamic_partitions(kind.qualified, [variant.name])
    context.log.info(
        f"registered {variant.name} = {variant.base} + {variant.overrides}; built and recorded as its own partition"
    )
    return [variant.name], variant.name if new else None


def _kind_specs(family: Family, kind: Kind, spec_source_key: dg.AssetKey) -> list[dg.AssetSpec]:
    """The kind's two assets: the staged versions (after the spec and the inputs it reads) and their publication."""
    staged_key, publish_key = dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))
    input_keys = [dg.AssetKey(list(family.input(name).key)) for name in kind.inputs]
    return [
        dg.AssetSpec(
            staged_key,
            deps=[spec_source_key, *input_keys],
            group_name=family.name,
            code_version=kind.code_version,
            kinds=set(kind.compute_kinds),
            automation_condition=rebuild(),
            skippable=True,
            description=f"{kind.description} Staged as an immutable, not yet published version; its contract "
            "checks run on the staged files.",
        ),
        dg.AssetSpec(
            publish_key,
            deps=[staged_key],
            group_name=family.name,
            code_version="1",
            kinds={"duckdb", "parquet"},
            automation_condition=publish(),
            skippable=True,
            description=f"Publishes each staged {kind.name} whose blocking contract checks passed (the store "
            "refuses any other) and refreshes the catalog once per run.",
        ),
    ]


def kind_assets(family: Family, kind: Kind) -> KindAssets:
    partitions = partitions_of(kind)
    spec_source = spec_source_asset(kind)
    staged_key, publish_key = dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))
    Config = overrides_config(kind)

    @dg.multi_asset(
        name=kind.op_name,
        specs=_kind_specs(family, kind, spec_source.key),
        check_specs=contract_check_specs(staged_key, kind.tables, partitions),
        partitions_def=partitions,
        can_subset=True,
        backfill_policy=dg.BackfillPolicy.single_run(),
    )
    def _build(context: dg.AssetExecutionContext, config: Config, settings: ShiftbenchSettings) -> Iterator[Any]:  # type: ignore[valid-type]
        yield from _build_kind(context, family, kind, config, settings.get())

    job = dg.define_asset_job(
        kind.qualified,
        selection=dg.AssetSelection.assets(*inputs_read(family, kind), staged_key, publish_key),
        description=f"Build the inputs, then stage, check and publish {family.title} {kind.plural}: one run for "
        "any number of partitions.",
    )
    return KindAssets(spec_source, _build, job)


def _targets(settings: Settings, kind: Kind, keys: list[str], errors: list[str]) -> list[tuple[Kind, Target]]:
    """The partitions' specs; a partition whose spec is gone or whose source is not configured is an error, said."""
    known = variants.targets(settings, kind)
    targets = []
    for key in keys:
        if key in known:
            targets.append((kind, known[key]))
            continue
        try:
            variants.resolve(settings, kind, key)
        except InputError as exc:
            errors.append(f"{key}: {exc}")
            missing = benchmark_builds.Outcome(kind, key, error=str(exc))
            progress.report(progress.Event(kind.name, key, status="error", detail=str(exc), outcome=missing))
    return targets


def _build_kind(
    context: dg.AssetExecutionContext, family: Family, kind: Kind, config: Any, settings: Settings
) -> Iterator[Any]:
    """Stage and/or publish the run's partitions (a launchpad override first registers its named variant)."""
    staged_key, publish_key = dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))
    keys, registered = list(context.partition_keys), None
    if config_overrides(kind, config) or config.publish_as:
        keys, registered = _register_variant(context, settings, kind, config)
    stage = staged_key in context.selected_asset_keys
    publish_selected = publish_key in context.selected_asset_keys
    errors: list[str] = []
    bugs: dict[str, str] = {}  # the failures of shiftbench itself: their tracebacks, for the report
    targets = _targets(settings, kind, keys, errors)
    needed = kind.inputs_needed(settings, [target.spec for _, target in targets])
    inputs = {name: load_input(context.instance, family.input(name), settings) for name in needed} if stage else {}
    published = False
    try:
        for outcome in benchmark_builds.iter_build(
            settings, family, targets, inputs=inputs, stage=stage, publish_checked=publish_selected
        ):
            yield from _events(context, settings, kind, outcome, stage)
            published |= outcome.publication is not None
            if outcome.error is not None:
                errors.append(f"{outcome.benchmark}: {outcome.error}")
            if outcome.traceback is not None:
                bugs[outcome.benchmark] = outcome.traceback
    finally:  # whatever stopped the loop, what was published reaches the catalog
        if published:
            catalog = publishing.refresh_catalog(settings)
            if not catalog.ok:
                context.log.warning(f"{catalog.reason}: the versions are published; run `shiftbench catalog`")
            for problem in catalog.problems:
                context.log.warning(f"left out of the catalog: {problem}")
        if registered is not None and not published:
            forget_variant(context.instance, settings, kind, registered)
    if errors:
        raise dg.Failure(
            description=f"{len(errors)} of {len(keys)} {kind.plural} failed:\n" + "\n".join(errors),
            metadata={f"traceback {name}": dg.MetadataValue.text(text) for name, text in bugs.items()},
            allow_retries=False,
        )


def _events(
    context: dg.AssetExecutionContext,
    settings: Settings,
    kind: Kind,
    outcome: benchmark_builds.Outcome,
    staged_here: bool,
) -> Iterator[Any]:
    staged_key, publish_key = dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))
    name = outcome.benchmark
    if outcome.traceback is not None:  # a bug: the run's log keeps its traceback beside the one line
        said = outcome.error or (outcome.description.summary if outcome.description is not None else "")
        context.log.error(f"{name}: {said}; a failure of shiftbench itself, its traceback:\n{outcome.traceback}")
    if outcome.staged is None:
        if outcome.traceback is None:
            context.log.error(f"{name}: {outcome.error}")
        return
    if staged_here and outcome.target is not None:
        # The spec this build read, as the partition sensor would observe it: no spurious "change" later.
        yield dg.AssetObservation(
            asset_key=spec_source_key(kind),
            partition=name,
            tags=data_version_tags(kind.fingerprint(settings, outcome.target)),
        )
        yield dg.AssetMaterialization(
            asset_key=staged_key,
            partition=name,
            metadata=staged_metadata(outcome.staged, outcome.rules, len(outcome.failed_rules)),
            tags={**data_version_tags(outcome.staged.version), **_provenance(context.instance, kind, name)},
        )
        yield from contract_evaluations(staged_key, name, kind.tables, outcome.results)
        context.log.info(
            f"staged {name} version {outcome.staged.version}: {outcome.rules - len(outcome.failed_rules)}"
            f"/{outcome.rules} rules hold"
        )
    if outcome.publication is not None:
        description = outcome.description or benchmark_builds.describe(kind, outcome.staged)
        for warning in description.warnings:
            context.log.warning(f"{name}: {warning}")
        yield dg.AssetMaterialization(
            asset_key=publish_key,
            partition=name,
            metadata={
                **published_metadata(settings, outcome.staged, outcome.publication),
                "summary": description.summary,
                **render(description.metadata, settings),
            },
            tags=data_version_tags(outcome.staged.version),
        )
        context.log.info(f"published {name} version {outcome.staged.version} ({description.summary})")
    elif outcome.error is not None and outcome.traceback is None:  # a bug's line was logged with its traceback
        context.log.error(f"{name}: {outcome.error}")


def _provenance(instance: dg.DagsterInstance, kind: Kind, partition: str) -> dict[str, str]:
    """What a staged version was built from, in the tags Dagster writes on the materializations it computes
    itself: the kind's code version and the version of each asset the staged asset reads (its spec's partition,
    as observed just before; the inputs' latest builds, which this run loaded).

    The staged materialization is a runtime event, so without them the UI compares times, not versions: an input
    rebuilt with the same content (any later build of one benchmark) marked every other benchmark of the kind
    stale, and a changed spec or code marked none. Dagster internals (its tag names), guarded by the staleness
    test in tests/test_dagster.py.
    """
    tags = {CODE_VERSION_TAG: kind.code_version}
    family = registry.family(kind.family)
    reads = [(spec_source_key(kind), partition), *((dg.AssetKey(list(family.input(n).key)), None) for n in kind.inputs)]
    for key, part in reads:
        wanted = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[part] if part is not None else None)
        fetch = instance.fetch_observations if part is not None else instance.fetch_materializations
        records = fetch(wanted, limit=1).records
        version = extract_data_version_from_entry(records[0].event_log_entry) if records else None
        tags[get_input_data_version_tag(key)] = (version or DEFAULT_DATA_VERSION).value
        tags[get_input_event_pointer_tag(key)] = str(records[0].storage_id) if records else NULL_EVENT_POINTER
    return tags


@dataclass(frozen=True)
class FamilyAssets:
    family: Family
    raw_sources: list[dg.AssetsDefinition]
    inputs: list[dg.AssetsDefinition]
    kinds: dict[str, KindAssets]
    inputs_job: Any

    @property
    def assets(self) -> list[Any]:
        return [
            *self.raw_sources,
            *self.inputs,
            *(k.spec_source for k in self.kinds.values()),
            *(k.build for k in self.kinds.values()),
        ]

    @property
    def jobs(self) -> list[Any]:
        return [self.inputs_job, *(k.job for k in self.kinds.values())]


def family_assets(family: Family) -> FamilyAssets:
    inputs = [input_asset(family, item) for item in family.inputs]
    return FamilyAssets(
        family,
        [raw_source_asset(source) for source in family.raw_sources],
        inputs,
        {kind.name: kind_assets(family, kind) for kind in family.kinds},
        dg.define_asset_job(
            f"{family.name}_inputs",
            selection=dg.AssetSelection.assets(*[i.key for i in inputs]),
            description=f"Build the shared {family.title} inputs: {', '.join(i.name for i in family.inputs)}.",
        ),
    )
