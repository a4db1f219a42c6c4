"""MetaShift assets: thin Dagster wrappers over :mod:`shiftbench.metashift.pipeline`.

Graph: raw annotations and specs (observable) -> ``metashift/scene_tables`` (parsed once,
cached as Parquet) -> ``metashift/staged_collection`` (partitioned by collection) and
``metashift/staged_task`` (partitioned by task) -> blocking contract checks ->
``metashift/collection`` / ``metashift/task`` (publish, refresh the catalog, plots).

Meta-graphs are partitioned by *collection*, not by class: one sparse product computes every
class's overlaps at once (seconds for all of Visual Genome's 1,700 object classes), while a
partition per class would cost a Dagster run (~1 s of overhead) for each of hundreds of
classes and make the collection's version depend on hundreds of partial materializations.
"""

from collections.abc import Iterator
from dataclasses import asdict

import dagster as dg
import polars as pl

from assets.automation import rebuild_condition
from assets.metadata import (
    OverridesConfig,
    artifact_output,
    contract_check_specs,
    metadata_table,
    publish_with_metadata,
    staged_with_checks,
)
from pipelines.resources import ShiftbenchSettings
from shiftbench.cache import CachedArtifact
from shiftbench.fingerprint import sha256_files, sha256_json, sha256_text
from shiftbench.metashift import pipeline as mp
from shiftbench.metashift.specs import load_specs
from shiftbench.plots import png_markdown, task_distances
from shiftbench.sources.generated_scenes import GENERATOR_VERSION
from shiftbench.store import StagedVersion

SPECS = load_specs()
COLLECTION_PARTITIONS = dg.StaticPartitionsDefinition(sorted(SPECS.collections))
TASK_PARTITIONS = dg.StaticPartitionsDefinition(sorted(SPECS.tasks))
COLLECTION_TABLES = (
    "benchmarks",
    "metashift_subsets",
    "metashift_subset_images",
    "metashift_edges",
    "metashift_distances",
    "metashift_communities",
    "metashift_embeddings",
    "metashift_graphs",
)
TASK_TABLES = ("benchmarks", "examples", "metashift_tasks", "metashift_task_communities")
FIGURES_INLINE = 4


# -- raw sources: observed, never materialized --------------------------------------------------
@dg.observable_source_asset(
    key=["raw", "metashift_annotations"],
    group_name="sources",
    description="SHIFTBENCH_GQA_SCENE_GRAPHS files, or SHIFTBENCH_TAGS_TABLE, or the generated scene sample.",
)
def metashift_annotations(settings: ShiftbenchSettings) -> dg.DataVersion:
    config = settings.get()
    files = [*config.gqa_scene_graphs, *([config.tags_table] if config.tags_table else [])]
    existing = [f for f in files if f.exists()]
    return dg.DataVersion(sha256_text(f"{sha256_files(existing)}|{len(files)}|{GENERATOR_VERSION}"))


@dg.observable_source_asset(
    key=["raw", "metashift_collection_specs"],
    group_name="sources",
    partitions_def=COLLECTION_PARTITIONS,
    description="MetaShift collection specs (shiftbench/specs/metashift.yaml and SHIFTBENCH_METASHIFT_SPECS).",
)
def metashift_collection_specs() -> dg.DataVersionsByPartition:
    specs = load_specs()
    return dg.DataVersionsByPartition(
        {
            name: dg.DataVersion(sha256_json([asdict(specs.collections[name]), specs.general_contexts]))
            for name in COLLECTION_PARTITIONS.get_partition_keys()
            if name in specs.collections
        }
    )


@dg.observable_source_asset(
    key=["raw", "metashift_task_specs"],
    group_name="sources",
    partitions_def=TASK_PARTITIONS,
    description="MetaShift task specs (shiftbench/specs/metashift.yaml and SHIFTBENCH_METASHIFT_SPECS).",
)
def metashift_task_specs() -> dg.DataVersionsByPartition:
    specs = load_specs()
    return dg.DataVersionsByPartition(
        {
            name: dg.DataVersion(sha256_json([str(specs.tasks[name]), specs.general_contexts]))
            for name in TASK_PARTITIONS.get_partition_keys()
            if name in specs.tasks
        }
    )


@dg.asset(
    key=["metashift", "scene_tables"],
    deps=[metashift_annotations],
    group_name="metashift",
    code_version="1",
    kinds={"duckdb", "parquet"},
    automation_condition=rebuild_condition(),
    description="Scene graphs parsed into objects (image, object, name, attributes) and images "
    "(location, weather, general tags), cached as Parquet.",
)
def scene_tables(context: dg.AssetExecutionContext, settings: ShiftbenchSettings) -> dg.Output[CachedArtifact]:
    artifact = mp.scene_tables(settings.get())
    if artifact.meta["dataset"] == "generated-scenes":
        context.log.warning("no SHIFTBENCH_GQA_SCENE_GRAPHS or SHIFTBENCH_TAGS_TABLE: using the GENERATED scene sample")
    return artifact_output(artifact, int(artifact.meta["n_objects"]))


def _stage(
    context: dg.AssetExecutionContext,
    config: OverridesConfig,
    settings: ShiftbenchSettings,
    scenes: CachedArtifact,
    *,
    is_task: bool,
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    specs = load_specs()
    overrides = config.parsed()
    name = context.partition_key
    if is_task:
        task_spec = specs.tasks[name].with_overrides(overrides) if overrides else specs.tasks[name]
        staged = mp.stage_task(
            settings.get(), specs, task_spec, scenes, overrides=overrides, publish_as=config.publish_as
        )
    else:
        spec = specs.collections[name].with_overrides(overrides) if overrides else specs.collections[name]
        staged = mp.stage_collection(
            settings.get(), specs, spec, scenes, overrides=overrides, publish_as=config.publish_as
        )
    yield from staged_with_checks(context, staged, TASK_TABLES if is_task else COLLECTION_TABLES)


@dg.asset(
    key=["metashift", "staged_collection"],
    ins={"scenes": dg.AssetIn(key=scene_tables.key)},
    deps=[metashift_collection_specs],
    partitions_def=COLLECTION_PARTITIONS,
    group_name="metashift",
    code_version=mp.CODE_VERSION,
    kinds={"scipy", "networkx", "parquet"},
    automation_condition=rebuild_condition(),
    check_specs=contract_check_specs(["metashift", "staged_collection"], COLLECTION_TABLES),
    description="A subset collection: candidate subsets, per-class meta-graphs (sparse overlap), communities, "
    "spectral embeddings and distances, staged and contract-checked before publishing.",
)
def staged_collection(
    context: dg.AssetExecutionContext,
    config: OverridesConfig,
    settings: ShiftbenchSettings,
    scenes: CachedArtifact,
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    yield from _stage(context, config, settings, scenes, is_task=False)


@dg.asset(
    key=["metashift", "staged_task"],
    ins={"scenes": dg.AssetIn(key=scene_tables.key)},
    deps=[metashift_task_specs],
    partitions_def=TASK_PARTITIONS,
    group_name="metashift",
    code_version=mp.CODE_VERSION,
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    check_specs=contract_check_specs(["metashift", "staged_task"], TASK_TABLES),
    description="One MetaShift shift task (leakage-free pools, sampled WILDS splits, distance d), staged and "
    "contract-checked (zero train/eval overlap among them) before publishing.",
)
def staged_task(
    context: dg.AssetExecutionContext,
    config: OverridesConfig,
    settings: ShiftbenchSettings,
    scenes: CachedArtifact,
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    yield from _stage(context, config, settings, scenes, is_task=True)


@dg.asset(
    key=["metashift", "collection"],
    ins={"staged": dg.AssetIn(key=staged_collection.key)},
    partitions_def=COLLECTION_PARTITIONS,
    group_name="metashift",
    code_version="1",
    kinds={"duckdb", "parquet"},
    automation_condition=rebuild_condition() & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    description="Publishes the staged collection once its contracts passed; shows meta-graph figures (paper Fig. 2).",
)
def collection(
    context: dg.AssetExecutionContext, settings: ShiftbenchSettings, staged: StagedVersion
) -> dg.MaterializeResult:
    query = (
        f"SELECT class, n_subsets, n_components, n_communities, modularity FROM metashift_graphs "
        f"WHERE benchmark = '{staged.benchmark}' ORDER BY n_subsets DESC"
    )
    metadata = publish_with_metadata(settings.get(), staged, query)
    metadata["dataset"] = str(staged.manifest()["sources"].get("dataset"))
    graphs = pl.read_parquet(staged.table_path("metashift_graphs")).sort("n_subsets", "class", descending=[True, False])
    metadata["graphs"] = metadata_table(
        graphs.select("class", "n_subsets", "n_edges", "n_components", "n_communities", "status").head(15)
    )
    attachments = staged.manifest().get("attachments", {})
    warnings = staged.manifest().get("warnings", [])
    for warning in warnings:
        context.log.warning("%s: %s", staged.benchmark, warning)
    metadata["warnings"] = dg.MetadataValue.md("\n".join(f"- **{w}**" for w in warnings) or "none")
    metadata["figures"] = dg.MetadataValue.path(str(staged.path / "files"))
    shown = [c for c in ("cat", "dog") if mp.figure_name(c) in attachments]
    shown += [c for c in graphs["class"].to_list() if c not in shown and mp.figure_name(c) in attachments]
    for class_name in shown[:FIGURES_INLINE]:
        png = (staged.path / attachments[mp.figure_name(class_name)]["file"]).read_bytes()
        metadata[f"metagraph/{class_name}"] = dg.MetadataValue.md(png_markdown(png, f"{class_name} meta-graph"))
    context.log.info("published %s version %s", staged.benchmark, staged.version)
    return dg.MaterializeResult(data_version=dg.DataVersion(staged.version), metadata=metadata)


@dg.asset(
    key=["metashift", "task"],
    ins={"staged": dg.AssetIn(key=staged_task.key)},
    partitions_def=TASK_PARTITIONS,
    group_name="metashift",
    code_version="1",
    kinds={"duckdb", "parquet"},
    automation_condition=rebuild_condition() & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    description="Publishes the staged task once its contracts passed; shows its distances and split sizes.",
)
def task(
    context: dg.AssetExecutionContext, settings: ShiftbenchSettings, staged: StagedVersion
) -> dg.MaterializeResult:
    query = f"SELECT split, \"group\", count(*) FROM examples WHERE benchmark = '{staged.benchmark}' GROUP BY ALL"
    metadata = publish_with_metadata(settings.get(), staged, query)
    metadata["dataset"] = str(staged.manifest()["sources"].get("dataset"))
    summary = pl.read_parquet(staged.table_path("metashift_tasks")).row(0, named=True)
    communities = pl.read_parquet(staged.table_path("metashift_task_communities"))
    metadata["distance"] = dg.MetadataValue.float(summary["distance"]) if summary["distance"] is not None else "NULL"
    metadata["distance_status"] = summary["distance_status"]
    metadata["scaled_down"] = summary["scaled_down"]
    metadata["communities"] = metadata_table(
        communities.select("community", "role", "split", "n_available", "n_selected", "distance_status")
    )
    plot = task_distances(communities, f"{staged.benchmark} ({staged.version})")
    metadata["distances_plot"] = dg.MetadataValue.md(png_markdown(plot, "distances to the reference community"))
    context.log.info("published %s version %s (d=%s)", staged.benchmark, staged.version, summary["distance"])
    return dg.MaterializeResult(data_version=dg.DataVersion(staged.version), metadata=metadata)


raw_sources = [metashift_annotations, metashift_collection_specs, metashift_task_specs]
input_assets = [scene_tables]
collection_assets = [staged_collection, collection]
task_assets = [staged_task, task]
