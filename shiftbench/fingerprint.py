"""Content fingerprints: what version ids, cache keys and Dagster data versions are made of.

Fingerprints hash content, never paths or timestamps, so the same inputs give the same id on
any machine. Tables are hashed through Arrow IPC (a stable, specified byte layout) after
sorting rows, so row order coming out of a join never changes an id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path], root: Path | None = None) -> str:
    """Hash of (relative name, content hash) pairs: renaming or editing any file changes it."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        name = str(path.relative_to(root)) if root is not None else path.name
        digest.update(f"{name}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def sha256_table(frame: pl.DataFrame) -> str:
    """Order-independent content hash of a table (schema included)."""
    ordered = frame.sort(frame.columns, nulls_last=True) if frame.height else frame
    # The oldest compat level keeps the Arrow types (and so the ids) stable across polars releases.
    table: pa.Table = ordered.to_arrow(compat_level=pl.CompatLevel.oldest()).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(memoryview(sink.getvalue())).hexdigest()  # hashed in place, not copied to bytes


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
