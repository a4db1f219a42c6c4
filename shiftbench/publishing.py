"""Check contracts -> publish -> refresh the catalog: the path every version takes to become latest.

:func:`check_version` runs a version's contracts and records the outcome in the store, tied to the
checksums of the files it read; :meth:`Store.publish` refuses any version without such a passing
record. :func:`stage_check_publish` does all three steps in one call for library users and tests;
the Dagster shell and :mod:`shiftbench.building` run them as separate steps.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.catalog import refresh_and_report
from shiftbench.contracts import RuleResult, check_tables, failures
from shiftbench.errors import ContractViolation
from shiftbench.settings import Settings
from shiftbench.store import Publication, StagedVersion, Store


@dataclass(frozen=True)
class PublishOutcome:
    staged: StagedVersion
    publication: Publication
    results: dict[str, list[RuleResult]]


def environment() -> dict[str, str]:
    """Library versions recorded in every manifest, to explain a changed version id later."""
    packages = ("shiftbench", "polars", "pyarrow", "duckdb", "numpy", "networkx", "nltk")
    versions = {"python": platform.python_version()}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def check_staged(staged: StagedVersion, only: list[str] | None = None) -> dict[str, list[RuleResult]]:
    """Run the contracts of a version's tables (nothing recorded; see :func:`check_version`)."""
    return check_files({t: staged.table_path(t) for t in staged.tables}, only)


def check_files(tables: Mapping[str, Path], only: list[str] | None = None) -> dict[str, list[RuleResult]]:
    """Run the contracts of a version's table files, named by table (nothing recorded)."""
    return check_tables(tables, only)


def check_version(
    store: Store, staged: StagedVersion, *, reuse: bool = True, verify: bool = True
) -> dict[str, list[RuleResult]]:
    """Run every contract of the version and record the outcome: what publishing requires.

    The files are first verified against the manifest's checksums (``verify=False`` only right after
    ``Store.stage``, which just wrote or verified them). With ``reuse``, a recorded passing check of
    exactly these files under today's contracts is returned instead of running the rules again.
    """
    if verify:
        store.verify(staged)
    record = store.valid_check(staged) if reuse else None
    if record is not None:
        return {table: [RuleResult(**rule) for rule in rules] for table, rules in record.results.items()}
    return record_results(store, staged, check_staged(staged))


def record_results(
    store: Store, staged: StagedVersion, results: dict[str, list[RuleResult]]
) -> dict[str, list[RuleResult]]:
    """Record the outcome of every contract of the version (run on exactly its files), as :func:`check_version` does."""
    failed = failures(results)
    store.record_check(
        staged,
        passed=not failed,
        rules=sum(len(r) for r in results.values()),
        failed=[r.line() for r in failed],
        results={table: [_rule_record(r) for r in rules] for table, rules in results.items()},
    )
    return results


def _rule_record(rule: RuleResult) -> dict[str, Any]:
    plain = rule.observed is None or isinstance(rule.observed, int | float | str | bool)
    return {**asdict(rule), "observed": rule.observed if plain else str(rule.observed)}


def describe_failures(results: Mapping[str, list[RuleResult]]) -> str:
    return "; ".join(r.line() for r in failures(results))


def publish_staged(settings: Settings, staged: StagedVersion) -> Publication:
    """Publish a checked version and refresh the catalog (the store refuses an unchecked one)."""
    publication = Store(settings.store_dir).publish(staged)
    refresh_and_report(settings.catalog_path, settings.store_dir)
    return publication


def stage_check_publish(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Mapping[str, pl.DataFrame],
    manifest_extra: Mapping[str, Any],
) -> PublishOutcome:
    """Publish a version only if every contract holds; otherwise raise and publish nothing."""
    staged = Store(settings.store_dir).stage(family, benchmark, tables, manifest_extra=manifest_extra)
    return check_and_publish(settings, staged)


def check_and_publish(settings: Settings, staged: StagedVersion) -> PublishOutcome:
    """Check a staged version, record the check, and publish it only if every contract holds."""
    results = check_version(Store(settings.store_dir), staged)
    if failures(results):
        raise ContractViolation(
            f"{staged.benchmark} version {staged.version} breaks its contracts, not published: "
            f"{describe_failures(results)}"
        )
    return PublishOutcome(staged, publish_staged(settings, staged), results)
