"""``shiftbench sql`` on a published warehouse (issue 48): every DuckDB error, whether DuckDB meets it binding the
query or running it (relations run lazily, when their rows are asked for), is one line and exit 2, with and without
``--csv``; one query at a time; a time limit; and CSV for every column type."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.store import Store
from shiftbench.warehouse import catalog
from shiftbench.warehouse.publishing import check_version

from .conftest import ToyDir, toy_tables

LONG = "SELECT sum(hash(i)) FROM range(100000000000) t(i)"  # minutes of work on any machine


@pytest.fixture
def home(cli_env: Callable[..., Settings], toy_breeds_dir: ToyDir) -> Settings:
    """A warehouse with one published version of ``toy``, the CLI pointed at it."""
    settings = cli_env()
    store = Store(settings.store_dir)
    staged = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=0))
    check_version(store, staged)
    store.log.publish(staged)
    return settings


@pytest.fixture
def small_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog opened with 64 MB of memory for DuckDB (its default is 80 % of the machine's)."""
    opened = catalog.open_catalog
    monkeypatch.setattr(catalog, "open_catalog", lambda path, store: opened(path, store, memory_limit="64MB"))


BAD_QUERIES = {
    # DuckDB meets these while the query runs, after it bound
    "a failing cast": (["SELECT CAST(x AS INTEGER) FROM (VALUES ('abc')) t(x)"], "error: Conversion Error: "),
    "error()": (["SELECT error('boom') FROM range(2)"], "error: Invalid Input Error: boom"),
    "error() over the catalog": (["SELECT error(split) FROM examples"], "error: Invalid Input Error: "),
    "past the memory limit": (["SELECT list(i) FROM range(100000000) t(i)"], "error: Out of Memory Error: "),
    # and while it binds
    "an unknown column": (["SELECT nothing FROM examples"], "error: Binder Error: "),
    "an unknown table": (["SELECT * FROM nothing"], "error: Catalog Error: "),
    "a syntax error": (["SELEC 1"], "error: parameter 'query': Parser Error: "),
    # what the command refuses before opening anything
    "two queries": (["SELECT 1 AS a; SELECT 2 AS b"], "one query at a time: got 2 statements"),
    "an empty query": ([""], "error: parameter 'query': no statement: the query is empty or only comments"),
    "only blanks": (["  \n "], "no statement: the query is empty or only comments"),
    "only comments": (["-- nothing\n/* here */"], "no statement: the query is empty or only comments"),
    "INSTALL": (["INSTALL httpfs"], "queries only (SELECT, FROM, WITH, DESCRIBE, SHOW, SUMMARIZE); got INSTALL"),
    "USE": (["USE memory"], "; got USE"),
    "RESET": (["RESET threads"], "; got RESET"),
    "a timeout of 0": (["SELECT 1", "--timeout", "0"], "error: parameter '--timeout': must be a number of seconds"),
    "a timeout of nan": (["SELECT 1", "--timeout", "nan"], "error: parameter '--timeout': must be a number"),
    "a timeout of inf": (["SELECT 1", "--timeout", "inf"], "error: parameter '--timeout': must be a number"),
    "a timeout that is no number": (["SELECT 1", "--timeout", "soon"], "argument --timeout: invalid float value"),
    "no rows to show": (["SELECT 1", "--max-rows", "0"], "error: parameter '--max-rows': must be at least 1"),
}


@pytest.mark.parametrize("csv", [False, True], ids=["table", "csv"])
@pytest.mark.parametrize("case", BAD_QUERIES)
def test_every_bad_query_is_one_line_and_exit_2(
    home: Settings, small_memory: None, capsys: pytest.CaptureFixture[str], case: str, csv: bool
) -> None:
    argv, message = BAD_QUERIES[case]
    code = main(["sql", *argv, *(["--csv"] if csv else [])])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.endswith("\n") and message in err, err
    assert "Traceback" not in err and out == "", out


@pytest.mark.parametrize("csv", [False, True], ids=["table", "csv"])
def test_a_query_past_its_time_limit_is_interrupted_in_one_line(
    home: Settings, capsys: pytest.CaptureFixture[str], csv: bool
) -> None:
    started = time.monotonic()
    code = main(["sql", LONG, "--timeout", "0.5", *(["--csv"] if csv else [])])
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    assert err == (
        "error: parameter '--timeout': the query ran past 0.5 s and was interrupted (a larger --timeout lets it "
        "finish)\n"
    )
    assert seconds < 20, seconds  # interrupted, not run to its end
    # The connection is left usable: the next query on the same warehouse answers.
    assert main(["sql", "SELECT count(*) AS n FROM examples", "--csv", "--timeout", "30"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "n"


def test_a_query_within_its_time_limit_answers_whole(home: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "SELECT count(*) AS n FROM range(3000000)", "--csv", "--timeout", "60"]) == 0
    assert capsys.readouterr().out == "n\n3000000\n"


def test_csv_writes_every_column_type_as_the_table_shows_it(home: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """polars has no CSV form for lists, structs, maps, BLOB, INTERVAL, BIT or fixed arrays: those columns are
    DuckDB's text of them (what the table shows); the others are written as before (numbers, text, times)."""
    query = (
        "SELECT 1 AS i, 0.5 AS x, 'a,b' AS s, [1, 2] AS l, {'k': 1} AS st, map([1], ['v']) AS m, 'x'::BLOB AS b, "
        "INTERVAL 1 DAY AS d, '101'::BIT AS bits, [1, 2]::INTEGER[2] AS a, DATE '2020-01-02' AS day, NULL AS n"
    )
    assert main(["sql", query, "--csv"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header == "i,x,s,l,st,m,b,d,bits,a,day,n"
    assert row == '1,0.5,"a,b","[1, 2]",{\'k\': 1},{1=v},x,1 day,101,"[1, 2]",2020-01-02,'


def test_a_query_over_the_catalog_still_answers(home: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """A comment before the query, a trailing semicolon: still one query."""
    assert main(["sql", "-- how many\nSELECT count(*) > 0 AS some FROM examples;", "--csv"]) == 0
    assert capsys.readouterr().out == "some\ntrue\n"


def test_the_refused_statements_are_named_as_written() -> None:
    """Named by what their writer wrote, whatever DuckDB files them under (LOAD, SET, CALL)."""
    from shiftbench.warehouse.catalog import statement_keyword

    named = {
        "INSTALL httpfs": "INSTALL",
        "force install httpfs": "FORCE INSTALL",
        "USE memory": "USE",
        "  -- a comment\n /* another */ RESET threads": "RESET",
        "CHECKPOINT": "CHECKPOINT",
        "EXPLAIN ANALYZE SELECT 1": "EXPLAIN ANALYZE",
        "CREATE TABLE t AS SELECT 1": "CREATE TABLE",
        "(SELECT 1)": "a statement of another kind",
    }
    assert {text: statement_keyword(text) for text in named} == named
