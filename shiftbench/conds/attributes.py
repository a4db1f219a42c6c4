"""Raw columns to categorical attributes, as a dataset spec's ``columns`` say.

The result, the *attribute table*, has ``example_id`` and one string column per attribute whose
values are exactly the spec's values: the shift engine never sees a raw encoding.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from shiftbench.conds.specs import ColumnMapping, DatasetSpec
from shiftbench.errors import InputError

_SET = ("1", "true", "True", "TRUE")
_UNSET = ("-1", "0", "false", "False", "FALSE")


def _where(frame: pl.DataFrame, condition: pl.Expr, first_line: int | None) -> tuple[int, str, int | None, str]:
    bad = frame.with_row_index("row").filter(condition)
    row = int(bad["row"][0])
    return bad.height, str(bad["example_id"][0]), (row + first_line if first_line is not None else None), ""


def _mapped(frame: pl.DataFrame, mapping: ColumnMapping, path: Path | None, first_line: int | None) -> pl.Expr:
    if mapping.flags:
        for value, column in mapping.flags.items():
            if column not in frame.columns:
                raise InputError(f"{mapping.name}: no raw column {column!r} for value {value!r}", path=path)
            text = pl.col(column).cast(pl.String)
            bad = ~text.is_in([*_SET, *_UNSET]) | text.is_null()
            if frame.select(bad.any()).item():
                n, example, line, _ = _where(frame, bad, first_line)
                raise InputError(
                    f"{column} of example {example!r} is not a flag (1/-1, 1/0 or true/false) ({n} such rows)",
                    path=path,
                    line=line,
                )
        expr = pl.lit(mapping.others)
        for value, column in reversed(list(mapping.flags.items())):  # the first listed flag wins
            expr = pl.when(pl.col(column).cast(pl.String).is_in(_SET)).then(pl.lit(value)).otherwise(expr)
        return expr.alias(mapping.name)
    assert mapping.column is not None
    if mapping.column not in frame.columns:
        raise InputError(f"{mapping.name}: no raw column {mapping.column!r}", path=path)
    to_value = {raw: value for value, raw in mapping.raw.items()}
    text = pl.col(mapping.column).cast(pl.String)
    if mapping.others is None:
        bad = ~text.is_in(list(to_value)) | text.is_null()
        if frame.select(bad.any()).item():
            n, example, line, _ = _where(frame, bad, first_line)
            found = frame.with_row_index("row").filter(bad)[mapping.column][0]
            raise InputError(
                f"unknown value {found!r} in column {mapping.column!r} of example {example!r}: expected one of "
                f"{', '.join(to_value)} (or give the attribute an 'others' value) ({n} such rows)",
                path=path,
                line=line,
            )
    return text.replace_strict(to_value, default=pl.lit(mapping.others), return_dtype=pl.String).alias(mapping.name)


def attribute_table(
    frame: pl.DataFrame, dataset: DatasetSpec, *, path: Path | None = None, first_line: int | None = None
) -> pl.DataFrame:
    """``example_id`` plus the label and every attribute of ``dataset``, sorted by id."""
    if frame["example_id"].is_duplicated().any():
        n, example, line, _ = _where(frame, pl.col("example_id").is_duplicated(), first_line)
        raise InputError(f"example id {example!r} appears more than once ({n} rows)", path=path, line=line)
    wanted = [
        dataset.label,
        *dataset.attributes,
        *[c for c in dataset.columns if c not in (dataset.label, *dataset.attributes)],
    ]
    exprs = [_mapped(frame, dataset.columns[name], path, first_line) for name in wanted]
    return frame.select(pl.col("example_id"), *exprs).sort("example_id")
