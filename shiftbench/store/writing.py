"""Writing a new immutable version: canonical tables, their version id, files, attachments and manifest.

Tables are put in a canonical order and hashed first, so that the version id says what the content is before
anything is written, and identical content finds its version already there. A new version is written whole in
its own folder under ``.staging`` (manifest last) and renamed into place, which is atomic on one filesystem: a
build killed at any point leaves no trace or a complete, unpublished version. Nothing here publishes.
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from shiftbench.errors import InputError
from shiftbench.runtime.memory import release_freed_memory
from shiftbench.runtime.outputs import fsync_dir
from shiftbench.store.checks import damage
from shiftbench.store.content import Layout, LayoutRecorder
from shiftbench.store.layout import (
    SCHEMA_VERSION,
    StagedVersion,
    StoreLayout,
    check_benchmark_name,
    version_id,
)
from shiftbench.tables.fingerprint import sha256_file, sha256_streamed, sha256_table, sort_keys
from shiftbench.tables.streamed import StreamedTable, constant_strings, prefetched

_STALE_STAGING_S = 24 * 3600
# Rows per Parquet row group of a streamed table (at GQA scale 100 row groups of distances): 8x smaller batches
# than the fingerprint's keep the write pass's memory small, and readers prune sorted row groups finer.
STREAMED_ROW_GROUP = 1 << 18

Table = pl.DataFrame | StreamedTable
Attachments = Mapping[str, bytes] | Callable[[], Mapping[str, bytes]]
Documents = Callable[[str, Mapping[str, Mapping[str, Any]], list[str]], Mapping[str, bytes]]
WhileAttaching = Callable[[Mapping[str, Path]], None]


def canonical(frame: Table, benchmark: str) -> Table:
    """``frame`` with ``benchmark`` as its first column (and no ``version``), its rows sorted."""
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


def with_version(frame: pl.DataFrame, version: str) -> pl.DataFrame:
    return frame.with_columns(pl.lit(version).alias("version")).select(
        ["benchmark", "version", *[c for c in frame.columns if c != "benchmark"]]
    )


def write_table(frame: pl.DataFrame, path: Path) -> None:
    frame.write_parquet(path, compression="zstd", statistics=True)
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())


def write_streamed(table: StreamedTable, version: str, path: Path) -> None:
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


@dataclass
class _Draft:
    """A version's canonical tables and their content hashes, before anything of it is written."""

    family: str
    benchmark: str
    version: str
    tables: dict[str, Table]  # emptied as each table is written: a canonical copy is let go once on disk
    hashes: dict[str, str]
    layouts: dict[str, Layout | None]  # what of each hashed stream its Parquet file cannot keep (store.content)


@dataclass(frozen=True)
class _Extras:
    """What a new version gets besides its tables, and the caller's work to run while its figures are drawn."""

    manifest_extra: Mapping[str, Any] | None
    attachments: Attachments | None
    documents: Documents | None
    while_attaching: WhileAttaching | None


def _prepare(family: str, benchmark: str, tables: Mapping[str, Table], consume: bool) -> _Draft:
    prepared: dict[str, Table] = {}
    hashes = {}
    layouts: dict[str, Layout | None] = {}
    for name in sorted(tables):
        # Each table is put in canonical order when its turn comes (not all first): a sorted copy of a large
        # frame does not wait in memory while a large streamed table is hashed.
        table = tables.pop(name) if consume and isinstance(tables, dict) else tables[name]
        frame = prepared[name] = canonical(table, benchmark)
        del table
        # sha256_table sorts the canonical frame again: the same rows, but bitmaps rebuilt the way every id so far
        # was hashed (their unused bits enter the bytes; see SceneTables.from_frames)
        recorder = LayoutRecorder()
        if isinstance(frame, StreamedTable):
            hashes[name] = sha256_streamed(frame, recorder)
        else:
            hashes[name] = sha256_table(frame, recorder)
        layouts[name] = recorder.layout
        release_freed_memory()  # a large table's batches, before the next table's
    return _Draft(family, benchmark, version_id(family, benchmark, hashes), prepared, hashes, layouts)


class VersionWriter:
    """Stages versions into one store. An in-memory table's Parquet file is written by :func:`write_table`, looked
    up at each table (a test that replaces it kills a build midway)."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout

    def stage(
        self,
        family: str,
        benchmark: str,
        tables: Mapping[str, Table],
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
        check_benchmark_name(benchmark)
        other = self.layout.family_of(benchmark)
        if other is not None and other != family:
            raise InputError(f"benchmark {benchmark!r} already belongs to family {other!r}", parameter="name")
        draft = _prepare(family, benchmark, tables, consume)
        final = self.layout.version_dir(family, benchmark, draft.version)
        if (final / "manifest.json").exists():
            existing = StagedVersion(family, benchmark, draft.version, final, created=False)
            if damage(existing) is None:
                return self.layout.mark_staged(existing)
            with self.layout.lock(family, benchmark):  # damaged: the rebuild writes the same content again
                _set_aside(final)
        created = self._write_new(draft, final, _Extras(manifest_extra, attachments, documents, while_attaching))
        return self.layout.mark_staged(StagedVersion(family, benchmark, draft.version, final, created=created))

    def _write_new(self, draft: _Draft, final: Path, extras: _Extras) -> bool:
        """Write the version in a staging folder and rename it to ``final``; False if an identical build won."""
        self._clean_stale_staging()
        staging = self.layout.staging_dir / f"{draft.benchmark}-{draft.version}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        # Figures are drawn on a worker thread while the tables are written (writing Parquet releases the GIL).
        drawing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shiftbench-attachments")
        attachments = extras.attachments
        drawn = drawing.submit(attachments) if callable(attachments) else None
        given: Mapping[str, bytes] = {} if attachments is None or callable(attachments) else attachments
        try:
            files = self._write_tables(staging, draft)
            if extras.while_attaching is not None and drawn is not None and not drawn.done():
                # Only with figures still to wait for: otherwise the caller's tables, alive until stage returns,
                # would add to the check's memory for nothing (GQA-scale objects: 2.29 GiB instead of 1.89).
                extras.while_attaching({name: staging / entry["file"] for name, entry in files.items()})
            made = dict(drawn.result() if drawn is not None else given)
            if extras.documents is not None:
                made.update(extras.documents(draft.version, files, sorted(made)))
            manifest = _manifest(draft, files, _write_attachments(staging, made), extras.manifest_extra)
            # The manifest is written last: a directory without one is incomplete by definition.
            self.layout.write(staging / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))
            fsync_dir(staging)
            return _move_into_place(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            drawing.shutdown(wait=True, cancel_futures=True)

    def _write_tables(self, staging: Path, draft: _Draft) -> dict[str, Any]:
        """Write each table's Parquet file (``version`` added as its second column); the manifest's entries."""
        files: dict[str, Any] = {}
        for name in list(draft.tables):
            frame = draft.tables.pop(name)  # each canonical copy is let go once written, before the checks run
            path = staging / f"{name}.parquet"
            if isinstance(frame, StreamedTable):
                write_streamed(frame, draft.version, path)
            else:
                write_table(with_version(frame, draft.version), path)
            rows = frame.height
            del frame
            release_freed_memory()
            files[name] = {
                "file": path.name,
                "bytes": path.stat().st_size,
                "rows": rows,
                "sha256": sha256_file(path),
                "content_sha256": draft.hashes[name],
                "layout": draft.layouts[name],
            }
        return files

    def _clean_stale_staging(self) -> None:
        staging_dir = self.layout.staging_dir
        if not staging_dir.is_dir():
            return
        now = time.time()
        for entry in staging_dir.iterdir():
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime > _STALE_STAGING_S:
                    shutil.rmtree(entry, ignore_errors=True)


def _write_attachments(staging: Path, made: Mapping[str, bytes]) -> dict[str, Any]:
    """Write the attached files under ``files/``; their manifest entries (with checksums)."""
    attached = {}
    for name, payload in sorted(made.items()):
        target = staging / "files" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(payload)
        attached[name] = {"file": f"files/{name}", "sha256": hashlib.sha256(payload).hexdigest()}
    return attached


def _manifest(
    draft: _Draft, files: dict[str, Any], attached: dict[str, Any], extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "family": draft.family,
        "benchmark": draft.benchmark,
        "version": draft.version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "tables": files,
        **({"attachments": attached} if attached else {}),
        **dict(extra or {}),
    }


def _move_into_place(staging: Path, final: Path) -> bool:
    """Rename a complete staging folder to its version's folder; False when a concurrent identical build won."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(final)
    except OSError:
        if (final / "manifest.json").exists():  # a concurrent identical build won the race
            shutil.rmtree(staging, ignore_errors=True)
            return False
        if final.exists():  # leftover without a manifest: never visible, safe to replace
            shutil.rmtree(final)
            staging.rename(final)
        else:
            raise
    fsync_dir(final.parent)
    return True


def _set_aside(version_dir: Path) -> None:
    """Move a damaged version out of the way (kept for inspection, never read again)."""
    target = version_dir.with_name(f".damaged-{version_dir.name}-{uuid.uuid4().hex[:8]}")
    version_dir.rename(target)
