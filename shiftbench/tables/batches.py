"""Polars frames as the Arrow record batches that fingerprints hash and streamed tables are made of.

Both :mod:`shiftbench.tables.fingerprint` (which hashes the batches) and :mod:`shiftbench.tables.streamed` (which makes
them) read these; neither imports the other for them. The batch size itself, :data:`shiftbench.tables.fingerprint.
BATCH_ROWS`, stays with the fingerprint it defines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import polars as pl
import pyarrow as pa


def arrow_batch(frame: pl.DataFrame) -> pa.Table:
    # The oldest compat level keeps the Arrow types (and so the ids) stable across polars releases.
    table: pa.Table = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    # A slice of a larger frame exports its lists' strings with the bytes after its last value still in the
    # buffer, and the IPC writer writes them: the hash would depend on what lay beyond the batch (the same 100x
    # objects hashed otherwise from their codes, batch by batch). Taken, a list column holds its rows only. Only
    # list columns: a take also clears a bitmap's unused bits, which every id so far has hashed as they were.
    for k, field in enumerate(table.schema):
        if pa.types.is_large_list(field.type) and table.num_rows:
            everything = pa.array(np.arange(table.num_rows, dtype=np.int64))  # from numpy: 100x faster than a range
            table = table.set_column(k, field, table.column(k).combine_chunks().take(everything))
    return table


def rebatch(frames: Iterable[pl.DataFrame], rows: int) -> Iterator[pl.DataFrame]:
    """The rows of ``frames`` again, in frames of exactly ``rows`` rows (the last may have fewer). A table without
    rows is one empty frame (its schema)."""
    pending: list[pl.DataFrame] = []
    held = 0
    yielded = False
    empty: pl.DataFrame | None = None
    for frame in frames:
        if empty is None:
            empty = frame.clear()
        while frame.height:
            take = min(rows - held, frame.height)
            pending.append(frame.slice(0, take))
            frame = frame.slice(take)
            held += take
            if held == rows:  # not rechunked: the Arrow conversion makes the one contiguous copy
                yield pl.concat(pending, rechunk=False)
                pending, held, yielded = [], 0, True
    if pending:
        yield pl.concat(pending, rechunk=False)
    elif not yielded and empty is not None:
        yield empty
