"""One query on the catalog, for ``shiftbench sql``: its answer as a table or CSV, under a time limit.

DuckDB binds a query when it is given and runs it only when its rows are asked for: a bad cast, ``error()``, a
query past the memory limit fail there, later. Every DuckDB error, at either moment, is one line (an
:class:`InputError`, exit 2); a query still running after the time limit is interrupted through its connection
(``interrupt()`` from a timer) and says which option gives it longer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from shiftbench.errors import InputError

DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_PARAMETER = "--timeout"
# Column types polars writes to CSV as they are; any other (a list, struct, map, BLOB, INTERVAL, BIT, UNION...) is
# written as DuckDB's text of it, the text a table shows.
_CSV_AS_IS = frozenset(
    {"boolean", "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint", "uinteger"}
    | {"ubigint", "uhugeint", "float", "double", "decimal", "varchar", "date", "time", "timestamp", "enum", "uuid"}
    | {"timestamp with time zone", "timestamp_s", "timestamp_ms", "timestamp_ns", "null"}
)


def check_timeout(seconds: float, parameter: str = TIMEOUT_PARAMETER) -> None:
    """A time limit a timer can wait for: more than 0 s, at most what Python's waits allow."""
    if not 0 < seconds <= threading.TIMEOUT_MAX:
        raise InputError(f"must be a number of seconds above 0, got {seconds:g}", parameter=parameter)


@contextmanager
def one_line_errors(con: duckdb.DuckDBPyConnection, timeout_s: float) -> Iterator[None]:
    """Inside, a DuckDB error is an :class:`InputError` of its first line; after ``timeout_s`` the connection's
    query is interrupted, and that is an :class:`InputError` naming the time limit."""
    fired = threading.Event()

    def interrupt() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    except duckdb.Error as exc:
        if fired.is_set():
            raise InputError(
                f"the query ran past {timeout_s:g} s and was interrupted (a larger {TIMEOUT_PARAMETER} lets it finish)",
                parameter=TIMEOUT_PARAMETER,
            ) from None
        raise InputError(first_line(exc)) from None
    finally:
        timer.cancel()


def first_line(exc: BaseException) -> str:
    """An error's first line that says something (DuckDB's go on with the query and a caret)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def show(con: duckdb.DuckDBPyConnection, sql: str, *, max_rows: int, timeout_s: float) -> None:
    """Print the answer as DuckDB's table (on stdout): nothing is printed unless the whole query ran."""
    with one_line_errors(con, timeout_s):
        relation = con.sql(sql)
        if relation is not None:
            relation.show(max_rows=max_rows, max_width=200)


def csv_text(con: duckdb.DuckDBPyConnection, sql: str, *, timeout_s: float) -> str:
    """The answer as CSV; a column CSV has no form for (a list, a struct, BLOB...) as DuckDB's text of it."""
    with one_line_errors(con, timeout_s):
        relation = con.sql(sql)
        if relation is None:
            return ""
        frame = _csv_columns(relation).pl()
    return str(frame.write_csv())


def _csv_columns(relation: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """``relation`` with the columns polars cannot write to CSV cast to text (by position: names may repeat)."""
    kinds = [str(kind.id) for kind in relation.types]
    if all(kind in _CSV_AS_IS for kind in kinds):
        return relation
    columns = []
    for i, (name, kind) in enumerate(zip(relation.columns, kinds, strict=True), start=1):
        value = f"#{i}" if kind in _CSV_AS_IS else f"CAST(#{i} AS VARCHAR)"
        columns.append(f"{value} AS {_quoted(name)}")
    return relation.project(", ".join(columns))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
