"""Retiring what the store no longer needs: old versions (``shiftbench gc``) and wrongly named benchmarks.

Nothing here ever removes what a query may still need: the latest published versions, the newest intact one,
the version staged last, or a recent version that may still be waiting for its checks. The publication log is
never shortened (it is a chain); versions deleted once published are listed in ``removed.json`` instead.
"""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from shiftbench.errors import InputError
from shiftbench.store_checks import damage
from shiftbench.store_layout import StagedVersion, StoreLayout
from shiftbench.store_publications import PublicationLog

# An unpublished version younger than this may still be waiting for its checks: gc keeps it.
_PENDING_GRACE_S = 3600


class Retention:
    """Garbage collection of versions, and moving a whole benchmark aside."""

    def __init__(self, layout: StoreLayout, log: PublicationLog) -> None:
        self.layout = layout
        self.log = log

    def retire(self, family: str, benchmark: str) -> Path:
        """Move a whole benchmark aside (``.retired/``): every view stops showing it, nothing is deleted.

        For a benchmark whose name it should never have had (``shiftbench.naming``); under its lock.
        """
        source = self.layout.benchmark_dir(family, benchmark)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        target = self.layout.root / ".retired" / family / f"{benchmark}-{stamp}-{uuid.uuid4().hex[:6]}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with self.layout.lock(family, benchmark):
            source.rename(target)
        return target

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
        for family, benchmark in self.layout.benchmarks():
            with self.layout.lock(family, benchmark):
                removed += self._collect(family, benchmark, keep, dry_run)
        return removed

    def _collect(self, family: str, benchmark: str, keep: int, dry_run: bool) -> list[Path]:
        recent = self._published(family, benchmark)
        keep_set = self._kept(family, benchmark, recent, keep)
        versions_dir = self.layout.versions_dir(family, benchmark)
        now = time.time()
        removed: list[Path] = []
        for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
            if version_dir.name in keep_set or version_dir.name.startswith("."):
                continue
            check = self.layout.check_path(family, benchmark, version_dir.name)
            pending = not check.exists() and version_dir.name not in recent
            if pending and now - version_dir.stat().st_mtime < _PENDING_GRACE_S:
                continue
            removed.append(version_dir)
            if dry_run:
                continue
            if version_dir.name in recent:  # published once: the log keeps its events, this file says it is gone
                self.log.record_removed(family, benchmark, version_dir.name)
            check.unlink(missing_ok=True)
            shutil.rmtree(version_dir)
        return removed

    def _published(self, family: str, benchmark: str) -> list[str]:
        """The versions published and not removed yet, most recently published first."""
        events = self.log.events(family, benchmark)
        gone = self.log.removed_versions(family, benchmark)
        recent: list[str] = []
        for event in reversed(events):
            if event["version"] not in recent and event["version"] not in gone:
                recent.append(event["version"])
        return recent

    def _kept(self, family: str, benchmark: str, recent: list[str], keep: int) -> set[str]:
        """The ``keep`` most recently published versions, the newest intact one, and the version staged last."""
        keep_set = set(recent[:keep])
        intact = next((v for v in recent if self._intact(family, benchmark, v)), None)
        if intact is not None:
            keep_set.add(intact)
        staged = self.layout.latest_staged(family, benchmark)
        if staged is not None:
            keep_set.add(staged.version)
        return keep_set

    def _intact(self, family: str, benchmark: str, version: str) -> bool:
        """A version whose manifest parses and whose files are all there with their recorded sizes."""
        path = self.layout.version_dir(family, benchmark, version)
        return damage(StagedVersion(family, benchmark, version, path, False), checksums=False) is None
