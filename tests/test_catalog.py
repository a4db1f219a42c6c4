"""The DuckDB catalog: views bind on an empty store, show latest vs history, and run the shipped SQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from shiftbench.catalog import SQL_DIR, refresh_catalog
from shiftbench.contracts import contracts
from shiftbench.publishing import check_version
from shiftbench.store import Store

from .conftest import ToyDir, toy_tables


def test_views_exist_and_are_empty_on_an_empty_store(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.duckdb"
    assert refresh_catalog(catalog, tmp_path / "store")
    with duckdb.connect(str(catalog), read_only=True) as con:
        for table in contracts():
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
            assert con.execute(f"SELECT count(*) FROM {table}_history").fetchone() == (0,)


@pytest.fixture
def published_store(tmp_path: Path, toy_breeds_dir: ToyDir) -> tuple[Path, list[str]]:
    store = Store(tmp_path / "store")
    versions = []
    for seed in (0, 3):
        staged = store.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed))
        check_version(store, staged)
        store.publish(staged)
        versions.append(staged.version)
    store.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=4))  # staged, never published
    other = store.stage("breeds", "toy-good", toy_tables(toy_breeds_dir(), split="good"))
    check_version(store, other)
    store.publish(other)
    refresh_catalog(tmp_path / "catalog.duckdb", store.root)
    return tmp_path / "catalog.duckdb", versions


def test_latest_and_history_views(published_store: tuple[Path, list[str]]) -> None:
    catalog, (v1, v2) = published_store
    with duckdb.connect(str(catalog), read_only=True) as con:
        latest = con.sql("SELECT benchmark, version FROM benchmarks ORDER BY benchmark").fetchall()
        assert latest[0] == ("toy", v2)
        history = con.sql(
            "SELECT version, is_latest FROM benchmarks_history WHERE benchmark = 'toy' ORDER BY created_at"
        )
        assert history.fetchall() == [(v1, False), (v2, True)]
        assert con.sql("SELECT DISTINCT version FROM examples WHERE benchmark = 'toy'").fetchall() == [(v2,)]
        assert con.execute("SELECT count(DISTINCT version) FROM examples_history WHERE benchmark='toy'").fetchone() == (
            2,
        )
        assert con.execute("SELECT params->>'split' FROM benchmarks WHERE benchmark = 'toy-good'").fetchone() == (
            "good",
        )
        created = con.execute("SELECT typeof(created_at), typeof(params) FROM benchmarks LIMIT 1").fetchone()
        assert created == ("TIMESTAMP WITH TIME ZONE", "JSON")


def test_every_shipped_example_query_runs(published_store: tuple[Path, list[str]]) -> None:
    catalog, _ = published_store
    queries = sorted((SQL_DIR / "examples").glob("*.sql"))
    assert queries
    with duckdb.connect(str(catalog), read_only=True) as con:
        for path in queries:
            con.sql(path.read_text()).fetchall()


def test_a_locked_catalog_is_reported_not_fatal(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.duckdb"
    refresh_catalog(catalog, tmp_path / "store")
    # Another process holds the catalog open for writing (e.g. a user's duckdb shell).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb,sys,time; c=duckdb.connect({str(catalog)!r}); print('ok', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.warns(UserWarning, match="locked by another process"):
            assert not refresh_catalog(catalog, tmp_path / "store", attempts=2)
    finally:
        holder.kill()
        holder.wait()
    assert refresh_catalog(catalog, tmp_path / "store")
