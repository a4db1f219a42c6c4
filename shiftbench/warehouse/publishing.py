"""Stage -> check -> publish -> refresh the catalog: the one path every version takes to become latest.

This module owns that path; every producer of versions calls it: a family's build (:func:`stage_tables`, run by
:mod:`shiftbench.families.benchmark_builds` and the Dagster shell), ERM runs, scored predictions and the papers' analyses
(:func:`stage_and_check`, :func:`publish_checked`, :func:`stage_check_publish`).

- **Stage** writes a complete, content-addressed version into the store (:mod:`shiftbench.store.writing`); staging
  never publishes.
- **Check** runs the version's contracts and records the outcome in the store, tied to the checksums of the files it
  read (:func:`check_version`).
- **Publish** asks the store's log to make the version latest; the store itself refuses any version without such a
  passing record (:meth:`shiftbench.store.log.PublicationLog.publish`), whoever calls it.
- **Refresh** rebuilds the catalog's views (:func:`refresh_catalog`): once per publication, or once per batch
  (a build of many benchmarks refreshes at its end).

A version that breaks a contract is never published (:func:`require_passing` says which rules, one line); the
previous latest stays latest.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.warehouse import cards
from shiftbench.warehouse.cards import CardInfo
from shiftbench.warehouse.catalog import CatalogRefresh, refresh_and_report
from shiftbench.store.contracts import RuleResult, check_tables, failures
from shiftbench.errors import ContractViolation
from shiftbench.config.settings import Settings
from shiftbench.store import Publication, StagedVersion, Store
from shiftbench.store import verify as verify_files
from shiftbench.store.writing import Attachments, Documents, WhileAttaching
from shiftbench.tables.streamed import StreamedTable, in_memory

Tables = Mapping[str, pl.DataFrame | StreamedTable]
Results = dict[str, list[RuleResult]]


@dataclass(frozen=True)
class PublishOutcome:
    staged: StagedVersion
    publication: Publication
    results: Results


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


# -- stage ------------------------------------------------------------------------------------------------------


def stage(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Tables,
    *,
    manifest_extra: Mapping[str, Any] | None = None,
    attachments: Attachments | None = None,
    documents: Documents | None = None,
    while_attaching: WhileAttaching | None = None,
    consume: bool = False,
) -> StagedVersion:
    """Write a complete version into the settings' store (or find the identical one there); never publishes.

    The options are :meth:`shiftbench.store.writing.VersionWriter.stage`'s."""
    return Store(settings.store_dir).writer.stage(
        family,
        benchmark,
        tables,
        manifest_extra=manifest_extra,
        attachments=attachments,
        documents=documents,
        while_attaching=while_attaching,
        consume=consume,
    )


def stage_tables(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Tables,
    *,
    spec: str,
    origin: Mapping[str, Any],
    code_version: str,
    images: Mapping[str, Any] | None,
    attachments: Attachments | None = None,
    warnings: Sequence[str] = (),
    card: CardInfo | None = None,
    consume: bool = False,
    check: Callable[[Mapping[str, Path]], None] | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
) -> StagedVersion:
    """Stage a benchmark's version with the manifest every family writes (params, sources, images, environment),
    and its shift card and Croissant file (:mod:`shiftbench.warehouse.cards`) when ``card`` is given. ``manifest_extra`` adds
    a family's own manifest entries (a MetaShift conflicts task's ``subsets``); like the manifest, not in the id.

    With ``consume`` (``tables`` a dict the caller no longer reads), the store empties ``tables`` as it takes each
    table; the card then reads what it needs of them, kept aside here (:func:`_for_card`). ``check`` runs on the
    new version's table files while its figures are drawn (:func:`shiftbench.families.benchmark_builds.stage_benchmark`)."""
    row = in_memory(tables["benchmarks"]).row(0, named=True)
    manifest = {
        "spec": spec,
        "params": json.loads(row["params"]),
        "sources": json.loads(row["sources"]),
        "n_examples": row["n_examples"],
        "origin": dict(origin),
        "code_version": code_version,
        "environment": environment(),
        "images": dict(images) if images is not None else None,
        "warnings": list(warnings),
        "family": family,
        **dict(manifest_extra or {}),
    }

    described = _for_card(tables) if consume else tables

    def documents(version: str, files: Mapping[str, Mapping[str, Any]], figures: list[str]) -> dict[str, bytes]:
        assert card is not None
        return cards.documents(cards.Version(benchmark, version, manifest, described, files, figures, card))

    return stage(
        settings,
        family,
        benchmark,
        tables,
        manifest_extra=manifest,
        attachments=attachments,
        documents=documents if card is not None else None,
        while_attaching=check,
        consume=consume,
    )


def _for_card(tables: Tables) -> dict[str, pl.DataFrame | StreamedTable]:
    """What a card reads of a version's tables (:func:`cards.documents`): every table's schema, the rows of
    ``examples`` and ``shift_magnitudes`` only."""
    return {
        name: (
            table
            if name in cards.TABLES_READ or isinstance(table, StreamedTable)  # streamed: made when read, not held
            else pl.DataFrame(schema=table.schema)
        )
        for name, table in tables.items()
    }


# -- check ------------------------------------------------------------------------------------------------------


def check_staged(staged: StagedVersion, only: list[str] | None = None) -> Results:
    """Run the contracts of a version's tables (nothing recorded; see :func:`check_version`)."""
    return check_files({t: staged.table_path(t) for t in staged.tables}, only)


def check_files(tables: Mapping[str, Path], only: list[str] | None = None) -> Results:
    """Run the contracts of a version's table files, named by table (nothing recorded)."""
    return check_tables(tables, only)


def check_version(store: Store, staged: StagedVersion, *, reuse: bool = True, verify: bool = True) -> Results:
    """Run every contract of the version and record the outcome: what publishing requires.

    The files are first verified against the manifest's checksums (``verify=False`` only right after staging,
    which just wrote or verified them). With ``reuse``, a recorded passing check of exactly these files under
    today's contracts is returned instead of running the rules again.
    """
    if verify:
        verify_files(staged)
    record = store.checks.valid_check(staged) if reuse else None
    if record is not None:
        return {table: [RuleResult(**rule) for rule in rules] for table, rules in record.results.items()}
    return record_results(store, staged, check_staged(staged))


def check_just_staged(settings: Settings, staged: StagedVersion, ran: Results | None = None) -> Results:
    """Record the contract check of a version staging just wrote or verified: the rules ``ran`` on its files while
    its figures were drawn (``Target.check``), or, for a version that was already there, run now."""
    store = Store(settings.store_dir)
    if staged.created and ran is not None:
        return record_results(store, staged, ran)
    return check_version(store, staged, verify=False)  # staging just verified the files


def record_results(store: Store, staged: StagedVersion, results: Results) -> Results:
    """Record the outcome of every contract of the version (run on exactly its files), as :func:`check_version` does."""
    failed = failures(results)
    store.checks.record_check(
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


def require_passing(staged: StagedVersion, results: Mapping[str, list[RuleResult]]) -> None:
    """Refuse (one line naming the rules) a version whose contract check failed: it is not published."""
    if failures(results):
        raise ContractViolation(f"{staged.benchmark} breaks its contracts, not published: {describe_failures(results)}")


def stage_and_check(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Tables,
    *,
    manifest_extra: Mapping[str, Any],
    attachments: Attachments | None = None,
    documents: Documents | None = None,
) -> tuple[StagedVersion, Results]:
    """Stage a version and record its contract check (not published): a result's first two steps."""
    store = Store(settings.store_dir)
    staged = store.writer.stage(
        family, benchmark, tables, manifest_extra=manifest_extra, attachments=attachments, documents=documents
    )
    return staged, check_version(store, staged)


# -- publish and refresh ----------------------------------------------------------------------------------------


def publish(settings: Settings, staged: StagedVersion) -> Publication:
    """Make a checked version latest (the store refuses an unchecked one); the catalog is the caller's to refresh
    (a build of many benchmarks refreshes once, at its end)."""
    return Store(settings.store_dir).log.publish(staged)


def refresh_catalog(settings: Settings) -> CatalogRefresh:
    """Rebuild the catalog's views over what is published now (a failure is said, never raised: the store is the
    truth, and ``shiftbench catalog`` rebuilds them)."""
    return refresh_and_report(settings.catalog_path, settings.store_dir)


def publish_staged(settings: Settings, staged: StagedVersion) -> Publication:
    """Publish a checked version and refresh the catalog (the store refuses an unchecked one)."""
    publication = publish(settings, staged)
    refresh_catalog(settings)
    return publication


def publish_checked(settings: Settings, staged: StagedVersion, results: Results) -> PublishOutcome:
    """Publish a staged version whose recorded check passed, and refresh the catalog; one line naming the broken
    rules (:class:`ContractViolation`) and nothing published otherwise."""
    require_passing(staged, results)
    return PublishOutcome(staged, publish_staged(settings, staged), results)


def stage_check_publish(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Tables,
    manifest_extra: Mapping[str, Any],
    *,
    attachments: Attachments | None = None,
    documents: Documents | None = None,
) -> PublishOutcome:
    """Stage, check and publish a version in one call, only if every contract holds; otherwise raise and publish
    nothing."""
    staged, results = stage_and_check(
        settings, family, benchmark, tables, manifest_extra=manifest_extra, attachments=attachments, documents=documents
    )
    return publish_checked(settings, staged, results)
