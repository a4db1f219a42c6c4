"""A stored table's content hash, recomputed from its Parquet file: what its version id was made of.

A version id hashes each table's Arrow IPC stream (:func:`shiftbench.tables.fingerprint.sha256_table`). Those bytes hold
some that Parquet does not keep: the bits after the last value of a bitmap (validity, booleans), what lies under a
NULL (a string's bytes, a number) and bytes after a buffer's last value that the IPC writer writes when the buffer
is at most its padded size. They depend on how the build made the columns, so the same rows read back from the
file can hash otherwise (12 of the 427 tables of the README's warehouse). Staging records them, the table's
*layout* (:class:`LayoutRecorder`, a few bytes per column with NULLs, in the manifest), and
:func:`stored_content_sha256` rebuilds the stream from the file's rows and that layout. A layout only fills bytes
no reader sees (it is refused where it would change a row), so a table whose rows changed never hashes to the
recorded value.

The rules of what the writer writes are Arrow's (``GetTruncatedBitmap`` and the slicing of value, offset and data
buffers in ``arrow/ipc/writer.cc``), as measured on the installed pyarrow:
``tests/test_store.py::test_a_recorded_layout_rebuilds_exactly_the_bytes_the_content_hash_was_made_of`` holds
them with arrays of every kind the contracts declare, sliced, padded and with bytes under NULLs.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shiftbench.store.layout import StagedVersion
from shiftbench.tables.batches import arrow_batch, rebatch
from shiftbench.tables.fingerprint import BATCH_ROWS, sha256_batches

Node = dict[str, Any]  # one array's bytes beyond its rows: "validity", "values", "data" (hex), "nulls", "child"
Layout = list[list[Any]]  # [[batch number, {column: Node}], ...] for the batches that have any
_ALIGNMENT = 64  # Arrow's buffer alignment: a buffer at most its padded size is written whole
MAX_LAYOUT_BYTES = 1 << 20  # a table whose layout would be larger keeps none (checked by its file checksum alone)


class UnsupportedLayout(Exception):
    """An array whose written bytes this module cannot describe (a type the contracts do not use)."""


class LayoutMismatch(Exception):
    """A recorded layout that does not fit the rows read back (it would change a row, or names none)."""


def _padded(size: int) -> int:
    return -(-size // _ALIGNMENT) * _ALIGNMENT


def _bytes_for(bits: int) -> int:
    return -(-bits // 8)


def _offsets_dtype(kind: pa.DataType) -> type[np.signedinteger[Any]] | None:
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) or pa.types.is_large_list(kind):
        return np.int64
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_list(kind):
        return np.int32
    return None


def _is_fixed(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_temporal(kind))


# -- what the writer wrote (staging) ------------------------------------------------------------------------


def _bitmap_tail(buffer: pa.Buffer, offset: int, length: int) -> str | None:
    """The bitmap's written bytes from its last value's byte on, when they are not all-zero after the values."""
    if offset != 0 or buffer.size > _padded(_bytes_for(length)):
        return None  # copied bit by bit: nothing after the values
    whole = buffer.to_pybytes()
    canonical = bytearray(whole[: _bytes_for(length)])
    if length % 8:
        canonical[-1] &= (1 << length % 8) - 1
    return None if whole == bytes(canonical) else whole[length // 8 :].hex()


def _bits(buffer: pa.Buffer, offset: int, length: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[offset : offset + length].astype(bool)


def _fixed_node(array: pa.Array, null_rows: np.ndarray) -> Node:
    """A number column: bytes under its NULLs, and those the writer writes after its last value (the buffer whole
    when it is at most its padded size, else a slice rounded up to 8 bytes)."""
    node: Node = {}
    width, length = array.type.bit_width // 8, len(array)
    raw = np.frombuffer(array.buffers()[1], np.uint8)
    start, needed = array.offset * width, length * width
    if array.offset == 0 and len(raw) <= _padded(needed):
        written = len(raw)
    else:
        written = min(len(raw) - start, -(-needed // 8) * 8)
    if written > needed:
        node["values"] = raw[start + needed : start + written].tobytes().hex()
    cells = raw[start : start + needed].reshape(length, width)[null_rows]
    held = cells.any(axis=1)  # the rows to record (a Python loop over those only: usually none)
    nulls = {str(row): cell.tobytes().hex() for row, cell in zip(null_rows[held], cells[held], strict=True)}
    if nulls:
        node["nulls"] = nulls
    return node


def _boolean_node(array: pa.Array, null_rows: np.ndarray) -> Node:
    node: Node = {}
    tail = _bitmap_tail(array.buffers()[1], array.offset, len(array))
    if tail is not None:
        node["values"] = tail
    if len(null_rows):
        values = _bits(array.buffers()[1], array.offset, len(array))
        if values[null_rows].any():
            node["nulls"] = {str(row): "01" for row in null_rows[values[null_rows]]}
    return node


def _offsets(array: pa.Array) -> np.ndarray:
    dtype = _offsets_dtype(array.type)
    assert dtype is not None
    return np.frombuffer(array.buffers()[1], dtype)[array.offset : array.offset + len(array) + 1]


def _string_node(array: pa.Array, null_rows: np.ndarray) -> Node:
    node: Node = {}
    offsets = _offsets(array)
    data = array.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    first, needed = int(offsets[0]), int(offsets[-1] - offsets[0])
    written = min(len(raw) - first, _padded(needed))
    if written > needed:
        node["data"] = raw[first + needed : first + written].tobytes().hex()
    held = null_rows[offsets[null_rows + 1] > offsets[null_rows]]
    payloads = {str(row): raw[offsets[row] : offsets[row + 1]].tobytes().hex() for row in held}
    if payloads:
        node["nulls"] = payloads
    return node


def _list_node(array: pa.Array, null_rows: np.ndarray) -> Node:
    offsets = _offsets(array)
    if np.any(offsets[null_rows + 1] > offsets[null_rows]):
        raise UnsupportedLayout("a NULL list with values under it")
    needed = int(offsets[-1] - offsets[0])
    if needed == 0:  # the writer then writes the whole child array: only an empty one is the rows'
        if len(array.values):
            raise UnsupportedLayout("empty lists over a child array that is not empty")
        return {}
    child = array_node(array.values.slice(int(offsets[0]), needed))
    return {"child": child} if child else {}


def array_node(array: pa.Array) -> Node:
    """What the IPC writer writes of ``array`` beyond its rows (empty when nothing)."""
    kind = array.type
    node: Node = {}
    null_rows = np.zeros(0, np.int64)
    if array.null_count:
        validity = array.buffers()[0]
        tail = _bitmap_tail(validity, array.offset, len(array))
        if tail is not None:
            node["validity"] = tail
        null_rows = np.flatnonzero(~_bits(validity, array.offset, len(array)))
    if pa.types.is_boolean(kind):
        node.update(_boolean_node(array, null_rows))
    elif _is_fixed(kind):
        node.update(_fixed_node(array, null_rows))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        node.update(_list_node(array, null_rows))
    elif _offsets_dtype(kind) is not None:
        node.update(_string_node(array, null_rows))
    elif not pa.types.is_null(kind):
        raise UnsupportedLayout(f"a column of type {kind}")
    return node


class LayoutRecorder:
    """Collects the layout of each batch a fingerprint writes (pass as its ``observe``); ``layout`` is None when a
    column's bytes cannot be described (the table is then checked by its file checksum alone)."""

    def __init__(self) -> None:
        self.layout: Layout | None = []
        self._batch = 0
        self._size = 0

    def __call__(self, batch: pa.Table) -> None:
        if self.layout is not None:
            try:
                nodes = {name: array_node(_one_chunk(batch.column(name))) for name in batch.column_names}
            except UnsupportedLayout:
                self.layout = None
            else:
                nodes = {name: node for name, node in nodes.items() if node}
                self._size += len(json.dumps(nodes)) if nodes else 0
                if self._size > MAX_LAYOUT_BYTES:
                    self.layout = None
                elif nodes:
                    self.layout.append([self._batch, nodes])
        self._batch += 1


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


# -- the stream again, from the file's rows (checking) ------------------------------------------------------


class Padding:
    """Whether the bits after a bitmap's last value are set, bitmap by bitmap in the order they are built (bit k of
    ``mask`` for the k-th): for versions staged before layouts were recorded, whose bitmaps polars left either
    way. ``seen`` counts the bitmaps that have such bits."""

    def __init__(self, mask: int = 0) -> None:
        self.mask = mask
        self.seen = 0

    def fill(self, last: int, kept: int) -> int:
        bit = self.mask >> self.seen & 1
        self.seen += 1
        return last | (~((1 << kept) - 1) & 0xFF) if bit else last


def _bitmap(bits: np.ndarray, tail: str | None, padding: Padding | None) -> pa.Buffer:
    packed = bytearray(np.packbits(bits, bitorder="little").tobytes())
    kept = len(bits) % 8
    if tail:
        extra = bytearray.fromhex(tail)
        if kept:  # the row's bits from the rows, the rest from the layout
            extra[0] = (extra[0] & ~((1 << kept) - 1) & 0xFF) | (packed[-1] & ((1 << kept) - 1))
        packed[len(bits) // 8 :] = extra
    elif padding is not None and kept:
        packed[-1] = padding.fill(packed[-1], kept)
    return pa.py_buffer(bytes(packed))


def _null_rows_of(node: Node, valid: np.ndarray) -> dict[int, str]:
    nulls = {int(row): cells for row, cells in node.get("nulls", {}).items()}
    if any(row < 0 or row >= len(valid) or valid[row] for row in nulls):
        raise LayoutMismatch("the layout puts bytes under a row that is not NULL")
    return nulls


def _fixed_values(array: pa.Array, node: Node, valid: np.ndarray) -> pa.Buffer:
    width = array.type.bit_width // 8
    filled = pc.fill_null(array, pa.scalar(0, array.type)) if array.null_count else array
    values = bytearray(np.ascontiguousarray(filled.to_numpy(zero_copy_only=False)).tobytes())
    for row, cells in _null_rows_of(node, valid).items():
        values[row * width : (row + 1) * width] = bytes.fromhex(cells)
    return pa.py_buffer(bytes(values) + bytes.fromhex(node.get("values", "")))


def _boolean_values(array: pa.Array, node: Node, valid: np.ndarray, padding: Padding | None) -> pa.Buffer:
    bits = np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False)).astype(bool)
    for row in _null_rows_of(node, valid):
        bits[row] = True
    return _bitmap(bits, node.get("values"), padding)


def _string_buffers(array: pa.Array, node: Node, valid: np.ndarray) -> list[pa.Buffer]:
    dtype = _offsets_dtype(array.type)
    assert dtype is not None
    if array.null_count:
        empty = b"" if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type) else ""
        array = pc.fill_null(array, pa.scalar(empty, array.type))
    offsets = _offsets(array).astype(np.int64)
    data = array.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    offsets -= offsets[0]
    lengths = np.diff(offsets)
    pieces, start = [], 0
    for row, payload in sorted(_null_rows_of(node, valid).items()):  # NULL rows are empty in ``raw``
        pieces += [raw[start : offsets[row]].tobytes(), bytes.fromhex(payload)]
        start = int(offsets[row])
        lengths[row] = len(payload) // 2
    pieces += [raw[start:].tobytes(), bytes.fromhex(node.get("data", ""))]
    rebuilt = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
    return [pa.py_buffer(rebuilt.tobytes()), pa.py_buffer(b"".join(pieces))]


def _list_buffers(
    array: pa.Array, node: Node, valid: np.ndarray, padding: Padding | None
) -> tuple[pa.Buffer, pa.Array]:
    offsets = _offsets(array).astype(np.int64)
    if np.any(np.diff(offsets)[~valid] > 0):
        raise LayoutMismatch("a NULL list with values under it")
    values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    child = rebuilt_array(values, node.get("child", {}), padding)
    return pa.py_buffer((offsets - offsets[0]).astype(_offsets_dtype(array.type)).tobytes()), child


def rebuilt_array(array: pa.Array, node: Node, padding: Padding | None = None) -> pa.Array:
    """``array``'s rows with the bytes ``node`` records beyond them, as the writer wrote them at staging."""
    kind = array.type
    if pa.types.is_null(kind):
        return array
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False)).astype(bool)
    validity = _bitmap(valid, node.get("validity"), padding) if array.null_count else None
    children: list[pa.Array] | None = None
    if pa.types.is_boolean(kind):
        buffers = [validity, _boolean_values(array, node, valid, padding)]
    elif _is_fixed(kind):
        buffers = [validity, _fixed_values(array, node, valid)]
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets, child = _list_buffers(array, node, valid, padding)
        buffers, children = [validity, offsets], [child]
    elif _offsets_dtype(kind) is not None:
        buffers = [validity, *_string_buffers(array, node, valid)]
    else:
        raise UnsupportedLayout(f"a column of type {kind}")
    return pa.Array.from_buffers(kind, len(array), buffers, array.null_count, 0, children)


def _stored_batches(path: Path) -> Iterator[pa.Table]:
    """The file's rows without their ``version`` column, in the fingerprint's batches and Arrow types (the written
    order is the order the fingerprint hashed: canonical)."""
    parquet = pq.ParquetFile(path)

    def frames() -> Iterator[pl.DataFrame]:
        if parquet.metadata.num_rows == 0:
            yield pl.DataFrame(pl.from_arrow(parquet.schema_arrow.empty_table())).drop("version")
        for batch in parquet.iter_batches(batch_size=1 << 18):
            yield pl.DataFrame(pl.from_arrow(batch)).drop("version")

    return (arrow_batch(frame) for frame in rebatch(frames(), BATCH_ROWS))


def _rebuilt_sha256(schema: pa.Schema, batches: Iterable[pa.Table], layout: Layout, padding: Padding | None) -> str:
    nodes = {int(number): columns for number, columns in layout}

    def rebuilt() -> Iterator[pa.Table]:
        for number, batch in enumerate(batches):
            recorded = nodes.get(number, {})
            columns = [rebuilt_array(_one_chunk(batch.column(n)), recorded.get(n, {}), padding) for n in schema.names]
            yield pa.Table.from_arrays(columns, schema=batch.schema)

    return sha256_batches(schema, rebuilt())


def stored_content_sha256(path: Path, layout: Layout) -> str:
    """The content hash of a stored table, as staging computed it, from its Parquet file and recorded layout.

    Raises :class:`LayoutMismatch` for a layout that does not fit the rows, :class:`UnsupportedLayout` for a
    column of a type this module does not rebuild.
    """
    batches = _stored_batches(path)
    first = next(batches)
    if not first.num_rows:
        return sha256_batches(first.schema, [])
    return _rebuilt_sha256(first.schema, itertools.chain([first], batches), layout, None)


MAX_PADDINGS = 10  # bitmaps of one table tried both ways for a version without layouts: 2**10 hashes at most


def legacy_content_matches(path: Path, expected: str) -> bool:
    """Whether a table staged before layouts were recorded hashes to ``expected``: its bytes under NULLs taken as
    empty, and the bits after each bitmap's last value tried clear and set (only for a table of one batch, with
    at most :data:`MAX_PADDINGS` bitmaps that have such bits)."""
    if stored_content_sha256(path, []) == expected:
        return True
    batches = list(itertools.islice(_stored_batches(path), 2))
    if len(batches) > 1 or not batches[0].num_rows:
        return False
    counted = Padding()  # the first pass (every bit clear, as above) counts the bitmaps
    _rebuilt_sha256(batches[0].schema, batches, [], counted)
    if counted.seen > MAX_PADDINGS:
        return False
    masks = range(1, 1 << counted.seen)
    return any(_rebuilt_sha256(batches[0].schema, batches, [], Padding(mask)) == expected for mask in masks)


def content_findings(staged: StagedVersion) -> tuple[int, list[str], list[str]]:
    """(tables of ``staged`` whose rows hash to their recorded content hash, notes on those whose hash cannot be
    recomputed, lines naming each table whose rows are not the version's). Call once its files match their
    manifest (:func:`shiftbench.store.checks.damage`)."""
    verified, notes, rewritten = 0, list[str](), list[str]()
    tables = staged.manifest()["tables"]
    recorded = any("layout" in entry for entry in tables.values())  # staged since layouts are: every table has one
    for _, entry in sorted(tables.items()):
        if recorded and "layout" not in entry:
            rewritten.append(f"{staged.path / str(entry['file'])}: its manifest entry lost its layout (edited)")
            continue
        outcome, line = _table_content(staged, entry)
        verified += outcome == "verified"
        if outcome == "note":
            notes.append(line)
        elif outcome == "damaged":
            rewritten.append(line)
    return verified, notes, rewritten


def _table_content(staged: StagedVersion, entry: dict[str, Any]) -> tuple[str, str]:
    """("verified" | "note" | "damaged", the line saying so) for one table of ``staged``."""
    path = staged.path / str(entry["file"])
    expected = entry["content_sha256"]
    try:
        if "layout" not in entry:  # staged before layouts were recorded
            if legacy_content_matches(path, expected):
                return "verified", ""
            return "note", (
                f"{path}: content hash not recomputed: staged before shiftbench recorded what the hash holds beyond "
                "the rows (bytes under NULLs); its checksum and contracts are checked"
            )
        if entry["layout"] is None:
            return "note", (
                f"{path}: content hash not recomputed: staging recorded no layout (more than {MAX_LAYOUT_BYTES >> 20} "
                "MiB of bytes under NULLs, or a column of a type store.content does not describe); its checksum and "
                "contracts are checked"
            )
        if stored_content_sha256(path, entry["layout"]) == expected:
            return "verified", ""
        why = ""
    except LayoutMismatch as exc:
        why = f" ({exc})"
    except UnsupportedLayout as exc:
        return "note", f"{path}: content hash not recomputed: {exc}"
    except (pa.ArrowException, OSError) as exc:
        return "damaged", f"{path}: not readable as Parquet ({type(exc).__name__})"
    return "damaged", (
        f"{path}: its rows do not hash to the content hash version {staged.version} was made from "
        f"(rewritten after staging){why}"
    )
