"""Retiring what the store no longer needs: old versions (``shiftbench gc``) and wrongly named benchmarks.

Nothing here ever removes what a query may still need: the latest published versions, the newest intact one,
the version staged last, or a recent version that may still be waiting for its checks; nor anything of a
benchmark whose records are damaged (which versions are published is then not proven). The publication log is
never shortened (it is a chain); versions deleted once published are listed in ``removed.json`` instead, which is
never replaced when damaged.
"""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from shiftbench.errors import InputError
from shiftbench.store.checks import VersionChecks, damage
from shiftbench.store.content import content_findings
from shiftbench.store.layout import StagedVersion, StoreLayout
from shiftbench.store.log import PublicationLog

# An unpublished version younger than this may still be waiting for its checks: gc keeps it.
_PENDING_GRACE_S = 3600


@dataclass(frozen=True)
class Collection:
    """What ``gc`` removed (or would), and why it kept what it could not prove safe to remove."""

    removed: list[Path]
    kept: list[str]  # "kept every version of B: <the damaged file>: <what is wrong>"


class Retention:
    """Garbage collection of versions, and moving a whole benchmark aside."""

    def __init__(self, layout: StoreLayout, log: PublicationLog, checks: VersionChecks) -> None:
        self.layout = layout
        self.log = log
        self.checks = checks

    def retire(self, family: str, benchmark: str) -> Path:
        """Move a whole benchmark aside (``.retired/``): every view stops showing it, nothing is deleted.

        For a benchmark whose name it should never have had (``shiftbench.specs.naming``); under its lock.
        """
        source = self.layout.benchmark_dir(family, benchmark)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        target = self.layout.root / ".retired" / family / f"{benchmark}-{stamp}-{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with self.layout.lock(family, benchmark):
            source.rename(target)
        return target

    def garbage_collect(self, keep: int = 1, dry_run: bool = False) -> Collection:
        """Remove versions older than the ``keep`` most recent published ones, and unpublished ones.

        Old versions stay queryable until this is called explicitly (``shiftbench gc``). The
        version staged last and any unchecked version younger than an hour are kept: they may be
        waiting for their checks or their publication. The most recent *intact* published version is
        always kept too (every file matching its checksum, every table's rows its content hash, its check record
        readable): with a damaged latest, it is the only one whose rows the catalog still serves (in its
        ``_history`` views). A benchmark whose log, list of removed versions or pointer to the version staged last
        is damaged keeps every version: gc cannot prove then which are published. Removed versions are recorded in
        ``removed.json``; their events stay (the log is a chain).
        """
        if keep < 1:
            raise InputError("must keep at least the latest version", parameter="keep")
        collection = Collection([], [])
        for family, benchmark in self.layout.benchmarks():
            with self.layout.lock(family, benchmark):
                self._collect(family, benchmark, keep, dry_run, collection)
        return collection

    def _collect(self, family: str, benchmark: str, keep: int, dry_run: bool, collection: Collection) -> None:
        reading = self.log.read(family, benchmark)
        staged_problem = self.layout.staged_problem(family, benchmark)
        problems = [*reading.problems, *([staged_problem] if staged_problem else [])]
        if problems:
            collection.kept.extend(f"kept every version of {benchmark}: {problem}" for problem in problems)
            return
        gone = self.log.removed_versions(family, benchmark)
        recent = list(dict.fromkeys(e["version"] for e in reversed(reading.events) if e["version"] not in gone))
        keep_set = self._kept(family, benchmark, recent, keep, collection)
        versions_dir = self.layout.versions_dir(family, benchmark)
        now = time.time()
        for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
            if version_dir.name in keep_set or version_dir.name.startswith("."):
                continue
            check = self.layout.check_path(family, benchmark, version_dir.name)
            pending = not check.exists() and version_dir.name not in recent
            if pending and now - version_dir.stat().st_mtime < _PENDING_GRACE_S:
                continue
            collection.removed.append(version_dir)
            if dry_run:
                continue
            if version_dir.name in recent:  # published once: the log keeps its events, this file says it is gone
                self.log.record_removed(family, benchmark, version_dir.name)
            check.unlink(missing_ok=True)
            shutil.rmtree(version_dir)

    def _kept(self, family: str, benchmark: str, recent: list[str], keep: int, collection: Collection) -> set[str]:
        """The ``keep`` most recently published versions, the newest intact one, and the version staged last; every
        published version when none is intact. Why more than ``keep`` stay goes to ``collection``."""
        keep_set = set(recent[:keep])
        damaged: list[str] = []
        for version in recent if len(recent) > keep else []:  # else no published version can go
            problem = self._damage(family, benchmark, version)
            if problem is None:
                keep_set.add(version)
                break
            damaged.append(problem)
        else:
            keep_set.update(recent)
        if damaged and len(damaged) >= keep:  # the newest intact one (if any) is beyond the ``keep`` newest
            collection.kept.append(
                f"kept more than {keep} version(s) of {benchmark}, newer ones being damaged: {damaged[0]}"
            )
        staged = self.layout.latest_staged(family, benchmark)
        if staged is not None:
            keep_set.add(staged.version)
        return keep_set

    def _damage(self, family: str, benchmark: str, version: str) -> str | None:
        """What is wrong with a version (a file against its checksum, a table's rows against its content hash, its
        check record), or None: intact."""
        staged = StagedVersion(family, benchmark, version, self.layout.version_dir(family, benchmark, version), False)
        problem = damage(staged) or self.checks.damaged_record(staged)
        return problem or next(iter(content_findings(staged)[2]), None)
