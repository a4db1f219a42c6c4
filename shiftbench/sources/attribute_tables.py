"""A user's multi-attribute table (Parquet or CSV with an id column), read as it is.

Which raw columns become which categorical attributes is the dataset spec's business
(``shiftbench.conds.attributes``); this reader only checks the file and the id column.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from shiftbench.errors import InputError

# CSV data rows start on line 2 (line 1 is the header): errors add this to the row index.
CSV_FIRST_DATA_LINE = 2


def read_attribute_table(path: Path, id_column: str) -> tuple[pl.DataFrame, int | None]:
    """The table with ``id_column`` renamed ``example_id``, and the line of row 0 (CSV) or None."""
    if not path.is_file():
        raise InputError("attribute table not found", path=path, parameter="path")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            frame = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise InputError(f"unreadable Parquet: {exc}", path=path) from None
        first_line = None
    elif suffix in (".csv", ".tsv"):
        try:
            frame = pl.read_csv(path, separator="\t" if suffix == ".tsv" else ",", infer_schema=False)
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"unreadable CSV: {str(exc).splitlines()[0]}", path=path) from None
        first_line = CSV_FIRST_DATA_LINE
    else:
        raise InputError("expected a .parquet, .csv or .tsv file", path=path)
    if id_column not in frame.columns:
        raise InputError(
            f"no id column {id_column!r} (have {', '.join(frame.columns)})", path=path, parameter="id_column"
        )
    if frame.schema[id_column] != pl.String:
        raise InputError(
            f"id column {id_column!r} must be strings, found {frame.schema[id_column]} (ids are names: cast them "
            "when writing the file)",
            path=path,
        )
    empty = frame.with_row_index("row").filter(
        pl.col(id_column).is_null() | (pl.col(id_column).str.strip_chars() == "")
    )
    if empty.height:
        row = int(empty["row"][0])
        raise InputError(
            f"empty id ({empty.height} such rows)", path=path, line=row + first_line if first_line else None
        )
    return frame.rename({id_column: "example_id"}) if id_column != "example_id" else frame, first_line
