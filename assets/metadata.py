"""Materialization metadata and contract check results, in the same shape for every family."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import polars as pl
from pydantic import Field

from shiftbench.cache import CachedArtifact
from shiftbench.contracts import RuleResult, failures
from shiftbench.publishing import check_staged, publish_staged
from shiftbench.settings import Settings
from shiftbench.store import StagedVersion


def artifact_output(artifact: CachedArtifact, rows: int) -> dg.Output[CachedArtifact]:
    return dg.Output(
        artifact,
        data_version=dg.DataVersion(artifact.fingerprint),
        metadata={
            "path": dg.MetadataValue.path(str(artifact.path)),
            "fingerprint": artifact.fingerprint,
            "dagster/row_count": rows,
            **{k: dg.MetadataValue.text(str(v)) for k, v in artifact.meta.items() if k != "fingerprint"},
        },
    )


def contract_check_result(table: str, results: list[RuleResult]) -> dg.AssetCheckResult:
    """One blocking check per contract: a failure stops the run before the publishing asset."""
    failed = failures({table: results})
    lines = ["| rule | passed | observed | expected |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.rule} | {'yes' if r.passed else '**NO**'} | {r.observed} | {r.expected} |" for r in results]
    return dg.AssetCheckResult(
        check_name=f"contract_{table}",
        passed=not failed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "rules": len(results),
            "failed": len(failed),
            "results": dg.MetadataValue.md("\n".join(lines)),
        },
        description=f"{len(results) - len(failed)}/{len(results)} rules of data_contracts/{table}.yaml hold",
    )


def metadata_table(frame: pl.DataFrame) -> dg.TableMetadataValue:
    """A metadata table: the UI renders it inline (markdown over 1,000 characters is folded)."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(name, "int" if dtype.is_integer() else "string") for name, dtype in frame.schema.items()
        ]
    )
    return dg.MetadataValue.table(records=[dg.TableRecord(row) for row in frame.to_dicts()], schema=schema)


def contract_check_specs(asset_key: list[str], tables: tuple[str, ...]) -> list[dg.AssetCheckSpec]:
    """Blocking checks yielded by a staging asset itself (one per contract it must satisfy)."""
    return [
        dg.AssetCheckSpec(
            f"contract_{table}",
            asset=dg.AssetKey(asset_key),
            blocking=True,
            description=f"Blocking: the staged {table} table satisfies data_contracts/{table}.yaml.",
        )
        for table in tables
    ]


def staged_with_checks(
    context: dg.AssetExecutionContext, staged: StagedVersion, tables: tuple[str, ...]
) -> Iterator[dg.Output[StagedVersion] | dg.AssetCheckResult]:
    """The staged version as the asset's output, then one blocking check result per contract."""
    rows = {name: entry["rows"] for name, entry in staged.manifest()["tables"].items()}
    context.log.info(
        "staged %s version %s (%s)", staged.benchmark, staged.version, "new" if staged.created else "unchanged"
    )
    yield dg.Output(
        staged,
        data_version=dg.DataVersion(staged.version),
        metadata={
            "benchmark": staged.benchmark,
            "version": staged.version,
            "new_version": staged.created,
            "path": dg.MetadataValue.path(str(staged.path)),
            **{f"rows/{name}": n for name, n in rows.items()},
        },
    )
    results = check_staged(staged, only=list(tables))
    for table in tables:
        yield contract_check_result(table, results[table])


def publish_with_metadata(settings: Settings, staged: StagedVersion, query: str) -> dict[str, Any]:
    """Publish the staged version and describe it: ids, row counts, params, paths and a catalog query."""
    publication = publish_staged(settings, staged)
    manifest = staged.manifest()
    return {
        "benchmark": staged.benchmark,
        "version": staged.version,
        "became_latest": publication.changed_latest,
        "published_at": publication.published_at,
        "dagster/row_count": int(manifest["n_examples"]),
        **{f"rows/{name}": int(entry["rows"]) for name, entry in manifest["tables"].items()},
        "params": dg.MetadataValue.json(manifest["params"]),
        "path": dg.MetadataValue.path(str(staged.path)),
        "catalog": dg.MetadataValue.path(str(settings.catalog_path)),
        "duckdb_query": dg.MetadataValue.md(f"```sql\n-- duckdb {settings.catalog_path}\n{query};\n```"),
    }


class OverridesConfig(dg.Config):
    """Overrides of spec parameters (recorded in benchmarks.params) and an optional new name.

    Values are YAML scalars as text, so one config serves every parameter of a family's specs.
    """

    overrides: dict[str, str] = Field(
        default_factory=dict,
        description="KEY: VALUE overrides as YAML scalars (e.g. edge_threshold: '0.2', allow_scale_down: 'true').",
    )
    publish_as: str | None = Field(default=None, description="Publish as a new benchmark of this name.")

    def parsed(self) -> dict[str, object]:
        from shiftbench.breeds.specs import parse_override_value

        return {key: parse_override_value(value) for key, value in self.overrides.items()}
