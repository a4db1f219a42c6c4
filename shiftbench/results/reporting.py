"""Tables for papers from the ``leaderboard`` view: one row per method, one column per split and metric.

A cell reads ``mean ± half-width (n)``: the mean over seeds and the half-width of the view's 95 % Student
t interval (``±`` is left out below two seeds). ``shiftbench leaderboard --format markdown`` prints it.
Every row says whose images it is on (column ``images``: real | generated | standin | unrecorded,
:mod:`shiftbench.scoring.provenance`) and, when a worst-group metric is shown, over which groups (column ``grouping``).
Rows on stand-in images (and scored predictions of unrecorded images) are left out unless asked for
(``include_standin``: the view ``leaderboard_with_standins``).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from shiftbench.errors import InputError
from shiftbench.families.variants import suggest
from shiftbench.scoring.metrics import METRIC_NAMES, METRIC_PREFIXES
from shiftbench.scoring.provenance import IMAGES, SHOWN_BY_DEFAULT
from shiftbench.warehouse.cards import markdown_table

# The WILDS split names of ``examples.split`` (data_contracts/examples.yaml) that results are reported on.
EVAL_SPLITS = ("train", "id_val", "id_test", "val", "test", "ood_train")


def check_request(
    con: duckdb.DuckDBPyConnection, benchmarks: Sequence[str], metrics: Sequence[str], splits: Sequence[str]
) -> None:
    """Every name a leaderboard is asked for exists: a published benchmark, a metric of the vocabulary
    (:mod:`shiftbench.scoring.metrics`), a WILDS split. A misspelt one would print "no results" and look like data."""
    if not metrics:
        raise InputError("name at least one metric", parameter="--metrics")
    if not splits:
        raise InputError("name at least one split", parameter="--splits")
    for metric in metrics:
        if metric not in METRIC_NAMES and not metric.startswith(METRIC_PREFIXES):
            known = ", ".join([*METRIC_NAMES, *(f"{p}..." for p in METRIC_PREFIXES)])
            raise InputError(f"unknown metric {metric!r}; known: {known}", parameter="--metrics")
    for split in splits:
        if split not in EVAL_SPLITS:
            raise InputError(f"unknown split {split!r}; known: {', '.join(EVAL_SPLITS)}", parameter="--splits")
    published = [row[0] for row in con.sql("SELECT DISTINCT benchmark FROM benchmarks ORDER BY 1").fetchall()]
    for name in benchmarks:
        if name not in published:
            raise InputError(f"no published benchmark {name!r}{suggest(name, published)}", parameter="BENCHMARK")


def _where(benchmarks: Sequence[str], metrics: Sequence[str], splits: Sequence[str]) -> tuple[str, list[object]]:
    where = ["metric IN (SELECT unnest(?))", "eval_split IN (SELECT unnest(?))"]
    params: list[object] = [list(metrics), list(splits)]
    if benchmarks:
        where.append("benchmark IN (SELECT unnest(?))")
        params.append(list(benchmarks))
    return " AND ".join(where), params


def leaderboard_table(
    con: duckdb.DuckDBPyConnection,
    benchmarks: Sequence[str] = (),
    metrics: Sequence[str] = ("acc_avg", "acc_wg"),
    splits: Sequence[str] = ("test",),
    digits: int = 3,
    include_standin: bool = False,
) -> pl.DataFrame:
    """Rows (benchmark, method, setting, selection[, grouping], images), columns ``<split>/<metric>``, cells
    ``mean ± half (n)``; ``grouping`` (the groups acc_wg is over) when acc_wg is asked for; with
    ``include_standin`` the stand-in rows too. Two rows that differ only by their image source (never in the
    latest results of one run name) get a column ``image_source``."""
    where, params = _where(benchmarks, metrics, splits)
    view = "leaderboard_with_standins" if include_standin else "leaderboard"
    query = (
        "SELECT benchmark, method, coalesce(setting, '') AS setting, selection, grouping, images, "
        "coalesce(image_source, '') AS image_source, eval_split, metric, n_seeds, mean, "
        f"(ci_high - ci_low) / 2 AS half FROM {view} WHERE {where}"
    )
    rows = con.sql(query, params=params).pl()
    index = ["benchmark", "method", "setting", "selection", *(["grouping"] if "acc_wg" in metrics else []), "images"]
    if rows.is_empty():
        return pl.DataFrame(schema=dict.fromkeys(index, pl.String))
    cell = pl.format("{} ({})", pl.col("mean").round(digits), pl.col("n_seeds"))
    spread = pl.format("{} ± {} ({})", pl.col("mean").round(digits), pl.col("half").round(digits), pl.col("n_seeds"))
    rows = rows.with_columns(
        pl.when(pl.col("half").is_null()).then(cell).otherwise(spread).alias("cell"),
        (pl.col("eval_split") + "/" + pl.col("metric")).alias("column"),
    )
    order = [f"{s}/{m}" for s in splits for m in metrics]
    wide = rows.pivot(on="column", index=[*index, "image_source"], values="cell").sort(index, nulls_last=True)
    if wide.select(index).is_duplicated().any():  # else the image source says nothing more than images
        index = [*index, "image_source"]
    table: pl.DataFrame = wide.select(*index, *[c for c in order if c in wide.columns])
    return table


def left_out(
    con: duckdb.DuckDBPyConnection, benchmarks: Sequence[str], metrics: Sequence[str], splits: Sequence[str]
) -> dict[str, int]:
    """How many rows the default leaderboard leaves out, by images (``standin``, ``unrecorded``)."""
    where, params = _where(benchmarks, metrics, splits)
    query = (
        "SELECT images, count(DISTINCT (benchmark, method, setting, grouping, image_source)) "
        f"FROM leaderboard_with_standins WHERE images NOT IN (SELECT unnest(?)) AND {where} GROUP BY images"
    )
    counts = dict(con.execute(query, [list(SHOWN_BY_DEFAULT), *params]).fetchall())
    return {images: int(counts[images]) for images in IMAGES if images in counts}


def left_out_note(counts: dict[str, int]) -> str:
    """The line that says what the default leaderboard left out ('' when nothing)."""
    total = sum(counts.values())
    if not total:
        return ""
    if set(counts) == {"standin"}:
        what = f"{total} row(s) on stand-in images left out"
    else:
        parts = {"standin": "on stand-in images", "unrecorded": "of unrecorded images"}
        what = f"{total} row(s) left out ({', '.join(f'{n} {parts[k]}' for k, n in counts.items())})"
    return f"{what}: --include-standin shows them, labelled"


def images_shown(table: pl.DataFrame) -> list[str]:
    """The ``images`` labels of a leaderboard table's rows, in the vocabulary's order (each gets a legend line)."""
    present = set(table.get_column("images").to_list()) if "images" in table.columns else set()
    return [images for images in IMAGES if images in present]


def to_markdown(table: pl.DataFrame) -> str:
    return markdown_table(table.fill_null("")) + "\n"


def to_text(table: pl.DataFrame) -> str:
    """Aligned columns for a terminal."""
    cells = [list(table.columns)] + [[str(v) if v is not None else "" for v in row] for row in table.iter_rows()]
    widths = [max(len(row[k]) for row in cells) for k in range(len(table.columns))]
    return "".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in cells)
