"""Tables for papers from the ``leaderboard`` view: one row per method, one column per split and metric.

A cell reads ``mean ± half-width (n)``: the mean over seeds and the half-width of the view's 95 % Student
t interval (``±`` is left out below two seeds). ``shiftbench leaderboard --format markdown`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from shiftbench.cards import markdown_table


def leaderboard_table(
    con: duckdb.DuckDBPyConnection,
    benchmarks: Sequence[str] = (),
    metrics: Sequence[str] = ("acc_avg", "acc_wg"),
    splits: Sequence[str] = ("test",),
    digits: int = 3,
) -> pl.DataFrame:
    """Rows (benchmark, method, setting), columns ``<split>/<metric>``, cells ``mean ± half (n)``."""
    where = ["metric IN (SELECT unnest(?))", "eval_split IN (SELECT unnest(?))"]
    params: list[object] = [list(metrics), list(splits)]
    if benchmarks:
        where.append("benchmark IN (SELECT unnest(?))")
        params.append(list(benchmarks))
    query = (
        "SELECT benchmark, method, coalesce(setting, '') AS setting, eval_split, metric, n_seeds, mean, "
        f"(ci_high - ci_low) / 2 AS half FROM leaderboard WHERE {' AND '.join(where)}"
    )
    rows = con.sql(query, params=params).pl()
    if rows.is_empty():
        return pl.DataFrame(schema={"benchmark": pl.String, "method": pl.String, "setting": pl.String})
    cell = pl.format("{} ({})", pl.col("mean").round(digits), pl.col("n_seeds"))
    spread = pl.format("{} ± {} ({})", pl.col("mean").round(digits), pl.col("half").round(digits), pl.col("n_seeds"))
    rows = rows.with_columns(
        pl.when(pl.col("half").is_null()).then(cell).otherwise(spread).alias("cell"),
        (pl.col("eval_split") + "/" + pl.col("metric")).alias("column"),
    )
    order = [f"{s}/{m}" for s in splits for m in metrics]
    wide = rows.pivot(on="column", index=["benchmark", "method", "setting"], values="cell").sort(
        "benchmark", "method", "setting"
    )
    table: pl.DataFrame = wide.select("benchmark", "method", "setting", *[c for c in order if c in wide.columns])
    return table


def to_markdown(table: pl.DataFrame) -> str:
    return markdown_table(table.fill_null("")) + "\n"


def to_text(table: pl.DataFrame) -> str:
    """Aligned columns for a terminal."""
    cells = [list(table.columns)] + [[str(v) if v is not None else "" for v in row] for row in table.iter_rows()]
    widths = [max(len(row[k]) for row in cells) for k in range(len(table.columns))]
    return "".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in cells)
