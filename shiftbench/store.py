"""The versioned store: content-addressed, immutable benchmark versions with atomic publish.

Layout under ``$SHIFTBENCH_HOME/store``::

    <family>/<benchmark>/versions/<version>/   immutable: <table>.parquet ..., manifest.json
    <family>/<benchmark>/publications/<ns>-<version>.json   one file per publish event
    .staging/                                    builds in progress (never visible)

A version id is a hash of the published content (tables without their ``version`` column,
which includes the ``benchmarks`` row with params and input fingerprints). Staging writes a
complete version directory in ``.staging`` and renames it into place, which is atomic on one
filesystem; a version only becomes *latest* when a publication event is written (again by an
atomic rename) after the contracts passed. So a build killed at any point leaves either no
trace or an unpublished, invisible version, and the previous latest stays latest. Rebuilding
identical content finds the version already there and writes no data file.

Every family uses this module unchanged: it knows nothing about BREEDS or MetaShift.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.errors import InputError, StoreError
from shiftbench.fingerprint import canonical_json, sha256_file, sha256_json, sha256_table

SCHEMA_VERSION = 1
VERSION_ID_LENGTH = 16
_STALE_STAGING_S = 24 * 3600
_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def check_benchmark_name(name: str, parameter: str = "benchmark") -> str:
    if not name or not set(name) <= _NAME_OK or name.startswith((".", "-")):
        raise InputError(
            f"invalid benchmark name {name!r}: use lower-case letters, digits, '-', '_' and '.'",
            parameter=parameter,
        )
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


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


class Store:
    """Versioned benchmark tables under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- layout ---------------------------------------------------------------------------
    def benchmark_dir(self, family: str, benchmark: str) -> Path:
        return self.root / family / benchmark

    def version_dir(self, family: str, benchmark: str, version: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "versions" / version

    @property
    def staging_dir(self) -> Path:
        return self.root / ".staging"

    @contextlib.contextmanager
    def _lock(self, family: str, benchmark: str) -> Iterator[None]:
        directory = self.benchmark_dir(family, benchmark)
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / ".lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def family_of(self, benchmark: str) -> str | None:
        if not self.root.is_dir():
            return None
        for family_dir in sorted(self.root.iterdir()):
            if not family_dir.name.startswith(".") and (family_dir / benchmark).is_dir():
                return family_dir.name
        return None

    # -- writing ----------------------------------------------------------------------------
    def stage(
        self,
        family: str,
        benchmark: str,
        tables: Mapping[str, pl.DataFrame],
        *,
        manifest_extra: Mapping[str, Any] | None = None,
        attachments: Mapping[str, bytes] | None = None,
    ) -> StagedVersion:
        """Write a complete version (or find the identical one already there); never publishes.

        ``tables`` are given without ``version`` (and may omit ``benchmark``); both columns
        are added here, first in column order. Rows are sorted so the bytes are deterministic.
        ``attachments`` (e.g. figures) are written under ``files/`` and listed in the manifest
        with their checksums; they are derived views and do not enter the version id.
        """
        check_benchmark_name(benchmark)
        other = self.family_of(benchmark)
        if other is not None and other != family:
            raise InputError(f"benchmark {benchmark!r} already belongs to family {other!r}", parameter="name")
        prepared = {name: self._canonical(frame, benchmark) for name, frame in sorted(tables.items())}
        hashes = {name: sha256_table(frame) for name, frame in prepared.items()}
        version = version_id(family, benchmark, hashes)
        final = self.version_dir(family, benchmark, version)
        if (final / "manifest.json").exists():
            return StagedVersion(family, benchmark, version, final, created=False)

        self._clean_stale_staging()
        staging = self.staging_dir / f"{benchmark}-{version}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            files: dict[str, Any] = {}
            for name, frame in prepared.items():
                with_version = frame.with_columns(pl.lit(version).alias("version")).select(
                    ["benchmark", "version", *[c for c in frame.columns if c != "benchmark"]]
                )
                path = staging / f"{name}.parquet"
                self._write_table(with_version, path)
                files[name] = {
                    "file": path.name,
                    "rows": with_version.height,
                    "sha256": sha256_file(path),
                    "content_sha256": hashes[name],
                }
            attached = {}
            for name, payload in sorted((attachments or {}).items()):
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
            _write_atomic(staging / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))
            _fsync_dir(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                staging.rename(final)
            except OSError:
                if (final / "manifest.json").exists():  # a concurrent identical build won the race
                    shutil.rmtree(staging, ignore_errors=True)
                    return StagedVersion(family, benchmark, version, final, created=False)
                if final.exists():  # leftover without a manifest: never visible, safe to replace
                    shutil.rmtree(final)
                    staging.rename(final)
                else:
                    raise
            _fsync_dir(final.parent)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return StagedVersion(family, benchmark, version, final, created=True)

    @staticmethod
    def _canonical(frame: pl.DataFrame, benchmark: str) -> pl.DataFrame:
        if "version" in frame.columns:
            frame = frame.drop("version")
        if "benchmark" not in frame.columns:
            frame = frame.with_columns(pl.lit(benchmark).alias("benchmark"))
        ordered = ["benchmark", *[c for c in frame.columns if c != "benchmark"]]
        frame = frame.select(ordered)
        return frame.sort(frame.columns, nulls_last=True, maintain_order=True)

    @staticmethod
    def _write_table(frame: pl.DataFrame, path: Path) -> None:
        frame.write_parquet(path, compression="zstd", statistics=True)
        with path.open("rb+") as handle:
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
        """Make a staged version the latest of its benchmark (no-op when it already is)."""
        self.verify(staged)
        with self._lock(staged.family, staged.benchmark):
            current = self.latest(staged.benchmark, family=staged.family)
            if current is not None and current.version == staged.version:
                return Publication(staged.family, staged.benchmark, staged.version, current.published_at, False)
            now_ns = time.time_ns()
            published_at = datetime.fromtimestamp(now_ns / 1e9, UTC).isoformat(timespec="microseconds")
            directory = self.benchmark_dir(staged.family, staged.benchmark) / "publications"
            directory.mkdir(parents=True, exist_ok=True)
            event = {
                "family": staged.family,
                "benchmark": staged.benchmark,
                "version": staged.version,
                "published_at": published_at,
            }
            _write_atomic(directory / f"{now_ns:020d}-{staged.version}.json", canonical_json(event))
        return Publication(staged.family, staged.benchmark, staged.version, published_at, True)

    # -- reading ----------------------------------------------------------------------------
    def verify(self, staged: StagedVersion) -> None:
        """Check every file against the manifest's checksums before it can be published."""
        manifest_path = staged.path / "manifest.json"
        if not manifest_path.exists():
            raise StoreError(f"{staged.path}: incomplete version (no manifest)")
        manifest = staged.manifest()
        for name, entry in manifest["tables"].items():
            path = staged.path / entry["file"]
            if not path.exists() or sha256_file(path) != entry["sha256"]:
                raise StoreError(f"{path}: checksum mismatch with the manifest of version {staged.version}")
            if name != path.stem:
                raise StoreError(f"{manifest_path}: table {name} points at {entry['file']}")

    def _publications(self, family: str, benchmark: str) -> list[dict[str, Any]]:
        directory = self.benchmark_dir(family, benchmark) / "publications"
        if not directory.is_dir():
            return []
        events = [json.loads(p.read_text("utf-8")) for p in sorted(directory.glob("*.json"))]
        return events  # file names start with a zero-padded ns timestamp: sorted == chronological

    def latest(self, benchmark: str, family: str | None = None) -> VersionInfo | None:
        family = family or self.family_of(benchmark)
        if family is None:
            return None
        events = self._publications(family, benchmark)
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
        manifest = json.loads(manifest_path.read_text("utf-8")) if manifest_path.exists() else {}
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
                events = self._publications(family_dir.name, bench_dir.name)
                if not events:
                    continue
                latest = events[-1]["version"]
                first_seen: dict[str, str] = {}
                for event in events:
                    first_seen.setdefault(event["version"], event["published_at"])
                for version, published_at in first_seen.items():
                    result.append(self._info(family_dir.name, bench_dir.name, version, published_at, version == latest))
        return result

    def garbage_collect(self, keep: int = 1, dry_run: bool = False) -> list[Path]:
        """Remove versions older than the ``keep`` most recent published ones, and unpublished ones.

        Old versions stay queryable until this is called explicitly (``shiftbench gc``).
        """
        if keep < 1:
            raise InputError("must keep at least the latest version", parameter="keep")
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        for family_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
                with self._lock(family_dir.name, bench_dir.name):
                    events = self._publications(family_dir.name, bench_dir.name)
                    recent: list[str] = []
                    for event in reversed(events):
                        if event["version"] not in recent:
                            recent.append(event["version"])
                    keep_set = set(recent[:keep])
                    versions_dir = bench_dir / "versions"
                    for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
                        if version_dir.name in keep_set:
                            continue
                        removed.append(version_dir)
                        if dry_run:
                            continue
                        for path in sorted((bench_dir / "publications").glob(f"*-{version_dir.name}.json")):
                            path.unlink()
                        shutil.rmtree(version_dir)
        return removed
