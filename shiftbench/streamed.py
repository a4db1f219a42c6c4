"""Streamed tables: tables too large to hold as strings, made frame by frame whenever they are read.

A MetaShift collection at GQA scale has about 19 M (subset, image) memberships and 17-27 M subset
distances. As polars strings each would take 1.5-2.5 GB, and hashing, sorting and writing used to
copy them twice more. A :class:`StreamedTable` is instead a function that makes the table's rows in
canonical order (sorted by every column, as the store sorts any table) from integer codes, a few
million rows at a time. The store hashes it (:func:`shiftbench.fingerprint.sha256_frames`, the same
fingerprint as the whole table would have) and writes it to Parquet row group by row group, each in
its own pass over the frames, so its memory is one batch whatever the table's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class StreamedTable:
    """``frames()`` makes the rows again, in canonical order; ``height`` and ``schema`` are known upfront."""

    schema: pl.Schema
    height: int
    frames: Callable[[], Iterator[pl.DataFrame]]

    def collect(self) -> pl.DataFrame:
        """The whole table (tests and small tables only: this is what streaming avoids)."""
        parts = list(self.frames())
        return pl.concat(parts) if parts else pl.DataFrame(schema=self.schema)

    def map(self, schema: pl.Schema, step: Callable[[pl.DataFrame], pl.DataFrame]) -> StreamedTable:
        """The same rows with ``step`` applied to every frame (it must keep the canonical order)."""
        frames = self.frames
        return StreamedTable(schema, self.height, lambda: (step(frame) for frame in frames()))


def in_memory(table: pl.DataFrame | StreamedTable) -> pl.DataFrame:
    """A table that is never streamed (``benchmarks``, ``examples``, magnitudes), as the data frame it is."""
    if isinstance(table, StreamedTable):
        raise TypeError("this table is streamed: read it with frames()")
    return table
