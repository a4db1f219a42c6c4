"""The DuckDB catalog: views bind on an empty store, show latest vs history, run the shipped SQL, read a moved
or copied warehouse where it is, never serve a file changed since the refresh, and never write a file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.store import Store
from shiftbench.store.contracts import contracts
from shiftbench.warehouse.catalog import SQL_DIR, STORAGE_VERSION, open_catalog, refresh_catalog
from shiftbench.warehouse.publishing import check_version

from .conftest import PROJECT, ToyDir, toy_tables
from .test_cli import built_once


def test_views_exist_and_are_empty_on_an_empty_store(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.duckdb"
    assert refresh_catalog(catalog, tmp_path / "store")
    with duckdb.connect(str(catalog), read_only=True) as con:
        for table in contracts():
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
            assert con.execute(f"SELECT count(*) FROM {table}_history").fetchone() == (0,)


@pytest.fixture(scope="module")
def _store_published_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store_published")


@pytest.fixture
def published_store(tmp_path: Path, toy_breeds_dir: ToyDir, _store_published_once: Path) -> tuple[Path, list[str]]:
    """A store with two published versions of toy (the first no longer latest), one only staged, and toy-good;
    built once per module and worker, each test on its own copy, its catalog built over that copy."""
    store = Store(tmp_path / "store")

    def build() -> None:
        for seed in (0, 3):
            staged = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed))
            check_version(store, staged)
            store.log.publish(staged)
        store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=4))  # staged, never published
        other = store.writer.stage("breeds", "toy-good", toy_tables(toy_breeds_dir(), split="good"))
        check_version(store, other)
        store.log.publish(other)

    built_once(_store_published_once, tmp_path, ("store",), build)
    refresh_catalog(tmp_path / "catalog.duckdb", store.root)
    toy = store.log.versions("toy")
    assert [v.is_latest for v in toy] == [False, True]  # oldest first: seed 0's, then seed 3's
    versions = [v.version for v in toy]
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


# A reader in another process: it queries until told to stop, and says when its first query is done (so the
# refreshes start while it reads) and how many it made; its last query starts after the refreshes ended. It pauses
# 50 ms between queries (each refresh still meets several): two readers that never pause would take most of two
# cores from the refreshes they are there to meet.
_READER = """
import pathlib, sys, time
import duckdb
catalog, stop = sys.argv[1], pathlib.Path(sys.argv[2])
n, stopping = 0, False
while not stopping:
    stopping = stop.exists()
    with duckdb.connect(catalog, read_only=True) as con:
        found = con.execute("SELECT count(*) FROM benchmarks").fetchone()[0]
    assert found == 2, found
    n += 1
    if n == 1:
        print("reading", flush=True)
    time.sleep(0.05)
print("ok", n)
"""


def test_readers_never_block_a_refresh_and_keep_a_consistent_view(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """Refreshes replace the catalog file atomically: readers in other processes, querying all the while (from
    before the first refresh to after the last), never fail and never see a half-written catalog."""
    catalog, _ = published_store
    stop = tmp_path / "stop"
    command = [sys.executable, "-c", _READER, str(catalog), str(stop)]
    readers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        assert [proc.stdout.readline() for proc in readers if proc.stdout] == ["reading\n"] * 2
        holder = duckdb.connect(str(catalog), read_only=True)  # an open reader (a user's DuckDB shell)
        try:
            for _ in range(10):  # each one while both readers query
                assert refresh_catalog(catalog, tmp_path / "store").ok
            assert holder.execute("SELECT count(*) FROM benchmarks").fetchone() == (2,)
        finally:
            holder.close()
    finally:
        stop.touch()
        outs = [proc.communicate(timeout=120)[0] for proc in readers]
    for proc, out in zip(readers, outs, strict=True):
        assert proc.returncode == 0 and out.split()[0] == "ok" and int(out.split()[1]) >= 2, out


def test_a_damaged_version_is_left_out_and_named_not_fatal(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    catalog, (v1, v2) = published_store
    store = Store(tmp_path / "store")
    damaged = store.layout.version_dir("breeds", "toy", v2) / "examples.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])  # truncated
    event = sorted((store.layout.benchmark_dir("breeds", "toy-good") / "publications").glob("*.json"))[-1]
    event.write_text('{"version": "tru')  # a truncated publication event
    result = refresh_catalog(catalog, store.root)
    assert result.ok and len(result.problems) == 2
    assert any(str(damaged) in p for p in result.problems) and any(str(event) in p for p in result.problems)
    with duckdb.connect(str(catalog), read_only=True) as con:
        # toy's latest event names v2, which is damaged: v2 is still toy's latest (as `versions` says), its rows are
        # left out, and v1 is never served as the latest in its place; everything else reads
        assert con.execute("SELECT benchmark, version FROM latest_versions").fetchall() == [("toy", v2)]
        assert con.execute("SELECT benchmark, version FROM benchmarks ORDER BY 1").fetchall() == []
        history = "SELECT version, is_latest FROM benchmarks_history WHERE benchmark = 'toy'"
        assert con.execute(history).fetchall() == [(v1, False)]
        assert con.execute("SELECT count(*) FROM catalog_problems").fetchone() == (2,)
    versions = store.log.versions("toy")  # versions still lists, no crash, and says the same latest
    assert [(v.version, v.is_latest) for v in versions] == [(v1, False), (v2, True)]


def test_a_moved_or_copied_home_is_read_where_it_is_without_a_rebuild(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The views name their files relative to the warehouse: a moved home (same file system, the files' states
    kept) is read as it is, no rebuild; a copy (every file new to the catalog) is verified once, then read from
    the copy even after the original is gone."""
    catalog, (_, v2) = published_store
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(tmp_path / "store", moved / "store")
    shutil.move(catalog, moved / "catalog.duckdb")
    con, refreshed = open_catalog(moved / "catalog.duckdb", moved / "store")
    with con:
        assert refreshed is None  # nothing to rebuild: the views find the store beside the catalog
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark = 'toy'").fetchone() == (v2,)

    copied = tmp_path / "copied"
    shutil.copytree(moved, copied)
    shutil.rmtree(moved)
    con, refreshed = open_catalog(copied / "catalog.duckdb", copied / "store")
    with con:
        assert refreshed is not None and refreshed.ok and refreshed.changed and not refreshed.problems
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark = 'toy'").fetchone() == (v2,)
        assert con.execute("SELECT count(*) FROM examples").fetchone() != (0,)
    con, refreshed = open_catalog(copied / "catalog.duckdb", copied / "store")
    con.close()
    assert refreshed is None  # the copy's states are recorded now: the next reader only stats them


def test_views_hold_no_absolute_path_and_the_file_opens_in_duckdb_1_4(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    catalog, _ = published_store
    with duckdb.connect(str(catalog), read_only=True) as con:
        views = con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall()
        files = [name for (name,) in con.execute("SELECT path FROM catalog_files").fetchall()]
    assert views and not any(str(tmp_path) in sql for (sql,) in views)
    assert files and all(name.startswith("store/breeds/toy") for name in files)
    # DuckDB's storage format number, after the magic bytes: 67 is what DuckDB 1.4 writes and reads (1.4.5 opens
    # 64-67); DuckDB 2.x's own format would lock 1.x clients out.
    header = catalog.read_bytes()[8:20]
    assert header[:4] == b"DUCK" and int.from_bytes(header[4:], "little") == 67
    # pyproject's lower bound is the DuckDB the storage version is named after: one cannot move without the other.
    pyproject = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    [bound] = [d for d in pyproject["project"]["dependencies"] if d.startswith("duckdb")]
    assert bound.startswith(f"duckdb>={STORAGE_VERSION.removeprefix('v').removesuffix('.0')},")


def test_a_catalog_that_cannot_be_refreshed_is_read_only_once_its_changed_files_verify(
    published_store: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copied home whose catalog cannot be rewritten (a full disk, a read-only copy): its files are all new to
    the catalog, so they are verified against their checksums and read from the copy; a damaged one stops the
    read (never served), and a file there that is no catalog is never read as one."""
    from shiftbench.errors import StoreError
    from shiftbench.warehouse import catalog as catalog_module

    catalog, (_, v2) = published_store
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "store", moved / "store")
    shutil.copy(catalog, moved / "catalog.duckdb")
    shutil.rmtree(tmp_path / "store")  # the copy is read, not the original

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog_module, "_write", full)
    con, refreshed = open_catalog(moved / "catalog.duckdb", moved / "store")
    with con:
        assert refreshed is not None and not refreshed.ok
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark = 'toy'").fetchone() == (v2,)

    damaged = Store(moved / "store").layout.version_dir("breeds", "toy", v2) / "examples.parquet"
    damaged.write_bytes(_flipped(damaged.read_bytes()))
    with pytest.raises(StoreError, match=rf"{damaged}: checksum mismatch .* the disk is full"):
        open_catalog(moved / "catalog.duckdb", moved / "store")

    (moved / "catalog.duckdb").write_bytes(b"")
    with pytest.raises(StoreError, match=r"not refreshed: the disk is full; no catalog of .*moved/store to query"):
        open_catalog(moved / "catalog.duckdb", moved / "store")


def test_a_catalog_that_cannot_be_written_says_so_and_keeps_the_old_one(
    published_store: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import shiftbench.warehouse.catalog as catalog_module

    catalog, _ = published_store
    before = catalog.read_bytes()

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog_module, "_write", full)
    result = refresh_catalog(catalog, tmp_path / "store")
    assert not result.ok and "the disk is full" in result.reason
    assert catalog.read_bytes() == before
    assert not list(catalog.parent.glob(".catalog.duckdb.*.tmp"))


def _flipped(data: bytes) -> bytes:
    """The same bytes with one in the middle changed: same size, different content."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _same_size(path: Path) -> None:
    path.write_bytes(_flipped(path.read_bytes()))


def _longer(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0" * 64)


def _same_size_mtime_put_back(path: Path) -> None:
    before = path.stat()
    _same_size(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # only the ctime (and the content) tell now


def _replaced_mtime_put_back(path: Path) -> None:
    before = path.stat()
    other = path.with_name("rewritten.tmp")
    other.write_bytes(_flipped(path.read_bytes()))
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    other.replace(path)  # a new inode under the old name, same size and mtime


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_same_size, "checksum mismatch"),
        (_longer, "bytes, the manifest of version"),
        (_same_size_mtime_put_back, "checksum mismatch"),
        (_replaced_mtime_put_back, "checksum mismatch"),
    ],
)
def test_data_changed_after_the_refresh_is_never_served_by_sql(
    published_store: tuple[Path, list[str]],
    tmp_path: Path,
    cli_env: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], None],
    problem: str,
) -> None:
    """A version's file rewritten after the catalog was built (at its old size, with its mtime put back, or
    replaced by another file) is noticed by the next `sql`, verified against its checksum, left out and named:
    it is still the latest (as `versions` says) and no older version is served in its place (the older one stays in
    the history); later refreshes keep it out; repaired, it comes back."""
    _, (v1, v2) = published_store
    cli_env(SHIFTBENCH_HOME=str(tmp_path))
    path = Store(tmp_path / "store").layout.version_dir("breeds", "toy", v2) / "examples.parquet"
    original = path.read_bytes()
    query = "SELECT DISTINCT version FROM examples WHERE benchmark = 'toy'"
    history = "SELECT DISTINCT version FROM examples_history WHERE benchmark = 'toy'"
    damage(path)
    assert main(["sql", query, "--csv"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["version"]
    assert captured.err.splitlines() == [
        "warning: 1 listed file(s) changed or gone since the catalog was built: their versions re-checked",
        *[line for line in captured.err.splitlines() if line.startswith("warning: left out (damaged): ")],
    ]
    assert f"warning: left out (damaged): {path}: " in captured.err and problem in captured.err
    assert main(["catalog"]) == 0  # as every publish does: the damaged version stays out, though its size is right
    assert f"left out (damaged): {path}: " in capsys.readouterr().out
    assert main(["sql", query, "--csv"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["version"]
    assert captured.err == "warning: 1 damaged file(s) left out of the catalog: see `shiftbench check`\n"
    assert main(["sql", history, "--csv"]) == 0
    assert capsys.readouterr().out.split() == ["version", v1]
    path.write_bytes(original)
    assert main(["catalog"]) == 0 and main(["sql", query, "--csv"]) == 0
    assert capsys.readouterr().out.split()[-1] == v2


def test_a_touched_file_is_verified_once_and_still_served(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    catalog, (_, v2) = published_store
    path = Store(tmp_path / "store").layout.version_dir("breeds", "toy", v2) / "examples.parquet"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    con, refreshed = open_catalog(catalog, tmp_path / "store")
    with con:
        assert refreshed is not None and refreshed.changed == [f"store/breeds/toy/versions/{v2}/examples.parquet"]
        assert not refreshed.problems
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark = 'toy'").fetchone() == (v2,)
    con, refreshed = open_catalog(catalog, tmp_path / "store")
    con.close()
    assert refreshed is None


def _written_files(root: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in root.rglob("*")}


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("COPY (SELECT 1) TO '{outside}/x.csv'", "got COPY"),
        ("COPY examples TO 'store/x.parquet'", "got COPY"),
        ("COPY (SELECT 1) TO '{store}/breeds/toy/x.csv'", "got COPY"),
        ("EXPORT DATABASE '{outside}/export'", "got EXPORT"),
        ("ATTACH '{outside}/new.duckdb' AS other", "got ATTACH"),
        ("INSTALL httpfs", "got INSTALL"),
        ("LOAD httpfs", "got LOAD"),
        ("SET enable_external_access = true", "got SET"),
        ("SET allowed_directories = ['/']", "got SET"),
        ("RESET lock_configuration", "got RESET"),
        ("SET VARIABLE shiftbench_home = '{outside}'", "got SET"),
        ("CREATE TABLE t AS SELECT 1", "got CREATE TABLE"),
        ("SELECT 1; COPY (SELECT 1) TO '{outside}/y.csv'", "statement 2 is COPY"),
        ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{outside}/z.csv'", "got EXPLAIN ANALYZE"),
        ("PRAGMA enable_profiling", "got PRAGMA"),
        ("CALL enable_logging(storage = 'file', storage_path = '{outside}/log')", "got CALL"),
        ("CHECKPOINT", "got CHECKPOINT"),
    ],
)
def test_sql_refuses_anything_but_queries_in_one_line_and_writes_nothing(
    published_store: tuple[Path, list[str]],
    tmp_path: Path,
    cli_env: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    query: str,
    kind: str,
) -> None:
    from .test_cli import assert_one_line

    cli_env(SHIFTBENCH_HOME=str(tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir()
    before = _written_files(tmp_path)
    assert main(["sql", query.format(outside=outside, store=tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert_one_line(err, "error: parameter 'query': the catalog is read-only: queries only (SELECT, FROM, WITH, ")
    assert err.rstrip().endswith(f"); {kind}"), err
    assert _written_files(tmp_path) == before


def test_the_catalog_connection_itself_writes_no_file_and_still_reads(
    published_store: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """Below `sql`'s check, DuckDB's own controls: only the listed files can be opened, no database attached, no
    extension loaded, no setting changed (locked); queries, spilling to the temporary directory included, work."""
    catalog, _ = published_store
    outside = tmp_path / "outside"
    outside.mkdir()
    con, _ = open_catalog(catalog, tmp_path / "store", memory_limit="100MB")
    before = _written_files(tmp_path / "store")
    with con:
        for statement in (
            f"COPY (SELECT 1) TO '{outside}/x.csv'",
            f"COPY (SELECT 1) TO '{tmp_path}/store/x.csv'",
            f"EXPORT DATABASE '{outside}/export'",
            f"ATTACH '{outside}/new.duckdb' AS other",
            "INSTALL httpfs",
            "LOAD httpfs",
            "SET enable_external_access = true",
            "SET allowed_directories = ['/']",
            "RESET lock_configuration",
            "SET memory_limit = '8GB'",
            "CREATE TABLE t AS SELECT 1",
            f"SELECT * FROM read_text('{outside}/../catalog.duckdb')",
        ):
            with pytest.raises(duckdb.Error):
                con.execute(statement)
        assert list(outside.iterdir()) == []
        assert con.execute("SELECT count(*) > 0 FROM examples").fetchone() == (True,)
        # A sort of ~300 MB under a 100 MB limit: DuckDB spills to <catalog>.tmp, which it may still write.
        assert not catalog.with_name("catalog.duckdb.tmp").exists()
        big = "SELECT count(*) FROM (SELECT i, repeat('x', 40) || i AS s FROM range(5000000) t(i) ORDER BY s DESC)"
        assert con.execute(big).fetchone() == (5000000,)
        assert catalog.with_name("catalog.duckdb.tmp").is_dir()
    assert _written_files(tmp_path / "store") == before
