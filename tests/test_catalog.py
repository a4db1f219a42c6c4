"""The DuckDB catalog: views bind on an empty store, show latest vs history, and run the shipped SQL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


def test_readers_never_block_a_refresh_and_keep_a_consistent_view(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """Refreshes replace the catalog file atomically: readers in other processes, querying all the
    while, never fail and never see a half-written catalog."""
    catalog, _ = published_store
    reader = textwrap.dedent(
        f"""
        import duckdb
        for _ in range(150):
            with duckdb.connect({str(catalog)!r}, read_only=True) as con:
                n = con.execute("SELECT count(*) FROM benchmarks").fetchone()[0]
                assert n == 2, n
        print("ok")
        """
    )
    readers = [subprocess.Popen([sys.executable, "-c", reader], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    holder = duckdb.connect(str(catalog), read_only=True)  # an open reader (a user's DuckDB shell)
    try:
        for _ in range(25):
            assert refresh_catalog(catalog, tmp_path / "store").ok
        assert holder.execute("SELECT count(*) FROM benchmarks").fetchone() == (2,)
    finally:
        holder.close()
    for proc in readers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok"


def test_a_damaged_version_is_left_out_and_named_not_fatal(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    catalog, (v1, v2) = published_store
    store = Store(tmp_path / "store")
    damaged = store.version_dir("breeds", "toy", v2) / "examples.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])  # truncated
    event = sorted((store.benchmark_dir("breeds", "toy-good") / "publications").glob("*.json"))[-1]
    event.write_text('{"version": "tru')  # a truncated publication event
    result = refresh_catalog(catalog, store.root)
    assert result.ok and len(result.problems) == 2
    assert any(str(damaged) in p for p in result.problems) and any(str(event) in p for p in result.problems)
    with duckdb.connect(str(catalog), read_only=True) as con:
        # toy's latest event names v2, which is damaged: toy falls back to v1, everything else reads
        assert con.execute("SELECT benchmark, version FROM benchmarks ORDER BY 1").fetchall() == [("toy", v1)]
        assert con.execute("SELECT count(*) FROM catalog_problems").fetchone() == (2,)
    assert [v.version for v in store.versions("toy")] == [v1, v2]  # versions still lists, no crash


def test_a_moved_home_is_noticed_and_the_catalog_rebuilt(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    import shutil

    from shiftbench.catalog import open_catalog

    catalog, (_, v2) = published_store
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(tmp_path / "store", moved / "store")
    shutil.move(catalog, moved / "catalog.duckdb")
    con, refreshed = open_catalog(moved / "catalog.duckdb", moved / "store")
    with con:
        assert refreshed is not None and refreshed.ok
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark = 'toy'").fetchone() == (v2,)
        store = con.execute("SELECT value FROM catalog_info WHERE key = 'store'").fetchone()
    assert store == (str((moved / "store").resolve()),)


def test_a_moved_home_whose_catalog_cannot_be_rebuilt_never_reads_the_old_store(
    published_store: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from shiftbench import catalog as catalog_module
    from shiftbench.errors import StoreError

    catalog, _ = published_store
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copytree(tmp_path / "store", moved / "store")  # the old store stays where the catalog points
    shutil.copy(catalog, moved / "catalog.duckdb")

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog_module, "_write", full)
    with pytest.raises(StoreError, match=r"not refreshed: the disk is full; no catalog of .*moved/store to query"):
        catalog_module.open_catalog(moved / "catalog.duckdb", moved / "store")


def test_a_catalog_that_cannot_be_written_says_so_and_keeps_the_old_one(
    published_store: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import shiftbench.catalog as catalog_module

    catalog, _ = published_store
    before = catalog.read_bytes()

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog_module, "_write", full)
    result = refresh_catalog(catalog, tmp_path / "store")
    assert not result.ok and "the disk is full" in result.reason
    assert catalog.read_bytes() == before
    assert not list(catalog.parent.glob(".catalog.duckdb.*.tmp"))
