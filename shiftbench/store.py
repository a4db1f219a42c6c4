"""The versioned store: content-addressed, immutable benchmark versions with atomic publish.

Layout under ``$SHIFTBENCH_HOME/store``::

    <family>/<benchmark>/versions/<version>/   immutable: <table>.parquet ..., manifest.json
    <family>/<benchmark>/checks/<version>.json   the contract check of exactly those files
    <family>/<benchmark>/staged.json             the version staged last (what "publish" publishes)
    <family>/<benchmark>/publications/<ns>-<version>.json   one file per publish event, chained (below)
    <family>/<benchmark>/publications/HEAD       the newest event: its sequence number and hash
    <family>/<benchmark>/removed.json            versions ``gc`` deleted (their events stay in the log)
    .staging/                                    builds in progress (never visible)

A version id is a hash of the published content (tables without their ``version`` column,
which includes the ``benchmarks`` row with params and input fingerprints). Staging writes a
complete version directory in ``.staging`` and renames it into place, which is atomic on one
filesystem; a version only becomes *latest* when a publication event is written (again by an
atomic rename) after the contracts passed. So a build killed at any point leaves either no
trace or an unpublished, invisible version, and the previous latest stays latest. Rebuilding
identical content finds the version already there and writes no data file.

The publication log is a chain, as lakehouse logs are: each event carries its sequence number and the
SHA-256 of the event before it, and ``HEAD`` records the newest. A missing, truncated, edited or forged
event (or a removed newest one, which would silently make an older version latest again) breaks the chain
and is reported naming the file (:meth:`Store.publications`, ``shiftbench check``). Events written before
the chain existed are accepted as its unchained start.

Publishing is guarded here, whoever calls it (a Dagster asset, the CLI, a user's script): a
version becomes latest only if a passing contract check is recorded for it, computed on files
with exactly the checksums in its manifest and with the contracts in force now.

A table's content hash is of Arrow IPC bytes; the few of them a Parquet file does not keep (under NULLs, after a
bitmap's last bit) are recorded in the manifest as the table's ``layout`` (:mod:`~shiftbench.store_content`), so
that ``shiftbench check`` (:mod:`shiftbench.store_audit`) can recompute every table's content hash from its rows.

Every family uses this module unchanged: it knows nothing about BREEDS or MetaShift.

:class:`Store` is the one face of the store; its work is done in rooms, each readable at once:
:mod:`~shiftbench.store_layout` (where things are, the lock, the staged pointer),
:mod:`~shiftbench.store_writing` (staging a new version), :mod:`~shiftbench.store_checks` (files against
their manifest, contract check records), :mod:`~shiftbench.store_publications` (the publication log: publish,
latest, versions) and :mod:`~shiftbench.store_retention` (``gc``, retiring a benchmark).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.contracts import contracts_fingerprint
from shiftbench.store_checks import CheckRecord, VersionChecks, damage, verify
from shiftbench.store_layout import (
    LOG_HEAD,
    MAX_NAME_LENGTH,
    REMOVED_FILE,
    SCHEMA_VERSION,
    VERSION_ID_LENGTH,
    StagedVersion,
    StoreLayout,
    benchmark_name_problem,
    check_benchmark_name,
    version_id,
    write_atomic,
)
from shiftbench.store_publications import Publication, PublicationLog, VersionInfo
from shiftbench.store_retention import Retention
from shiftbench.store_writing import (
    STREAMED_ROW_GROUP,
    Attachments,
    Documents,
    VersionWriter,
    WhileAttaching,
    write_table,
)
from shiftbench.streamed import StreamedTable

__all__ = [
    "LOG_HEAD",
    "MAX_NAME_LENGTH",
    "REMOVED_FILE",
    "SCHEMA_VERSION",
    "STREAMED_ROW_GROUP",
    "VERSION_ID_LENGTH",
    "CheckRecord",
    "Publication",
    "StagedVersion",
    "Store",
    "VersionInfo",
    "benchmark_name_problem",
    "check_benchmark_name",
    "contracts_fingerprint",
    "version_id",
    "write_atomic",
]


# The rooms reach these two through this module's names at each call, as when they were all one class here:
# replacing ``shiftbench.store.write_atomic`` or ``.contracts_fingerprint`` (a test killing a publish midway, or
# changing the contracts in force) reaches every room.
def _write_atomic(path: Path, data: str | bytes) -> None:
    write_atomic(path, data)


def _contracts_now(tables: list[str]) -> str:
    return contracts_fingerprint(tables)


class Store:
    """Versioned benchmark tables under one root directory."""

    # Writes one in-memory table's Parquet file; looked up at each stage (a test replaces it to kill a build).
    _write_table = staticmethod(write_table)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: set[str] = set()  # damage met while reading (damaged files are skipped, not fatal)
        self.layout = StoreLayout(root, write=_write_atomic)
        self.checks = VersionChecks(self.layout, contracts=_contracts_now)
        self.log = PublicationLog(self.layout, self.checks, self.problems)
        self.retention = Retention(self.layout, self.log, self.checks)

    # -- layout ---------------------------------------------------------------------------
    def benchmark_dir(self, family: str, benchmark: str) -> Path:
        return self.layout.benchmark_dir(family, benchmark)

    def version_dir(self, family: str, benchmark: str, version: str) -> Path:
        return self.layout.version_dir(family, benchmark, version)

    @property
    def staging_dir(self) -> Path:
        return self.layout.staging_dir

    def family_of(self, benchmark: str) -> str | None:
        return self.layout.family_of(benchmark)

    def staged(self, family: str, benchmark: str, version: str) -> StagedVersion:
        return self.layout.staged(family, benchmark, version)

    def latest_staged(self, family: str, benchmark: str) -> StagedVersion | None:
        """The version staged last (checked or not), if it is still in the store."""
        return self.layout.latest_staged(family, benchmark)

    # -- writing ----------------------------------------------------------------------------
    def stage(
        self,
        family: str,
        benchmark: str,
        tables: Mapping[str, pl.DataFrame | StreamedTable],
        *,
        manifest_extra: Mapping[str, Any] | None = None,
        attachments: Attachments | None = None,
        documents: Documents | None = None,
        while_attaching: WhileAttaching | None = None,
        consume: bool = False,
    ) -> StagedVersion:
        """Write a complete version (or find the identical one already there); never publishes.

        ``tables`` are given without ``version`` (and may omit ``benchmark``); both columns
        are added here, first in column order. Rows are sorted so the bytes are deterministic.
        ``attachments`` (e.g. figures) are written under ``files/`` and listed in the manifest
        with their checksums; they are derived views and do not enter the version id. Given as a
        function, they are only made when the version is new (figures cost more than tables).
        ``documents(version, files, attachment names)`` makes files that describe the version (a
        card): they are written under ``files/`` too, once the tables' files and checksums exist.
        ``while_attaching(table files)`` runs once the tables of a new version are written if its attachments are
        still being made then (the contract check: it reads only the tables, and figures take about as long).
        With ``consume`` (``tables`` a dict), each table is taken out of ``tables`` once its canonical copy exists:
        a large build's frames are not held twice while the version is hashed, written and checked.
        """
        writer = VersionWriter(self.layout, write_table=self._write_table)
        return writer.stage(
            family,
            benchmark,
            tables,
            manifest_extra=manifest_extra,
            attachments=attachments,
            documents=documents,
            while_attaching=while_attaching,
            consume=consume,
        )

    # -- checks -------------------------------------------------------------------------------
    def record_check(
        self,
        staged: StagedVersion,
        passed: bool,
        rules: int,
        failed: list[str],
        results: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> CheckRecord:
        """Record the outcome of the version's contract checks (:meth:`VersionChecks.record_check`)."""
        return self.checks.record_check(staged, passed, rules, failed, results)

    def check_record(self, staged: StagedVersion) -> CheckRecord | None:
        return self.checks.check_record(staged)

    def valid_check(self, staged: StagedVersion) -> CheckRecord | None:
        """The recorded *passing* check if it still describes exactly these files under today's contracts."""
        return self.checks.valid_check(staged)

    def verify(self, staged: StagedVersion) -> None:
        """Check every file against the manifest's checksums before it can be published."""
        verify(staged)

    def damage(self, staged: StagedVersion, *, checksums: bool = True) -> str | None:
        """What is wrong with a version's files (naming the file), or None when they match the manifest."""
        return damage(staged, checksums=checksums)

    # -- publications -------------------------------------------------------------------------
    def publish(self, staged: StagedVersion) -> Publication:
        """Make a checked version the latest of its benchmark (no-op when it already is).

        Raises :class:`ContractViolation` unless a passing check of exactly these files is recorded.
        """
        return self.log.publish(staged)

    def publications(self, family: str, benchmark: str) -> list[dict[str, Any]]:
        """The readable publication events, oldest first (damage and breaks in the chain: :attr:`problems`)."""
        return self.log.events(family, benchmark)

    def removed_versions(self, family: str, benchmark: str) -> set[str]:
        """Versions ``gc`` deleted: their events stay in the log, and they are no longer listed."""
        return self.log.removed_versions(family, benchmark)

    def latest(self, benchmark: str, family: str | None = None) -> VersionInfo | None:
        return self.log.latest(benchmark, family)

    def versions(self, benchmark: str | None = None) -> list[VersionInfo]:
        """Published versions (first publication of each), oldest first per benchmark."""
        return self.log.versions(benchmark)

    # -- retention ----------------------------------------------------------------------------
    def garbage_collect(self, keep: int = 1, dry_run: bool = False) -> list[Path]:
        """Remove versions older than the ``keep`` most recent published ones, and unpublished ones
        (:meth:`Retention.garbage_collect <shiftbench.store_retention.Retention.garbage_collect>` says which stay);
        why a benchmark kept everything goes to :attr:`problems`.
        """
        collection = self.retention.garbage_collect(keep, dry_run)
        self.problems.update(collection.kept)
        return collection.removed

    def retire(self, family: str, benchmark: str) -> Path:
        """Move a whole benchmark aside (``.retired/``): every view stops showing it, nothing is deleted."""
        return self.retention.retire(family, benchmark)
