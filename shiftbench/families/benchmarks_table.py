"""The ``benchmarks`` table of a version: its one row (family, spec, parameters, sources, size), which every
family writes first among its tables and ``publishing.stage_tables`` reads back into the manifest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from shiftbench.tables.fingerprint import canonical_json

SCHEMA = {"family": pl.String, "spec": pl.String, "params": pl.String, "sources": pl.String, "n_examples": pl.Int64}


def benchmarks_row(
    family: str, spec: str, params: Mapping[str, Any], sources: Mapping[str, Any], n_examples: int
) -> pl.DataFrame:
    """The row, with ``params`` and ``sources`` as canonical JSON (sorted keys: the same bytes for the same values)."""
    values = [family, spec, canonical_json(dict(params)), canonical_json(dict(sources)), n_examples]
    return pl.DataFrame([values], schema=SCHEMA, orient="row")
