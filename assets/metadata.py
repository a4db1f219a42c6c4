"""Dagster metadata from the library's neutral descriptions, contract results and artifacts."""

from collections.abc import Mapping
from typing import Any

import dagster as dg
import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.families.family import Figure, FilePath, Markdown, Metadata, Table
from shiftbench.results.plots import png_markdown
from shiftbench.runtime.cache import CachedArtifact, home_record
from shiftbench.store import Publication, StagedVersion
from shiftbench.store.contracts import RuleResult

DATA_VERSION_TAG = "dagster/data_version"
USER_DATA_VERSION_TAG = "dagster/data_version_is_user_provided"
ARTIFACT_RECORD = "path_in_warehouse"  # an input's cache folder, relative to the warehouse: found after a move


def data_version_tags(version: str) -> dict[str, str]:
    """Tags that give a runtime materialization its data version (the content id)."""
    return {DATA_VERSION_TAG: version, USER_DATA_VERSION_TAG: "true"}


def metadata_table(frame: pl.DataFrame) -> dg.TableMetadataValue:
    """A metadata table: the UI renders it inline (markdown over 1,000 characters is folded)."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(name, "int" if dtype.is_integer() else "float" if dtype.is_float() else "string")
            for name, dtype in frame.schema.items()
        ]
    )
    return dg.MetadataValue.table(records=[dg.TableRecord(row) for row in frame.to_dicts()], schema=schema)


def render(metadata: Metadata, settings: Settings) -> dict[str, Any]:
    """The library's neutral metadata as Dagster metadata values."""
    rendered: dict[str, Any] = {}
    for key, value in metadata.items():
        if isinstance(value, Table):
            rendered[key] = metadata_table(value.frame)
        elif isinstance(value, Figure):
            rendered[key] = dg.MetadataValue.md(png_markdown(value.png, value.alt))
        elif isinstance(value, Markdown) and key == "duckdb_query":
            rendered[key] = dg.MetadataValue.md(f"```sql\n-- duckdb {settings.catalog_path}\n{value.text};\n```")
        elif isinstance(value, Markdown):
            rendered[key] = dg.MetadataValue.md(value.text)
        elif isinstance(value, FilePath):
            rendered[key] = dg.MetadataValue.path(str(value.path))
        elif isinstance(value, float):
            rendered[key] = dg.MetadataValue.float(round(value, 6))
        else:
            rendered[key] = value
    return rendered


def artifact_metadata(artifact: CachedArtifact, rows: int, summary: str, settings: Settings) -> dict[str, Any]:
    """``path`` for the UI; ``path_in_warehouse`` (relative to the warehouse) for the steps that read it later."""
    return {
        **{f"meta/{k}": dg.MetadataValue.text(str(v)) for k, v in artifact.meta.items() if k != "fingerprint"},
        "path": dg.MetadataValue.path(str(artifact.path)),
        ARTIFACT_RECORD: home_record(artifact.path, settings.home),
        "fingerprint": artifact.fingerprint,
        "dagster/row_count": rows,
        "summary": summary,
    }


def staged_metadata(staged: StagedVersion, rules: int, failed: int) -> dict[str, Any]:
    manifest = staged.manifest()
    return {
        "benchmark": staged.benchmark,
        "version": staged.version,
        "new_version": staged.created,
        "path": dg.MetadataValue.path(str(staged.path)),
        "rules": rules,
        "failed_rules": failed,
        **{f"rows/{name}": int(entry["rows"]) for name, entry in manifest["tables"].items()},
    }


def published_metadata(settings: Settings, staged: StagedVersion, publication: Publication) -> dict[str, Any]:
    manifest = staged.manifest()
    return {
        "benchmark": staged.benchmark,
        "version": staged.version,
        "became_latest": publication.changed_latest,
        "published_at": publication.published_at,
        "dagster/row_count": int(manifest.get("n_examples") or 0),
        **{f"rows/{name}": int(entry["rows"]) for name, entry in manifest["tables"].items()},
        "params": dg.MetadataValue.json(manifest.get("params") or {}),
        "path": dg.MetadataValue.path(str(staged.path)),
        "catalog": dg.MetadataValue.path(str(settings.catalog_path)),
    }


def contract_evaluations(
    asset_key: dg.AssetKey, partition: str | None, tables: tuple[str, ...], results: Mapping[str, list[RuleResult]]
) -> list[dg.AssetCheckEvaluation]:
    """One blocking check per contract table, evaluated on one partition's staged version."""
    evaluations = []
    for table in tables:
        rules = results.get(table, [])
        failed = [r for r in rules if not r.passed]
        lines = ["| rule | passed | observed | expected |", "| --- | --- | --- | --- |"]
        lines += [f"| {r.rule} | {'yes' if r.passed else '**NO**'} | {r.observed} | {r.expected} |" for r in rules]
        evaluations.append(
            dg.AssetCheckEvaluation(
                asset_key=asset_key,
                check_name=f"contract_{table}",
                passed=not failed,
                partition=partition,
                blocking=True,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={
                    "rules": len(rules),
                    "failed": len(failed),
                    "results": dg.MetadataValue.md("\n".join(lines)),
                },
                description=f"{len(rules) - len(failed)}/{len(rules)} rules of data_contracts/{table}.yaml hold"
                if table in results
                else f"no {table} table in this version: nothing to check",
            )
        )
    return evaluations


def contract_check_specs(
    asset_key: dg.AssetKey, tables: tuple[str, ...], partitions: dg.PartitionsDefinition
) -> list[dg.AssetCheckSpec]:
    """One blocking check per contract table of a staged asset, evaluated per partition."""
    return [
        dg.AssetCheckSpec(
            f"contract_{table}",
            asset=asset_key,
            blocking=True,
            partitions_def=partitions,
            description=f"Blocking: the staged {table} table satisfies data_contracts/{table}.yaml.",
        )
        for table in tables
    ]
