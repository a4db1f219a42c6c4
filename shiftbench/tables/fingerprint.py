"""Content fingerprints: what version ids, cache keys and Dagster data versions are made of.

Fingerprints hash content, never paths or timestamps, so the same inputs give the same id on
any machine. Tables are hashed through Arrow IPC (a stable, specified byte layout) after
sorting rows, so row order coming out of a join never changes an id.

The IPC stream holds record batches of at most :data:`BATCH_ROWS` rows (a table up to that size is
one batch), and its bytes are hashed as the writer produces them: a table of tens of millions of rows
can then be hashed batch by batch as it is generated (:func:`sha256_batches`, the streamed tables of
:mod:`shiftbench.tables.streamed`), with the same hash as the whole table would have, and never as one
buffer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from shiftbench.runtime.memory import release_freed_memory
from shiftbench.tables.batches import arrow_batch, rebatch

if TYPE_CHECKING:  # reading a split hashes files, never a streamed table: pyarrow.compute stays unloaded
    from shiftbench.tables.streamed import StreamedTable

_CHUNK = 1 << 20
# Called with each record batch as it is written into a fingerprint (the store records what of its bytes a
# Parquet file cannot keep: shiftbench.store.content).
Observer = Callable[[pa.Table], None]
# Rows per IPC record batch in a table's fingerprint. Tables up to this size (every table of the
# fixtures and defaults) hash exactly as they did when the whole table was one batch.
BATCH_ROWS = 1 << 21


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path], root: Path | None = None, known: Mapping[Path, str] | None = None) -> str:
    """Hash of (relative name, content hash) pairs: renaming or editing any file changes it. ``known`` gives the
    content hashes of files already hashed (e.g. by the worker that read them)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        name = str(path.relative_to(root)) if root is not None else path.name
        content = known[path] if known is not None and path in known else sha256_file(path)
        digest.update(f"{name}\0{content}\n".encode())
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


class _HashSink:
    """A write-only file that hashes what it is given (the IPC writer's output, never kept)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.digest.update(view)
        return view.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def sha256_batches(schema: pa.Schema, batches: Iterable[pa.Table], observe: Observer | None = None) -> str:
    """Hash of the IPC stream of ``batches`` (each written as one record batch; batches without rows are left
    out), written straight into sha256; ``observe`` sees each batch exactly as it is written."""
    sink = _HashSink()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema) as writer:
        for batch in batches:
            if batch.num_rows:
                combined = batch.combine_chunks()
                if observe is not None:
                    observe(combined)
                writer.write_table(combined)
                del combined
            # Dropped, and its pages given back, before the next batch is made: a batch of the GQA-scale distance
            # table is ~240 MB of strings.
            del batch
            release_freed_memory()
    return sink.digest.hexdigest()


def sha256_frames(frames: Iterable[pl.DataFrame], observe: Observer | None = None) -> str:
    """Fingerprint of the table made of ``frames`` (already in canonical row order), as :func:`sha256_table`
    gives it: the IPC stream of its :data:`BATCH_ROWS`-row batches, each converted on its own (so that its
    buffers hold exactly its rows; an empty table is its schema alone)."""
    batches = (arrow_batch(frame) for frame in rebatch(frames, BATCH_ROWS))
    first = next(batches)
    return sha256_batches(first.schema, itertools.chain([first], batches) if first.num_rows else [], observe)


def sha256_streamed(table: StreamedTable, observe: Observer | None = None) -> str:
    """Fingerprint of a streamed table (made in canonical order, in batches of :data:`BATCH_ROWS` rows), as
    :func:`sha256_table` gives it for the same rows held as a data frame."""
    # Made on this thread, one batch at a time: made ahead on a worker (as for writing) it saved 0.3-0.5 s of the
    # distance table's 3 s at GQA scale but held a second 240 MB batch.
    return sha256_batches(table.arrow_schema, table.batches(BATCH_ROWS), observe)


def sort_keys(frame: pl.DataFrame) -> list[str]:
    """The columns that order ``frame`` as all of them do: every column but those holding one value in every row
    (a version's ``benchmark``), which would only make every row's sort key longer (hundreds of MB at 14 M rows)."""
    varying = [
        name
        for name in frame.columns
        if frame.schema[name].is_nested()
        or frame[name].null_count() > 0
        or not bool((frame[name] == frame[name][0]).all())
    ]
    return varying or frame.columns[:1]


def sha256_table(frame: pl.DataFrame, observe: Observer | None = None) -> str:
    """Order-independent content hash of a table (schema included)."""
    ordered = frame.sort(sort_keys(frame), nulls_last=True) if frame.height else frame
    return sha256_frames([ordered], observe)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
