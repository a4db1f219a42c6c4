"""Where the versioned store keeps things (see :mod:`shiftbench.store` for the whole layout).

Every other part of the store finds its folders and files here, so their names are written once: benchmark and
version folders, the staging area, check records, the publication log, the pointer to the version staged last,
and the per-benchmark lock. Names become directories, so they are checked here too. A file the store replaces is
replaced atomically (:func:`write_atomic`): readers see the old file or the new one, never a part.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from shiftbench.errors import InputError
from shiftbench.runtime.outputs import write_atomic
from shiftbench.tables.fingerprint import canonical_json, sha256_json

# '@' only appears in names shiftbench gives (NAME@TAG, shiftbench.specs.naming); specs and --name refuse it.
_NAME_OK = set("abcdefghijklmnopqrstuvwxyz0123456789-_.@")
MAX_NAME_LENGTH = 100  # names become directories (and parts of run names): keep them well under NAME_MAX
LOG_HEAD = "HEAD"  # in publications/: the newest event's sequence number, file name and hash
REMOVED_FILE = "removed.json"
SCHEMA_VERSION = 1
VERSION_ID_LENGTH = 16


def version_id(family: str, benchmark: str, table_hashes: Mapping[str, str]) -> str:
    """A version's id (its folder's name): the hash of its tables' content hashes (``content_sha256``)."""
    identity = {
        "schema_version": SCHEMA_VERSION,
        "family": family,
        "benchmark": benchmark,
        "tables": table_hashes,
    }
    return sha256_json(identity)[:VERSION_ID_LENGTH]


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


class StoreLayout:
    """The paths of one store, its per-benchmark lock, and the pointer to each benchmark's version staged last.

    Every part of the store replaces its files through :meth:`write`.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, path: Path, data: str | bytes) -> None:
        """Replace one of the store's files atomically (:func:`write_atomic`, looked up at each call: a test that
        replaces it kills a write midway in every part of the store)."""
        write_atomic(path, data)

    def benchmark_dir(self, family: str, benchmark: str) -> Path:
        return self.root / family / benchmark

    def versions_dir(self, family: str, benchmark: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "versions"

    def version_dir(self, family: str, benchmark: str, version: str) -> Path:
        return self.versions_dir(family, benchmark) / version

    @property
    def staging_dir(self) -> Path:
        return self.root / ".staging"

    def check_path(self, family: str, benchmark: str, version: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "checks" / f"{version}.json"

    def publications_dir(self, family: str, benchmark: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "publications"

    def removed_path(self, family: str, benchmark: str) -> Path:
        return self.benchmark_dir(family, benchmark) / REMOVED_FILE

    def staged_pointer(self, family: str, benchmark: str) -> Path:
        return self.benchmark_dir(family, benchmark) / "staged.json"

    def lock(self, family: str, benchmark: str) -> FileLock:
        """One writer per benchmark (stage, publish, check records, gc), across processes."""
        directory = self.benchmark_dir(family, benchmark)
        directory.mkdir(parents=True, exist_ok=True)
        return FileLock(directory / ".lock")

    def benchmarks(self) -> Iterator[tuple[str, str]]:
        """Every benchmark folder as (family, benchmark), sorted; hidden folders (the staging area) are no family."""
        if not self.root.is_dir():
            return
        for family_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
                yield family_dir.name, bench_dir.name

    def family_of(self, benchmark: str) -> str | None:
        if not self.root.is_dir():
            return None
        for family_dir in sorted(self.root.iterdir()):
            if not family_dir.name.startswith(".") and (family_dir / benchmark).is_dir():
                return family_dir.name
        return None

    def staged(self, family: str, benchmark: str, version: str) -> StagedVersion:
        path = self.version_dir(family, benchmark, version)
        if not (path / "manifest.json").exists():
            raise InputError(f"no version {version} of benchmark {benchmark}", parameter="version")
        return StagedVersion(family, benchmark, version, path, created=False)

    def mark_staged(self, staged: StagedVersion) -> StagedVersion:
        """Remember the version staged last: publishing a benchmark without naming a version publishes it."""
        event = {"version": staged.version, "staged_at": datetime.now(UTC).isoformat(timespec="microseconds")}
        with self.lock(staged.family, staged.benchmark):
            self.write(self.staged_pointer(staged.family, staged.benchmark), canonical_json(event))
        return staged

    def latest_staged(self, family: str, benchmark: str) -> StagedVersion | None:
        """The version staged last (checked or not), if it is still in the store (None too when the pointer is
        damaged: :meth:`staged_problem` says so)."""
        version = self._staged_version(family, benchmark)
        if version is None:
            return None
        path = self.version_dir(family, benchmark, version)
        return StagedVersion(family, benchmark, version, path, created=False) if path.is_dir() else None

    def staged_problem(self, family: str, benchmark: str) -> str | None:
        """What is wrong with the pointer to the version staged last, naming it (None: absent or readable)."""
        pointer = self.staged_pointer(family, benchmark)
        if pointer.is_file() and self._staged_version(family, benchmark) is None:
            return f"{pointer}: damaged pointer to the version staged last (building {benchmark} again rewrites it)"
        return None

    def _staged_version(self, family: str, benchmark: str) -> str | None:
        try:
            version = json.loads(self.staged_pointer(family, benchmark).read_text("utf-8"))["version"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return version if isinstance(version, str) and benchmark_name_problem(version) is None else None
