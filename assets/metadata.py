"""Materialization metadata and contract check results, in the same shape for every family."""

import dagster as dg
import polars as pl

from shiftbench.cache import CachedArtifact
from shiftbench.contracts import RuleResult, failures


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
