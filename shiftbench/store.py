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

Every family uses this module unchanged: it knows nothing about BREEDS or MetaShift.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from shiftbench.contracts import contracts_fingerprint
from shiftbench.errors import ContractViolation, InputError, StoreError
from shiftbench.fingerprint import (
    canonical_json,
    sha256_file,
    sha256_json,
    sha256_streamed,
    sha256_table,
    sort_keys,
)
from shiftbench.memory import release_freed_memory
from shiftbench.streamed import StreamedTable, constant_strings, prefetched

SCHEMA_VERSION = 1
VERSION_ID_LENGTH = 16
_STALE_STAGING_S = 24 * 3600
# An unpublished version younger than this may still be waiting for its checks: gc keeps it.
_PENDING_GRACE_S = 3600
# '@' only appears in names shiftbench gives (NAME@TAG, shiftbench.naming); specs and --name refuse it.
_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-_.@")
MAX_NAME_LENGTH = 100  # names become directories (and parts of run names): keep them well under NAME_MAX
# Rows per Parquet row group of a streamed table (at GQA scale 100 row groups of distances): 8x smaller batches
# than the fingerprint's keep the write pass's memory small, and readers prune sorted row groups finer.
STREAMED_ROW_GROUP = 1 << 18


def benchmark_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a benchmark (it becomes a directory of the store), or None."""
    if not name or not set(name) <= _NAME_OK or name.startswith((".", "-")):
        return f"invalid benchmark name {name!r}: use lower-case letters, digits, '-', '_' and '.'"
    if len(name) > MAX_NAME_LENGTH:
        return f"a benchmark name has at most {MAX_NAME_LENGTH} characters, got {len(name)}"
    return None


def check_benchmark_name(name: str, parameter: str = "benchmark") -> str:
    problem = benchmark_name_problem(name)
    if problem is not None:
        raise InputError(problem, parameter=parameter)
    return name


@dataclass(frozen=True)
class StagedVersion:
    """A complete version on disk, not necessarily published."""

    family: str
    benchmark: str
    version: str
    path: Path
    created: bool  # False when identical content was already in the store

    def table_path(self, table: str) -> Path:
        return self.path / f"{table}.parquet"

    @property
    def tables(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.parquet"))

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / "manifest.json").read_text("utf-8"))
        return data

    def attachment(self, name: str) -> bytes | None:
        """An attached file (a figure), or None when the version has none of that name."""
        entry = self.manifest().get("attachments", {}).get(name)
        return (self.path / entry["file"]).read_bytes() if entry else None


@dataclass(frozen=True)
class CheckRecord:
    """The outcome of a version's contract checks, tied to the files and contracts checked."""

    version: str
    passed: bool
    files: dict[str, str]  # table -> sha256 of the Parquet file that was checked
    contracts: str  # fingerprint of the contracts applied
    rules: int
    failed: list[str]  # "table.rule: observed X, expected Y"
    checked_at: str
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # table -> every rule's outcome


@dataclass(frozen=True)
class Publication:
    family: str
    benchmark: str
    version: str
    published_at: str
    changed_latest: bool


@dataclass(frozen=True)
class VersionInfo:
    family: str
    benchmark: str
    version: str
    published_at: str
    is_latest: bool
    n_examples: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)


def version_id(family: str, benchmark: str, table_hashes: Mapping[str, str]) -> str:
    identity = {
        "schema_version": SCHEMA_VERSION,
        "family": family,
        "benchmark": benchmark,
        "tables": table_hashes,
    }
    return sha256_json(identity)[:VERSION_ID_LENGTH]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write through a uniquely named temporary sibling, then rename: readers see all or nothing."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


class Store:
    """Versioned benchmark tables under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: set[str] = set()  # damage met while reading (damaged files are skipped, not fatal)

    # -- layout ---------------------------------------------------------------------------
    def benchmark_dir(self, family: str, benchmark: str) -> Path:
        return self.root / family / benchmark

    def version_dir(self, family: str, benchmark: str, version: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "versions" / version

    @property
    def staging_dir(self) -> Path:
        return self.root / ".staging"

    def _lock(self, family: str, benchmark: str) -> FileLock:
        """One writer per benchmark (stage, publish, check records, gc), across processes."""
        directory = self.benchmark_dir(family, benchmark)
        directory.mkdir(parents=True, exist_ok=True)
        return FileLock(directory / ".lock")

    def family_of(self, benchmark: str) -> str | None:
        if not self.root.is_dir():
            return None
        for family_dir in sorted(self.root.iterdir()):
            if not family_dir.name.startswith(".") and (family_dir / benchmark).is_dir():
                return family_dir.name
        return None

    def retire(self, family: str, benchmark: str) -> Path:
        """Move a whole benchmark aside (``.retired/``): every view stops showing it, nothing is deleted.

        For a benchmark whose name it should never have had (``shiftbench.naming``); under its lock.
        """
        source = self.benchmark_dir(family, benchmark)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        target = self.root / ".retired" / family / f"{benchmark}-{stamp}-{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(family, benchmark):
            source.rename(target)
        return target

    # -- writing ----------------------------------------------------------------------------
    def stage(
        self,
        family: str,
        benchmark: str,
        tables: Mapping[str, pl.DataFrame | StreamedTable],
        *,
        manifest_extra: Mapping[str, Any] | None = None,
        attachments: Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None = None,
        documents: Callable[[str, Mapping[str, Mapping[str, Any]], list[str]], Mapping[str, bytes]] | None = None,
        while_attaching: Callable[[Mapping[str, Path]], None] | None = None,
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
        check_benchmark_name(benchmark)
        other = self.family_of(benchmark)
        if other is not None and other != family:
            raise InputError(f"benchmark {benchmark!r} already belongs to family {other!r}", parameter="name")
        prepared: dict[str, pl.DataFrame | StreamedTable] = {}
        hashes = {}
        for name in sorted(tables):
            # Each table is put in canonical order when its turn comes (not all first): a sorted copy of a large
            # frame does not wait in memory while a large streamed table is hashed.
            table = tables.pop(name) if consume and isinstance(tables, dict) else tables[name]
            frame = prepared[name] = self._canonical(table, benchmark)
            del table
            # sha256_table sorts the canonical frame again: the same rows, but bitmaps rebuilt the way every id so far
            # was hashed (their unused bits enter the bytes; see SceneTables.from_frames)
            hashes[name] = sha256_streamed(frame) if isinstance(frame, StreamedTable) else sha256_table(frame)
            release_freed_memory()  # a large table's batches, before the next table's
        version = version_id(family, benchmark, hashes)
        final = self.version_dir(family, benchmark, version)
        if (final / "manifest.json").exists():
            existing = StagedVersion(family, benchmark, version, final, created=False)
            if self.damage(existing) is None:
                return self._mark_staged(existing)
            with self._lock(family, benchmark):  # damaged: the rebuild writes the same content again
                self._set_aside(final)

        self._clean_stale_staging()
        staging = self.staging_dir / f"{benchmark}-{version}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        # Figures are drawn on a worker thread while the tables are written (writing Parquet releases the GIL).
        drawing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shiftbench-attachments")
        drawn = drawing.submit(attachments) if callable(attachments) else None
        given: Mapping[str, bytes] = {} if attachments is None or callable(attachments) else attachments
        try:
            files: dict[str, Any] = {}
            for name in list(prepared):
                frame = prepared.pop(name)  # each canonical copy is let go once written, before the checks run
                path = staging / f"{name}.parquet"
                if isinstance(frame, StreamedTable):
                    self._write_streamed(frame, version, path)
                else:
                    self._write_table(self._with_version(frame, version), path)
                rows = frame.height
                del frame
                release_freed_memory()
                files[name] = {
                    "file": path.name,
                    "bytes": path.stat().st_size,
                    "rows": rows,
                    "sha256": sha256_file(path),
                    "content_sha256": hashes[name],
                }
            if while_attaching is not None and drawn is not None and not drawn.done():
                # Only with figures still to wait for: otherwise the caller's tables, alive until stage returns,
                # would add to the check's memory for nothing (GQA-scale objects: 2.29 GiB instead of 1.89).
                while_attaching({name: staging / entry["file"] for name, entry in files.items()})
            attached = {}
            made = dict(drawn.result() if drawn is not None else given)
            if documents is not None:
                made.update(documents(version, files, sorted(made)))
            for name, payload in sorted(made.items()):
                target = staging / "files" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(payload)
                attached[name] = {"file": f"files/{name}", "sha256": hashlib.sha256(payload).hexdigest()}
            manifest = {
                "schema_version": SCHEMA_VERSION,
                "family": family,
                "benchmark": benchmark,
                "version": version,
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "tables": files,
                **({"attachments": attached} if attached else {}),
                **dict(manifest_extra or {}),
            }
            # The manifest is written last: a directory without one is incomplete by definition.
            write_atomic(staging / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))
            _fsync_dir(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                staging.rename(final)
            except OSError:
                if (final / "manifest.json").exists():  # a concurrent identical build won the race
                    shutil.rmtree(staging, ignore_errors=True)
                    return self._mark_staged(StagedVersion(family, benchmark, version, final, created=False))
                if final.exists():  # leftover without a manifest: never visible, safe to replace
                    shutil.rmtree(final)
                    staging.rename(final)
                else:
                    raise
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            drawing.shutdown(wait=True, cancel_futures=True)
        return self._mark_staged(StagedVersion(family, benchmark, version, final, created=True))

    def _mark_staged(self, staged: StagedVersion) -> StagedVersion:
        """Remember the version staged last: publishing a benchmark without naming a version publishes it."""
        event = {"version": staged.version, "staged_at": datetime.now(UTC).isoformat(timespec="microseconds")}
        with self._lock(staged.family, staged.benchmark):
            write_atomic(self.benchmark_dir(staged.family, staged.benchmark) / "staged.json", canonical_json(event))
        return staged

    def latest_staged(self, family: str, benchmark: str) -> StagedVersion | None:
        """The version staged last (checked or not), if it is still in the store."""
        pointer = self.benchmark_dir(family, benchmark) / "staged.json"
        if not pointer.is_file():
            return None
        version = str(json.loads(pointer.read_text("utf-8"))["version"])
        path = self.version_dir(family, benchmark, version)
        return StagedVersion(family, benchmark, version, path, created=False) if path.is_dir() else None

    # -- checks -------------------------------------------------------------------------------
    def _check_path(self, staged: StagedVersion) -> Path:
        return self.benchmark_dir(staged.family, staged.benchmark) / "checks" / f"{staged.version}.json"

    def record_check(
        self,
        staged: StagedVersion,
        passed: bool,
        rules: int,
        failed: list[str],
        results: Mapping[str, list[dict[str, Any]]] | None = None,
    ) -> CheckRecord:
        """Record the outcome of the version's contract checks with the checksums of the files checked.

        Call right after :meth:`verify` (``check_version`` does): the checksums recorded are the
        manifest's, which the files on disk were just shown to match.
        """
        manifest = staged.manifest()
        record = CheckRecord(
            version=staged.version,
            passed=passed,
            files={name: entry["sha256"] for name, entry in sorted(manifest["tables"].items())},
            contracts=contracts_fingerprint(sorted(manifest["tables"])),
            rules=rules,
            failed=failed,
            checked_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            results=dict(results or {}),
        )
        path = self._check_path(staged)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock(staged.family, staged.benchmark):  # never between a publish's check and its event
            write_atomic(path, json.dumps(asdict(record), indent=2, sort_keys=True))
        return record

    def check_record(self, staged: StagedVersion) -> CheckRecord | None:
        path = self._check_path(staged)
        if not path.is_file():
            return None
        return CheckRecord(**json.loads(path.read_text("utf-8")))

    def valid_check(self, staged: StagedVersion) -> CheckRecord | None:
        """The recorded *passing* check if it still describes exactly these files under today's contracts.

        Call after :meth:`verify` (which re-hashes the files against the manifest). A failed check is
        never reused: checking again costs little and says the same unless something changed.
        """
        record = self.check_record(staged)
        if record is None or not record.results or _record_problem(record, staged) is not None:
            return None
        return record

    def _require_passing_check(self, staged: StagedVersion) -> None:
        """Refuse a version that has no passing check of exactly these files under today's contracts."""
        record = self.check_record(staged)
        name = f"{staged.benchmark} version {staged.version}"
        if record is None:
            raise ContractViolation(f"{name} has not been checked against its contracts: not published")
        problem = _record_problem(record, staged)
        if problem is not None:
            raise ContractViolation(f"{name} {problem}: not published")

    @staticmethod
    def _canonical(frame: pl.DataFrame | StreamedTable, benchmark: str) -> pl.DataFrame | StreamedTable:
        if isinstance(frame, StreamedTable):  # made in canonical order: only the benchmark column is added
            return frame.with_constants({"benchmark": benchmark})
        if "version" in frame.columns:
            frame = frame.drop("version")
        if "benchmark" not in frame.columns and frame.width:
            # sorted first, the constant added after: the order sorting by all columns gives, without the constant
            # in every row's sort key and gathered by the sort (a 14 M-row scene table: hundreds of MB less)
            keys = frame.columns
            frame = frame.sort(sort_keys(frame), nulls_last=True, maintain_order=True) if frame.height else frame
            return frame.select(pl.lit(benchmark).alias("benchmark"), *keys)
        ordered = ["benchmark", *[c for c in frame.columns if c != "benchmark"]]
        frame = frame.select(ordered)
        return frame.sort(sort_keys(frame), nulls_last=True, maintain_order=True) if frame.height else frame

    @staticmethod
    def _with_version(frame: pl.DataFrame, version: str) -> pl.DataFrame:
        return frame.with_columns(pl.lit(version).alias("version")).select(
            ["benchmark", "version", *[c for c in frame.columns if c != "benchmark"]]
        )

    @staticmethod
    def _write_table(frame: pl.DataFrame, path: Path) -> None:
        frame.write_parquet(path, compression="zstd", statistics=True)
        with path.open("rb+") as handle:
            os.fsync(handle.fileno())

    @staticmethod
    def _write_streamed(table: StreamedTable, version: str, path: Path) -> None:
        """A streamed table (``benchmark`` first) as Parquet in row groups of :data:`STREAMED_ROW_GROUP` rows, made
        one ahead of the one being written (a few batches in memory whatever the table's size).

        Only string columns are dictionary-encoded: a dictionary of millions of distinct floats is built, found
        too large and dropped for every row group (a quarter of the write time of the distance table).
        """
        schema = table.arrow_schema.insert(1, pa.field("version", pa.large_string()))
        strings = [field.name for field in schema if pa.types.is_large_string(field.type)]
        with path.open("wb") as handle:
            with pq.ParquetWriter(
                handle, schema, compression="zstd", write_statistics=True, use_dictionary=strings
            ) as writer:
                for batch in prefetched(table.batches(STREAMED_ROW_GROUP)):
                    rows = batch.add_column(1, schema.field(1), constant_strings(version, batch.num_rows))
                    del batch
                    writer.write_table(rows, row_group_size=rows.num_rows or None)
                    del rows
            handle.flush()
            os.fsync(handle.fileno())

    def _clean_stale_staging(self) -> None:
        if not self.staging_dir.is_dir():
            return
        now = time.time()
        for entry in self.staging_dir.iterdir():
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > _STALE_STAGING_S:
                    shutil.rmtree(entry, ignore_errors=True)

    def publish(self, staged: StagedVersion) -> Publication:
        """Make a checked version the latest of its benchmark (no-op when it already is).

        Raises :class:`ContractViolation` unless a passing check of exactly these files is recorded.
        """
        with self._lock(staged.family, staged.benchmark):  # the check cannot change between these lines
            self.verify(staged)
            self._require_passing_check(staged)
            current = self.latest(staged.benchmark, family=staged.family)
            if current is not None and current.version == staged.version:
                return Publication(staged.family, staged.benchmark, staged.version, current.published_at, False)
            now_ns = time.time_ns()
            published_at = datetime.fromtimestamp(now_ns / 1e9, UTC).isoformat(timespec="microseconds")
            directory = self.benchmark_dir(staged.family, staged.benchmark) / "publications"
            directory.mkdir(parents=True, exist_ok=True)
            files = sorted(directory.glob("*.json"))
            event = {
                "family": staged.family,
                "benchmark": staged.benchmark,
                "version": staged.version,
                "published_at": published_at,
                "sequence": len(files) + 1,
                "previous": hashlib.sha256(files[-1].read_bytes()).hexdigest() if files else None,
            }
            name = f"{now_ns:020d}-{staged.version}.json"
            text = canonical_json(event)
            write_atomic(directory / name, text)
            head = {"sequence": event["sequence"], "event": name, "sha256": hashlib.sha256(text.encode()).hexdigest()}
            write_atomic(directory / LOG_HEAD, canonical_json(head))
        return Publication(staged.family, staged.benchmark, staged.version, published_at, True)

    # -- reading ----------------------------------------------------------------------------
    def verify(self, staged: StagedVersion) -> None:
        """Check every file against the manifest's checksums before it can be published."""
        problem = self.damage(staged)
        if problem is not None:
            raise StoreError(problem)

    def damage(self, staged: StagedVersion, *, checksums: bool = True) -> str | None:
        """What is wrong with a version's files (naming the file), or None when they match the manifest.

        Without ``checksums`` only what is cheap is compared (the manifest parses, files exist with
        the recorded size): enough to keep a truncated file out of the catalog.
        """
        manifest_path = staged.path / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text("utf-8"))
            tables = dict(manifest["tables"])
        except FileNotFoundError:
            return f"{manifest_path}: incomplete version (no manifest)"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"{manifest_path}: damaged manifest ({type(exc).__name__})"
        for name, entry in sorted(tables.items()):
            path = staged.path / str(entry.get("file", ""))
            if name != path.stem:
                return f"{manifest_path}: table {name} points at {entry.get('file')}"
            if not path.is_file():
                return f"{path}: missing (listed in the manifest of version {staged.version})"
            size = entry.get("bytes")
            if size is not None and path.stat().st_size != size:
                return f"{path}: {path.stat().st_size} bytes, the manifest of version {staged.version} says {size}"
            if checksums and sha256_file(path) != entry.get("sha256"):
                return f"{path}: checksum mismatch with the manifest of version {staged.version}"
        return None

    def _set_aside(self, version_dir: Path) -> None:
        """Move a damaged version out of the way (kept for inspection, never read again)."""
        target = version_dir.with_name(f".damaged-{version_dir.name}-{uuid.uuid4().hex[:8]}")
        version_dir.rename(target)

    def publications(self, family: str, benchmark: str) -> list[dict[str, Any]]:
        """The readable publication events, oldest first; a damaged one is skipped, and it and any break in the
        chain (a missing, edited or forged event, a removed newest one) are reported in :attr:`problems`."""
        directory = self.benchmark_dir(family, benchmark) / "publications"
        if not directory.is_dir():
            return []
        removed = self.removed_versions(family, benchmark)
        events = []
        previous: tuple[Path, str] | None = None  # the last readable event and the hash of its bytes
        chained = False
        damaged: set[Path] = set()
        paths = sorted(directory.glob("*.json"))  # zero-padded ns timestamps: sorted == chronological
        for position, path in enumerate(paths, start=1):
            try:
                data = path.read_bytes()
            except OSError:
                data = b""
            event = _read_event(data)
            if event is None:
                self.problems.add(f"{path}: damaged publication event (ignored; publish again to repair)")
                damaged.add(path)
                previous = None
                continue
            problem = _chain_problem(event, position, previous, chained)
            if problem is not None:
                self.problems.add(f"{path}: {problem}")
            chained = chained or "sequence" in event
            version = str(event["version"])
            if version not in removed and not self.version_dir(family, benchmark, version).is_dir():
                self.problems.add(f"{path}: publishes version {version}, which is not in the store")
            events.append(event)
            previous = (path, hashlib.sha256(data).hexdigest())
        head_problem = _head_problem(directory, paths, events, damaged)
        if head_problem is not None:
            self.problems.add(head_problem)
        return events

    def removed_versions(self, family: str, benchmark: str) -> set[str]:
        """Versions ``gc`` deleted: their events stay in the log, and they are no longer listed."""
        path = self.benchmark_dir(family, benchmark) / REMOVED_FILE
        try:
            return set(json.loads(path.read_text("utf-8")).get("removed", {}))
        except FileNotFoundError:
            return set()
        except (OSError, ValueError, AttributeError):
            self.problems.add(f"{path}: damaged list of removed versions")
            return set()

    def latest(self, benchmark: str, family: str | None = None) -> VersionInfo | None:
        family = family or self.family_of(benchmark)
        if family is None:
            return None
        events = self.publications(family, benchmark)
        if not events:
            return None
        last = events[-1]
        return self._info(family, benchmark, last["version"], last["published_at"], True)

    def staged(self, family: str, benchmark: str, version: str) -> StagedVersion:
        path = self.version_dir(family, benchmark, version)
        if not (path / "manifest.json").exists():
            raise InputError(f"no version {version} of benchmark {benchmark}", parameter="version")
        return StagedVersion(family, benchmark, version, path, created=False)

    def _info(self, family: str, benchmark: str, version: str, published_at: str, is_latest: bool) -> VersionInfo:
        manifest_path = self.version_dir(family, benchmark, version) / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text("utf-8"))
        except (OSError, ValueError):
            self.problems.add(f"{manifest_path}: damaged or missing manifest (run `shiftbench check`)")
            manifest = {}
        if not isinstance(manifest, dict):
            manifest = {}
        return VersionInfo(
            family,
            benchmark,
            version,
            published_at,
            is_latest,
            manifest.get("n_examples"),
            manifest.get("params", {}),
        )

    def versions(self, benchmark: str | None = None) -> list[VersionInfo]:
        """Published versions (first publication of each), oldest first per benchmark."""
        result: list[VersionInfo] = []
        if not self.root.is_dir():
            return result
        for family_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
                if benchmark is not None and bench_dir.name != benchmark:
                    continue
                events = self.publications(family_dir.name, bench_dir.name)
                if not events:
                    continue
                latest = events[-1]["version"]
                removed = self.removed_versions(family_dir.name, bench_dir.name)
                first_seen: dict[str, str] = {}
                for event in events:
                    if event["version"] not in removed:
                        first_seen.setdefault(event["version"], event["published_at"])
                for version, published_at in first_seen.items():
                    result.append(self._info(family_dir.name, bench_dir.name, version, published_at, version == latest))
        return result

    def garbage_collect(self, keep: int = 1, dry_run: bool = False) -> list[Path]:
        """Remove versions older than the ``keep`` most recent published ones, and unpublished ones.

        Old versions stay queryable until this is called explicitly (``shiftbench gc``). The
        version staged last and any unchecked version younger than an hour are kept: they may be
        waiting for their checks or their publication. The most recent *intact* published version is
        always kept too: with a damaged latest, it is the only one that still answers queries. Removed
        versions are recorded in ``removed.json``; their publication events stay (the log is a chain).
        """
        if keep < 1:
            raise InputError("must keep at least the latest version", parameter="keep")
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        for family_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
                with self._lock(family_dir.name, bench_dir.name):
                    removed += self._collect(family_dir.name, bench_dir.name, keep, dry_run)
        return removed

    def _collect(self, family: str, benchmark: str, keep: int, dry_run: bool) -> list[Path]:
        bench_dir = self.benchmark_dir(family, benchmark)
        events = self.publications(family, benchmark)
        gone = self.removed_versions(family, benchmark)
        recent: list[str] = []
        for event in reversed(events):
            if event["version"] not in recent and event["version"] not in gone:
                recent.append(event["version"])
        keep_set = set(recent[:keep])
        intact = next((v for v in recent if self._intact(family, benchmark, v)), None)
        if intact is not None:
            keep_set.add(intact)
        staged = self.latest_staged(family, benchmark)
        if staged is not None:
            keep_set.add(staged.version)
        versions_dir = bench_dir / "versions"
        now = time.time()
        removed: list[Path] = []
        for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
            if version_dir.name in keep_set or version_dir.name.startswith("."):
                continue
            check = bench_dir / "checks" / f"{version_dir.name}.json"
            pending = not check.exists() and version_dir.name not in recent
            if pending and now - version_dir.stat().st_mtime < _PENDING_GRACE_S:
                continue
            removed.append(version_dir)
            if dry_run:
                continue
            if version_dir.name in recent:  # published once: the log keeps its events, this file says it is gone
                self._record_removed(family, benchmark, version_dir.name)
            check.unlink(missing_ok=True)
            shutil.rmtree(version_dir)
        return removed

    def _intact(self, family: str, benchmark: str, version: str) -> bool:
        """A version whose manifest parses and whose files are all there with their recorded sizes."""
        path = self.version_dir(family, benchmark, version)
        return self.damage(StagedVersion(family, benchmark, version, path, False), checksums=False) is None

    def _record_removed(self, family: str, benchmark: str, version: str) -> None:
        path = self.benchmark_dir(family, benchmark) / REMOVED_FILE
        listed = {}
        if path.is_file():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                listed = dict(json.loads(path.read_text("utf-8")).get("removed", {}))
        listed[version] = datetime.now(UTC).isoformat(timespec="seconds")
        write_atomic(path, canonical_json({"removed": dict(sorted(listed.items()))}))


def _read_event(data: bytes) -> dict[str, Any] | None:
    """A publication event, or None when the file is damaged (truncated, not JSON, fields missing)."""
    try:
        event = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(event, dict) or not all(isinstance(event.get(k), str) for k in ("version", "published_at")):
        return None
    return event


LOG_HEAD = "HEAD"  # in publications/: the newest event's sequence number, file name and hash
REMOVED_FILE = "removed.json"


def _chain_problem(
    event: Mapping[str, Any], position: int, previous: tuple[Path, str] | None, chained: bool
) -> str | None:
    """Why ``event`` (the ``position``-th file of the log) does not follow the readable event before it."""
    sequence = event.get("sequence")
    if sequence is None:  # an event from before the chain existed: only before the first chained one
        return "an event without a sequence number after the chained ones (forged?)" if chained else None
    if not isinstance(sequence, int) or sequence != position:
        missing = sequence - position if isinstance(sequence, int) and sequence > position else 0
        what = f"{missing} event(s) before it are missing" if missing else "it is out of place in the log"
        return f"publication event {sequence!r} is the log's event {position}: {what}"
    if previous is not None and event.get("previous") != previous[1]:
        return f"does not follow {previous[0].name} (its hash of the event before differs: edited or forged)"
    return None


def _head_problem(directory: Path, paths: list[Path], events: list[dict[str, Any]], damaged: set[Path]) -> str | None:
    """Whether the log's newest events are all there: ``HEAD`` names the newest event by number and hash."""
    head_path = directory / LOG_HEAD
    chained = any("sequence" in event for event in events)
    if not head_path.is_file():
        return f"{head_path}: missing (the log's head record)" if chained else None
    try:
        head = json.loads(head_path.read_text("utf-8"))
        sequence, name, digest = int(head["sequence"]), str(head["event"]), str(head["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{head_path}: damaged (the log's head record)"
    if sequence > len(paths):
        return f"{directory / name}: missing: the log's head names it (the newest publication event was removed)"
    newest = paths[sequence - 1] if sequence >= 1 else None
    if newest is None or newest.name != name:
        return f"{head_path}: names {name}, but the log's event {sequence} is {newest.name if newest else 'none'}"
    if newest not in damaged and hashlib.sha256(newest.read_bytes()).hexdigest() != digest:
        return f"{newest}: differs from the log's head record (edited)"
    if len(paths) > sequence + 1:  # a publish writes the head right after its event: one may be pending, not two
        return f"{paths[sequence + 1]}: {len(paths) - sequence} events after the log's head (not written by a publish)"
    return None


def _record_problem(record: CheckRecord, staged: StagedVersion) -> str | None:
    """Why a check record does not allow publishing ``staged`` (None: it passed, on these files, today)."""
    if not record.passed:
        shown = "; ".join(record.failed[:3]) + (f"; ... ({len(record.failed)} rules)" if len(record.failed) > 3 else "")
        return f"failed its contract checks ({shown})"
    files = {name: entry["sha256"] for name, entry in staged.manifest()["tables"].items()}
    if record.files != files:
        return "was checked on other files than these: check it again"
    if record.contracts != contracts_fingerprint(sorted(files)):
        return "was checked against other contracts than today's: check it again"
    return None
