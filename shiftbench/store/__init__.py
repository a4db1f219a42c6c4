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
and is reported naming the file (``store.log.problems``, ``shiftbench check``). Events written before the chain
existed are accepted as its unchained start.

Publishing is guarded here, whoever calls it (a Dagster asset, the CLI, a user's script): a
version becomes latest only if a passing contract check is recorded for it, computed on files
with exactly the checksums in its manifest and with the contracts in force now.

A table's content hash is of Arrow IPC bytes; the few of them a Parquet file does not keep (under NULLs, after a
bitmap's last bit) are recorded in the manifest as the table's ``layout`` (:mod:`~shiftbench.store.content`), so
that ``shiftbench check`` (:mod:`shiftbench.warehouse.audit`) can recompute every table's content hash from its rows.

Every family uses this package unchanged: it knows nothing about BREEDS or MetaShift.

:class:`Store` is one store's parts, each owning its job and its state, and each used directly:
``store.layout`` (:mod:`~shiftbench.store.layout`: where things are, the lock, the staged pointer),
``store.writer`` (:mod:`~shiftbench.store.writing`: staging a new version), ``store.checks``
(:mod:`~shiftbench.store.checks`: contract check records; :func:`damage` and :func:`verify` compare files with
their manifest), ``store.log`` (:mod:`~shiftbench.store.log`: the publication log: publish, latest, versions, and
the damage met reading it) and ``store.retention`` (:mod:`~shiftbench.store.retention`: ``gc``, retiring a
benchmark). Library code stages and publishes through :mod:`shiftbench.warehouse.publishing`, the one owner of that
path. Its checks run the data contracts (``contracts``: ODCS YAML with DuckDB rules, the shared tables' and each
registered family's).

May import: errors, runtime, tables, config.
"""

from __future__ import annotations

from pathlib import Path

from shiftbench.runtime.outputs import write_atomic
from shiftbench.store.checks import CheckRecord, VersionChecks, damage, verify
from shiftbench.store.layout import (
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
)
from shiftbench.store.log import Publication, PublicationLog, VersionInfo
from shiftbench.store.retention import Collection, Retention
from shiftbench.store.writing import STREAMED_ROW_GROUP, VersionWriter

__all__ = [
    "LOG_HEAD",
    "MAX_NAME_LENGTH",
    "REMOVED_FILE",
    "SCHEMA_VERSION",
    "STREAMED_ROW_GROUP",
    "VERSION_ID_LENGTH",
    "CheckRecord",
    "Collection",
    "Publication",
    "StagedVersion",
    "Store",
    "VersionInfo",
    "benchmark_name_problem",
    "check_benchmark_name",
    "damage",
    "verify",
    "version_id",
    "write_atomic",
]


class Store:
    """Versioned benchmark tables under one root directory: its parts, built once, each owning its state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.layout = StoreLayout(root)
        self.writer = VersionWriter(self.layout)
        self.checks = VersionChecks(self.layout)
        self.log = PublicationLog(self.layout, self.checks)
        self.retention = Retention(self.layout, self.log, self.checks)
