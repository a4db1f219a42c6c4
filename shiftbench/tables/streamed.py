"""Streamed tables: tables too large to hold as strings, made batch by batch whenever they are read.

A MetaShift collection at GQA scale has about 19 M (subset, image) memberships and 17-27 M subset
distances. As polars strings each would take 1.5-2.5 GB, and hashing, sorting and writing used to
copy them twice more. A :class:`StreamedTable` is instead a function that makes the table's rows in
canonical order (sorted by every column, as the store sorts any table) from integer codes, as Arrow
record batches of exactly the fingerprint's batch size: the strings of one batch exist at a time. The
store hashes it (the same fingerprint as the whole table would have, :mod:`shiftbench.tables.fingerprint`) and
writes it to Parquet row group by row group, each in its own pass over the batches.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shiftbench.tables.batches import arrow_batch, rebatch

T = TypeVar("T")


@dataclass(frozen=True)
class StreamedTable:
    """``batches(rows)`` makes the rows again, in canonical order, as Arrow tables of exactly ``rows`` rows (the
    last may have fewer; a table without rows gives no batch or one empty batch); ``schema`` and ``height`` are
    known upfront.

    The batches have the Arrow types polars gives ``schema`` at its oldest compat level (:attr:`arrow_schema`:
    ``large_string``, ``double``, ...), so that a streamed table hashes as the same table held as a data frame does.
    """

    schema: pl.Schema
    height: int
    batches: Callable[[int], Iterator[pa.Table]]

    @functools.cached_property
    def arrow_schema(self) -> pa.Schema:
        return arrow_schema(self.schema)

    def collect(self) -> pl.DataFrame:
        """The whole table (tests and small tables only: this is what streaming avoids)."""
        parts = list(self.batches(max(self.height, 1)))
        frame = pl.from_arrow(pa.concat_tables(parts) if parts else self.arrow_schema.empty_table())
        assert isinstance(frame, pl.DataFrame)
        return frame

    def with_constants(self, values: dict[str, str]) -> StreamedTable:
        """The same rows with string columns of one value each first (the store's ``benchmark`` and ``version``),
        in place of any columns of those names."""
        rest = [name for name in self.schema.names() if name not in values]
        schema = pl.Schema({**{name: pl.String() for name in values}, **{name: self.schema[name] for name in rest}})
        arrow = arrow_schema(schema)
        batches = self.batches

        def with_values(rows: int) -> Iterator[pa.Table]:
            for batch in batches(rows):
                columns = [constant_strings(value, batch.num_rows) for value in values.values()]
                columns += [batch.column(n) for n in rest]
                del batch  # not held while the next batch is made
                yield pa.Table.from_arrays(columns, schema=arrow)
                del columns

        return StreamedTable(schema, self.height, with_values)

    @classmethod
    def from_frames(cls, schema: pl.Schema, height: int, frames: Callable[[], Iterable[pl.DataFrame]]) -> StreamedTable:
        """A table given as data frames of any heights, already in canonical order (small tables, tests)."""

        def batches(rows: int) -> Iterator[pa.Table]:
            return (arrow_batch(frame) for frame in rebatch(frames(), rows))

        return cls(schema, height, batches)


def arrow_schema(schema: pl.Schema) -> pa.Schema:
    """The Arrow schema polars exports for ``schema`` at its oldest compat level (what fingerprints hash)."""
    return arrow_batch(pl.DataFrame(schema=schema)).schema


def in_memory(table: pl.DataFrame | StreamedTable) -> pl.DataFrame:
    """A table that is never streamed (``benchmarks``, ``examples``, magnitudes), as the data frame it is."""
    if isinstance(table, StreamedTable):
        raise TypeError("this table is streamed: read it with batches()")
    return table


def prefetched(items: Iterator[T]) -> Iterator[T]:
    """The same items, each made on a worker thread while the caller uses the one before.

    Making a batch of a streamed table (Arrow ``take``, numpy) and using it (IPC and sha256, or Parquet encoding
    and zstd) both release the GIL for most of their time, so on two cores the two overlap. The next item is only
    started once the caller has taken the previous one: at most two exist at a time.
    """
    ready: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)
    taken = threading.Semaphore(1)  # released each time the caller takes an item
    stop = threading.Event()

    def make() -> None:
        try:
            while True:
                while not taken.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                item = next(items, _END)
                if item is _END:
                    ready.put((False, None))
                    return
                ready.put((True, item))
        except BaseException as exc:  # handed to the caller, raised there
            ready.put((False, exc))

    worker = threading.Thread(target=make, name="shiftbench-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            more, item = ready.get()
            taken.release()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        worker.join()


_END = object()


def regroup(pieces: Iterable[Sequence[np.ndarray]], rows: int) -> Iterator[list[np.ndarray]]:
    """Columns of integer codes (and values) given in pieces of any length, again in pieces of exactly ``rows``
    rows (the last may have fewer; nothing at all when there are no rows)."""
    pending: list[Sequence[np.ndarray]] = []
    held = 0
    for piece in pieces:
        length = len(piece[0])
        start = 0
        while start < length:
            take = min(rows - held, length - start)
            pending.append([column[start : start + take] for column in piece])
            start += take
            held += take
            if held == rows:
                yield [np.concatenate(columns) for columns in zip(*pending, strict=True)]
                pending, held = [], 0
    if pending:
        yield [np.concatenate(columns) for columns in zip(*pending, strict=True)]


def strings_in_runs(values: pa.Array, codes: np.ndarray) -> pa.Array:
    """``values.take(codes)`` for codes that come in long runs of one value (a class over all its pairs): each run
    is taken once and Arrow's run-end decoding repeats it, instead of a lookup per row."""
    if len(codes) == 0:
        return values.take(codes)
    starts = np.flatnonzero(np.diff(codes)) + 1
    ends = np.append(starts, len(codes)).astype(np.int64)
    runs = pa.RunEndEncodedArray.from_arrays(pa.array(ends), values.take(codes[np.append(0, starts)]))
    decoded: pa.Array = pc.run_end_decode(runs)
    return decoded


def constant_strings(value: str, length: int) -> pa.LargeStringArray:
    """``length`` copies of one string as a ``large_string`` array, built from two buffers (no Python loop)."""
    data = value.encode("utf-8")
    offsets = np.arange(length + 1, dtype=np.int64) * len(data)
    return pa.LargeStringArray.from_buffers(length, pa.py_buffer(offsets), pa.py_buffer(data * length))


def float_column(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    """Float64 values, NULL where ``missing``, with 0.0 stored under each NULL: the bytes under a NULL enter the
    table's fingerprint (IPC writes the whole buffer), and polars holds 0.0 there for a NULL made from None."""
    if missing is None or not missing.any():
        return pa.array(values, type=pa.float64())
    return pa.array(np.where(missing, 0.0, values), type=pa.float64(), mask=missing)
