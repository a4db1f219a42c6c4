"""ConDS assets: thin Dagster wrappers over :mod:`shiftbench.conds.pipeline`.

Graph: raw attribute sources and case specs (observable) -> ``conds/attribute_tables``
(partitioned by dataset: CelebA, the generated sprites with their PNG files, users' tables) ->
``conds/staged_case`` (partitioned by case; each case reads its dataset's partition) -> blocking
contract checks that verify the case's definition on the data -> ``conds/case`` (publish,
refresh the catalog, the train-vs-test cell-count plot and the value-share plot).
"""

from collections.abc import Iterator
from typing import Any

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
from shiftbench.conds import pipeline as cp
from shiftbench.conds.specs import load_specs
from shiftbench.fingerprint import sha256_files, sha256_json, sha256_text
from shiftbench.plots import png_markdown
from shiftbench.sources.sprites import GENERATOR_VERSION
from shiftbench.store import StagedVersion

SPECS = load_specs()
DATASET_PARTITIONS = dg.StaticPartitionsDefinition(sorted(SPECS.datasets))
CASE_PARTITIONS = dg.StaticPartitionsDefinition(list(SPECS.cases))
CASES_OF_DATASET = {d: [c for c, case in SPECS.cases.items() if case.dataset == d] for d in SPECS.datasets}
CASE_TABLES = (
    "benchmarks",
    "examples",
    "conds_examples",
    "conds_cases",
    "conds_attributes",
    "conds_value_counts",
    "conds_cells",
)


def _source_version(name: str, settings: Any) -> str:
    dataset = load_specs().datasets[name]
    if dataset.source == "celeba":
        names = ("list_attr_celeba.txt", "list_eval_partition.txt")
        files = [settings.celeba_dir / f for f in names] if settings.celeba_dir else []
        return sha256_text(f"celeba|{sha256_files([f for f in files if f.exists()])}|{settings.celeba_allow_partial}")
    if dataset.source == "sprites":
        return sha256_text(f"{GENERATOR_VERSION}|{settings.sprites_per_combination}|{settings.sprites_seed}")
    path = dataset.path
    return sha256_text(f"table|{sha256_files([path]) if path is not None and path.exists() else 'missing'}")


@dg.observable_source_asset(
    key=["raw", "conds_attribute_sources"],
    group_name="sources",
    partitions_def=DATASET_PARTITIONS,
    description="Per ConDS dataset: SHIFTBENCH_CELEBA_DIR's files, a user's attribute table, or the sprites "
    "generator's version and parameters.",
)
def conds_attribute_sources(settings: ShiftbenchSettings) -> dg.DataVersionsByPartition:
    config = settings.get()
    return dg.DataVersionsByPartition(
        {name: dg.DataVersion(_source_version(name, config)) for name in DATASET_PARTITIONS.get_partition_keys()}
    )


@dg.observable_source_asset(
    key=["raw", "conds_case_specs"],
    group_name="sources",
    partitions_def=CASE_PARTITIONS,
    description="ConDS dataset specs and their cases (shiftbench/specs/conds.yaml and SHIFTBENCH_CONDS_SPECS).",
)
def conds_case_specs() -> dg.DataVersionsByPartition:
    specs = load_specs()
    return dg.DataVersionsByPartition(
        {
            name: dg.DataVersion(sha256_json([specs.cases[name].params(), str(specs.dataset_of(name))]))
            for name in CASE_PARTITIONS.get_partition_keys()
            if name in specs.cases
        }
    )


@dg.asset(
    key=["conds", "attribute_tables"],
    deps=[conds_attribute_sources],
    partitions_def=DATASET_PARTITIONS,
    group_name="conds",
    code_version="1",
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    description="A dataset's examples with one categorical column per attribute (raw columns mapped as the "
    "dataset spec says), cached as Parquet; for sprites, the generated PNG files too.",
)
def attribute_tables(context: dg.AssetExecutionContext, settings: ShiftbenchSettings) -> dg.Output[CachedArtifact]:
    dataset = load_specs().datasets[context.partition_key]
    artifact = cp.attribute_source(settings.get(), dataset)
    if dataset.source == "sprites":
        context.log.info("sprites are GENERATED images (not dSprites): %s", artifact.meta["image_root"])
    return artifact_output(artifact, int(artifact.meta["n_examples"]))


@dg.asset(
    key=["conds", "staged_case"],
    ins={
        "source": dg.AssetIn(
            key=attribute_tables.key,
            partition_mapping=dg.StaticPartitionMapping(CASES_OF_DATASET),
        )
    },
    deps=[conds_case_specs],
    partitions_def=CASE_PARTITIONS,
    group_name="conds",
    code_version=cp.CODE_VERSION,
    kinds={"polars", "parquet"},
    automation_condition=rebuild_condition(),
    check_specs=contract_check_specs(["conds", "staged_case"], CASE_TABLES),
    description="One ConDS case (label + SC/LDD/UDS per attribute): disjoint pools per cell, uniform test, "
    "shaped train and id_val, measured shift summary; staged and checked against the case's definition.",
)
def staged_case(
    context: dg.AssetExecutionContext,
    config: OverridesConfig,
    settings: ShiftbenchSettings,
    source: CachedArtifact,
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    specs = load_specs()
    overrides = config.parsed()
    case = specs.cases[context.partition_key]
    case = case.with_overrides(overrides) if overrides else case
    staged = cp.stage_case(settings.get(), case, source, overrides=overrides, publish_as=config.publish_as)
    yield from staged_with_checks(context, staged, CASE_TABLES)


@dg.asset(
    key=["conds", "case"],
    ins={"staged": dg.AssetIn(key=staged_case.key)},
    partitions_def=CASE_PARTITIONS,
    group_name="conds",
    code_version="1",
    kinds={"duckdb", "parquet"},
    automation_condition=rebuild_condition() & dg.AutomationCondition.all_deps_blocking_checks_passed(),
    description="Publishes the staged case once its contracts passed; shows the shift summary and its plots.",
)
def case(
    context: dg.AssetExecutionContext, settings: ShiftbenchSettings, staged: StagedVersion
) -> dg.MaterializeResult:
    query = f"SELECT split, \"group\", count(*) FROM examples WHERE benchmark = '{staged.benchmark}' GROUP BY ALL"
    metadata = publish_with_metadata(settings.get(), staged, query)
    summary = pl.read_parquet(staged.table_path("conds_cases")).row(0, named=True)
    for key in ("shift_kind", "n_train", "n_id_val", "n_test", "scaled_down"):
        metadata[key] = summary[key]
    metadata["tv_distance"] = dg.MetadataValue.float(summary["tv_distance"])
    for key in ("sc_observed_fraction", "ldd_observed_ratio"):
        if summary[key] is not None:
            metadata[key] = dg.MetadataValue.float(summary[key])
    attributes = pl.read_parquet(staged.table_path("conds_attributes"))
    metadata["shift_summary"] = metadata_table(
        attributes.select(
            "attribute",
            "role",
            "shift",
            pl.col("unseen_in_train").list.join(", "),
            pl.col("cramers_v").round(4),
            pl.col("mutual_information").round(4),
        )
    )
    files = staged.manifest().get("attachments", {})
    for key, name, alt in (
        ("cell_counts_plot", cp.CELL_FIGURE, "train vs test examples per cell"),
        ("value_shares_plot", cp.SHARES_FIGURE, "value shares, train vs test"),
    ):
        if name in files:
            png = (staged.path / files[name]["file"]).read_bytes()
            metadata[key] = dg.MetadataValue.md(png_markdown(png, alt))
    context.log.info("published %s version %s (%s)", staged.benchmark, staged.version, summary["shift_kind"])
    return dg.MaterializeResult(data_version=dg.DataVersion(staged.version), metadata=metadata)


raw_sources = [conds_attribute_sources, conds_case_specs]
input_assets = [attribute_tables]
case_assets = [staged_case, case]
