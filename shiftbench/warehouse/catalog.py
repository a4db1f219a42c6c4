"""The DuckDB catalog: ``$SHIFTBENCH_HOME/catalog.duckdb`` with views over the store.

Views are created from the SQL files in ``sql/catalog/``: ``create_base_views.sql``
(the ``shiftbench_files`` macro, publications, latest versions, ``benchmarks`` and ``benchmarks_history``) and, for
every table that has a contract, ``create_table_views.sql`` (``<table>`` and ``<table>_history``), or
``create_result_views.sql`` for results tables, whose views carry ``is_current`` (the split they
were trained on is still the latest) and show only current results. A table whose contract has an SQL file beside it
(``<contract>.sql``) is a view computed from other tables when queried (MetaShift's
``metashift_distances`` from the embeddings, ``metashift_subset_images`` from the stored annotations),
over the versions that store it too; it is created after the tables it reads.

The catalog is derived from the store and rebuilt after every publish:

- **Portable.** Views name their files relative to the warehouse (``store/...``) through the catalog's macro
  ``shiftbench_files``: a client that opens the file finds the store beside it, so a moved or copied warehouse
  works from any DuckDB client, in any working directory, with no rebuild; ``SET VARIABLE shiftbench_home`` says
  where the warehouse is where DuckDB cannot tell (docs/catalog.md). It is written in DuckDB 1.4's storage format
  (:data:`STORAGE_VERSION`), which every DuckDB from 1.4 on opens (pyproject's lower bound).
- **Readers never block a refresh, and never see half of one.** A refresh writes a new catalog in a
  temporary file and renames it over ``catalog.duckdb`` (atomic); a reader that had the old file open
  keeps its consistent view, the next one opens the new file. Writers take turns (a lock file).
- **One damaged version never takes the others down, and damage found later is not served.** Views list the
  files of intact versions explicitly and the publication events that parse; what was left out is recorded in
  ``catalog_problems`` and returned. shiftbench's reader notices files that changed since the refresh
  (:mod:`shiftbench.warehouse.catalog_files`) and refreshes, verifying them against their checksums, before it reads.
- **shiftbench's reader writes nothing.** :func:`open_catalog` opens the file read-only, allows DuckDB to touch
  only the files the views list, and locks that configuration; ``shiftbench sql`` also runs queries only
  (:func:`check_query`).
- **A refresh that cannot be written** (a full disk) leaves the previous catalog as it was and says
  why: the store, not the catalog, is the truth, and ``shiftbench catalog`` rebuilds it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import duckdb
import pyarrow as pa
from filelock import FileLock, Timeout

from shiftbench.warehouse.catalog_files import (
    CATALOG_LAYOUT,
    FileState,
    StoreContents,
    changed_files,
    damage_of,
    is_table_file,
    recorded_events,
    recorded_states,
    scan_store,
    states_in,
    vanished_events,
)
from shiftbench.store.contracts import Contract, contracts, empty_relation
from shiftbench.errors import InputError, StoreError, disk_full
from shiftbench.config.package_files import SQL_DIR
from shiftbench.scoring.selection import methods_view_sql

LOCK_TIMEOUT_S = 120.0
# The storage format the catalog is written in: DuckDB 1.4 and every later version open it (DuckDB 2.x writes
# a format 1.x cannot read unless told). pyproject's lower bound on duckdb is the same 1.4: keep them together.
STORAGE_VERSION = "v1.4.0"
HOME_VARIABLE = "shiftbench_home"  # SET VARIABLE shiftbench_home = '<warehouse>': where the views find store/
# What `shiftbench sql` runs: queries (DESCRIBE, SHOW, SUMMARIZE, FROM-first and PIVOT with its IN list are
# queries to DuckDB's parser too). Anything else could write (COPY, EXPORT, ATTACH, INSTALL, SET, EXPLAIN ANALYZE
# of a COPY, PRAGMA, CALL) and is refused before DuckDB sees it.
QUERY_TYPES = frozenset({duckdb.StatementType.SELECT.name})
_PUBLICATION_COLUMNS = {
    "family": "VARCHAR",
    "benchmark": "VARCHAR",
    "version": "VARCHAR",
    "published_at": "VARCHAR",
}
_FILE_COLUMNS = pa.schema(
    [
        ("path", pa.string()),  # relative to the warehouse, as the views name it
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("inode", pa.uint64()),
    ]
)


@dataclass(frozen=True)
class CatalogRefresh:
    """What a refresh did: whether the catalog now reflects the store, and what it left out."""

    ok: bool
    reason: str = ""  # why it was not refreshed
    problems: list[str] = field(default_factory=list)  # damaged versions or events left out
    changed: list[str] = field(default_factory=list)  # listed files that had changed since the last refresh

    def __bool__(self) -> bool:
        return self.ok


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _table_source(contents: StoreContents, contract: Contract) -> str:
    files = contents.tables.get(contract.table)
    if files:
        listed = ", ".join(_literal(name) for name in files)
        # Versions written before a column joined the contract lack it: the empty typed relation adds
        # it as NULL, so views (and readers) bind whatever mix of older and newer files the store holds.
        return (
            f"(SELECT * FROM read_parquet(shiftbench_files([{listed}]), union_by_name = true) "
            f"UNION ALL BY NAME SELECT * FROM {empty_relation(contract.columns)})"
        )
    return empty_relation(contract.columns)


def render_catalog_sql(contents: StoreContents) -> list[str]:
    """The statements that create every view over the listed files (after ``publications_data`` exists)."""
    all_contracts = contracts()
    base = (SQL_DIR / "catalog" / "create_base_views.sql").read_text("utf-8")
    statements = [
        base.replace("{{publications}}", "publications_data")
        .replace("{{latest}}", "latest_data")
        .replace("{{benchmarks}}", _table_source(contents, all_contracts["benchmarks"]))
    ]
    tables = (SQL_DIR / "catalog" / "create_table_views.sql").read_text("utf-8")
    results = (SQL_DIR / "catalog" / "create_result_views.sql").read_text("utf-8")
    derived = []
    for name, contract in sorted(all_contracts.items()):
        if name == "benchmarks":
            continue
        view = contract.path.with_suffix(".sql")
        if view.is_file():  # a view computed from other tables (after them), over the versions that store it too
            derived.append(
                view.read_text("utf-8")
                .replace("{{stored}}", _table_source(contents, contract))
                .replace("{{stored_versions}}", _stored_versions(contents, name))
            )
            continue
        template = tables if contract.store_key == "benchmark" else results
        statements.append(
            template.replace("{{table}}", name)
            .replace("{{key}}", contract.store_key)
            .replace("{{source}}", _table_source(contents, contract))
        )
    statements += derived
    statements.append(methods_view_sql())  # the selection methods a search's results are picked by
    statements.append((SQL_DIR / "catalog" / "create_union_views.sql").read_text("utf-8"))
    return statements


def _stored_versions(contents: StoreContents, table: str) -> str:
    """The versions that store ``table`` as SQL literals ``'benchmark/version'`` (store/<family>/<benchmark>/
    versions/<version>/<table>.parquet), or ``''`` when none does."""
    paths = [PurePosixPath(name) for name in contents.tables.get(table, [])]
    keys = sorted({f"{path.parents[2].name}/{path.parent.name}" for path in paths})
    return ", ".join(_literal(key) for key in keys) or "''"


def _file_records(contents: StoreContents) -> pa.Table:
    names = sorted(contents.states)
    states = [contents.states[name] for name in names]
    columns = [names, *([getattr(s, f) for s in states] for f in ("size", "mtime_ns", "ctime_ns", "inode"))]
    return pa.Table.from_arrays([pa.array(c, type=t.type) for c, t in zip(columns, _FILE_COLUMNS, strict=True)],
                                schema=_FILE_COLUMNS)  # fmt: skip


def _write(path: Path, contents: StoreContents, home: Path, events: list[str]) -> None:
    columns = ", ".join(f"{name} {kind}" for name, kind in _PUBLICATION_COLUMNS.items())
    with duckdb.connect(str(path), config={"storage_compatibility_version": STORAGE_VERSION}) as con:
        con.execute(f"SET VARIABLE {HOME_VARIABLE} = ?", [str(home)])  # the views bind against the files now
        for table, rows in (("publications_data", contents.publications), ("latest_data", contents.latest)):
            con.execute(f"CREATE TABLE {table} ({columns})")
            if rows:
                con.executemany(f"INSERT INTO {table} VALUES (?, ?, ?, ?)", rows)
        con.execute("CREATE TABLE catalog_events (path VARCHAR)")
        if events:
            con.executemany("INSERT INTO catalog_events VALUES (?)", [(event,) for event in events])
        for sql in render_catalog_sql(contents):
            con.execute(sql)
        files = _file_records(contents)
        con.register("listed_files", files)
        con.execute("CREATE TABLE catalog_files AS SELECT * FROM listed_files ORDER BY path")
        con.unregister("listed_files")
        con.execute("CREATE TABLE catalog_info (key VARCHAR, value VARCHAR)")
        info = {
            "layout": CATALOG_LAYOUT,
            "store": "store",  # relative to the folder holding this file, as every path the views read
            "storage_version": STORAGE_VERSION,
            "written_by": f"duckdb {duckdb.__version__}",
            "refreshed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        con.executemany("INSERT INTO catalog_info VALUES (?, ?)", list(info.items()))
        con.execute("CREATE TABLE catalog_problems (problem VARCHAR)")
        if contents.problems:
            con.executemany("INSERT INTO catalog_problems VALUES (?)", [(p,) for p in contents.problems])
        con.execute("CHECKPOINT")


def refresh_catalog(catalog_path: Path, store: Path, *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> CatalogRefresh:
    """Rebuild the catalog from the store; never raises for a catalog it could not write (says why).

    Files whose state the previous catalog recorded are trusted on a cheap check while unchanged; every other
    version (new, changed, or damaged before) is verified against its checksums (:func:`scan_store`)."""
    home = catalog_path.parent.resolve()
    try:
        catalog_path.parent.mkdir(parents=True, exist_ok=True)
        known = recorded_states(catalog_path) or {}
        seen = recorded_events(catalog_path)
        changed = changed_files(home, known)
        contents = scan_store(store, home, known)
        contents.problems.extend(vanished_events(home, seen))  # kept below: said at every refresh, and by check
        # One writer at a time; readers never wait (they keep the file they opened).
        with FileLock(catalog_path.with_name(f".{catalog_path.name}.lock"), timeout=lock_timeout_s):
            tmp = catalog_path.with_name(f".{catalog_path.name}.{uuid.uuid4().hex}.tmp")
            try:
                _write(tmp, contents, home, sorted({*seen, *contents.events}))
                tmp.replace(catalog_path)
                # A write-ahead log left by a crashed writer of an older catalog must not replay onto this one.
                catalog_path.with_name(catalog_path.name + ".wal").unlink(missing_ok=True)
            finally:
                tmp.unlink(missing_ok=True)
                tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
    except Timeout:
        return CatalogRefresh(False, f"another refresh held {catalog_path} for {lock_timeout_s:.0f} s")
    except (OSError, duckdb.Error) as exc:
        reason = "the disk is full" if disk_full(exc, catalog_path.parent) else str(exc).splitlines()[0]
        return CatalogRefresh(False, f"{catalog_path} not refreshed: {reason}")
    return CatalogRefresh(True, problems=contents.problems, changed=changed)


def open_catalog(
    catalog_path: Path, store: Path, *, memory_limit: str | None = None
) -> tuple[duckdb.DuckDBPyConnection, CatalogRefresh | None]:
    """A read-only connection to the catalog of ``store`` that can write no file, refreshed first when it is
    missing, damaged or of another layout, or when a file it lists changed since it was built (the refresh
    verifies that version against its checksums and leaves it out if damaged: what it left out is returned).
    ``memory_limit`` bounds DuckDB's memory (its default: 80 % of RAM); beyond it, DuckDB spills to
    ``<catalog>.tmp``, which it may still write."""
    home = catalog_path.parent.resolve()
    opened = _connect(catalog_path, memory_limit)
    changed = None if opened is None else changed_files(home, opened[1])
    if opened is not None and not changed:
        return _locked(*opened, home), None
    if opened is not None:
        opened[0].close()
    refreshed = refresh_catalog(catalog_path, store)
    if not refreshed.ok:
        _unrefreshed(refreshed, catalog_path, store, changed)
    opened = _connect(catalog_path, memory_limit)
    if opened is None:  # replaced since by something that is no catalog: never read it
        raise StoreError(f"{catalog_path} is not a catalog of {store}: run `shiftbench catalog`")
    return _locked(*opened, home), refreshed


def _unrefreshed(refreshed: CatalogRefresh, catalog_path: Path, store: Path, changed: list[str] | None) -> None:
    """A catalog that could not be refreshed is read only when the files that changed are verified intact, and the
    publication log is as it recorded it (else it could name another latest version than the log)."""
    if changed is None:  # the file there is no catalog of this layout: never read another store's
        raise StoreError(f"{refreshed.reason}; no catalog of {store} to query")
    home = catalog_path.parent.resolve()
    log = [name for name in changed if not is_table_file(name)]
    if log and _latest_in_log(store) != _latest_in_catalog(catalog_path):
        raise StoreError(
            f"{home / log[0]}: the publication log changed since the catalog was built, and names other latest "
            f"versions; {refreshed.reason}: run `shiftbench catalog` where it can be written"
        )
    damaged = damage_of(home, changed)
    if damaged:
        raise StoreError(
            f"{damaged[0]} (changed since the catalog was built); {refreshed.reason}: "
            "run `shiftbench catalog` where it can be written"
        )


def _latest_in_log(store: Path) -> set[tuple[str, str, str]]:
    """Each benchmark's latest version as its log says now (family, benchmark, version)."""
    from shiftbench.store import Store
    from shiftbench.store.log import latest_event

    reader = Store(store)
    found = set()
    for family, benchmark in reader.layout.benchmarks():
        event = latest_event(reader.layout, family, benchmark, reader.log.events(family, benchmark))
        if event is not None:
            found.add((family, benchmark, str(event["version"])))
    return found


def _latest_in_catalog(catalog_path: Path) -> set[tuple[str, str, str]] | None:
    """Each benchmark's latest version as the catalog recorded it (None: unreadable)."""
    try:
        with duckdb.connect(str(catalog_path), read_only=True) as con:
            rows = con.execute("SELECT family, benchmark, version FROM latest_data").fetchall()
    except duckdb.Error:
        return None
    return {(str(f), str(b), str(v)) for f, b, v in rows}


def _connect(
    catalog_path: Path, memory_limit: str | None
) -> tuple[duckdb.DuckDBPyConnection, dict[str, FileState]] | None:
    """The catalog opened read-only with the file states it recorded (None: missing, unreadable, other layout)."""
    if not catalog_path.is_file():
        return None
    config: dict[str, str | bool | int | float | list[str]] = {}
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    try:
        con = duckdb.connect(str(catalog_path), read_only=True, config=config)
    except duckdb.Error:
        return None
    states = states_in(con)
    if states is None:
        con.close()
        return None
    return con, states


def _locked(con: duckdb.DuckDBPyConnection, states: dict[str, FileState], home: Path) -> duckdb.DuckDBPyConnection:
    """The views reading the store beside the catalog, DuckDB allowed to touch no file but those they list (no
    other file, no extension, no new database), and that configuration locked."""
    try:
        con.execute(f"SET VARIABLE {HOME_VARIABLE} = ?", [str(home)])
        con.execute("SET allowed_paths = ?", [[str(home / name) for name in sorted(states) if is_table_file(name)]])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def left_out(con: duckdb.DuckDBPyConnection, refreshed: CatalogRefresh | None) -> list[str]:
    """What a reader should be told the catalog leaves out: each damaged version when opening it refreshed it
    (files had changed since it was built), else how many the catalog lists in ``catalog_problems``."""
    said = []
    if refreshed is not None and refreshed.changed:
        changed = len(refreshed.changed)
        said.append(f"{changed} listed file(s) changed or gone since the catalog was built: their versions re-checked")
    if refreshed is not None and refreshed.problems:
        return said + [f"left out (damaged): {problem}" for problem in refreshed.problems]
    [(count,)] = con.execute("SELECT count(*) FROM catalog_problems").fetchall()
    if count:
        said.append(f"{count} damaged file(s) left out of the catalog: see `shiftbench check`")
    return said


def check_query(sql: str, parameter: str = "query") -> None:
    """Refuse anything but one query (one line naming ``parameter``): ``shiftbench sql`` reads the catalog, it never
    writes a file, attaches a database, loads an extension or changes a setting, whatever DuckDB would allow. A
    refused statement is named by what it starts with (``INSTALL``, ``USE``, ``RESET``), not DuckDB's class of it
    (``LOAD``, ``SET``); several statements are refused too (each is its own ``shiftbench sql``)."""
    try:
        statements = [(statement.type.name, statement.query) for statement in duckdb.extract_statements(sql)]
    except duckdb.Error as exc:
        raise InputError(str(exc).splitlines()[0], parameter=parameter) from None
    except ValueError:  # a statement type this duckdb's Python API cannot name (UPDATE EXTENSIONS in 2.0)
        statements = [("unnamed", sql)]
    if not statements:
        raise InputError("no statement: the query is empty or only comments", parameter=parameter)
    refused = [(number, text) for number, (kind, text) in enumerate(statements, 1) if kind not in QUERY_TYPES]
    if refused:
        number, text = refused[0]
        where = f"statement {number} is" if len(statements) > 1 else "got"
        raise InputError(
            "the catalog is read-only: queries only (SELECT, FROM, WITH, DESCRIBE, SHOW, SUMMARIZE); "
            f"{where} {statement_keyword(text)}",
            parameter=parameter,
        )
    if len(statements) > 1:
        raise InputError(
            f"one query at a time: got {len(statements)} statements (run each with its own `shiftbench sql`)",
            parameter=parameter,
        )


_COMMENTS = re.compile(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", re.S)
_QUERY_WORDS = {"SELECT", "FROM", "WITH", "VALUES", "DESCRIBE", "SHOW", "SUMMARIZE", "PIVOT", "UNPIVOT", "TABLE"}
_TWO_WORDS = {"ALTER", "CREATE", "DROP", "EXPLAIN", "FORCE", "UPDATE"}  # CREATE TABLE, EXPLAIN ANALYZE, ...


def statement_keyword(text: str) -> str:
    """What a statement starts with, as its writer wrote it (comments and blanks skipped): ``INSTALL``, ``RESET``,
    ``CREATE TABLE``; ``a statement of another kind`` when it starts with a query's word or none (the refused
    statement is then one DuckDB's Python API cannot name)."""
    skipped = _COMMENTS.match(text)
    words = re.findall(r"[A-Za-z_]+", text[skipped.end() if skipped else 0 :][:200])[:2]
    first = words[0].upper() if words else ""
    if not first or first in _QUERY_WORDS:  # a query's word: DuckDB's statement after it is the refused one
        return "a statement of another kind"
    return f"{first} {words[1].upper()}" if first in _TWO_WORDS and len(words) > 1 else first


def refresh_and_report(catalog_path: Path, store: Path) -> CatalogRefresh:
    """Refresh, and tell whoever listens (the CLI, a Dagster run's log) when it could not or left things out."""
    from shiftbench.runtime import progress

    result = refresh_catalog(catalog_path, store)
    if not result.ok:
        detail = f"{result.reason}; the versions are published (the store is the truth): run `shiftbench catalog`"
        progress.report(progress.Event("catalog", str(catalog_path), status="stale", detail=detail))
    for problem in result.problems:
        progress.report(progress.Event("catalog", str(catalog_path), status="damaged", detail=problem))
    return result


__all__ = [
    "HOME_VARIABLE",
    "LOCK_TIMEOUT_S",
    "QUERY_TYPES",
    "SQL_DIR",
    "STORAGE_VERSION",
    "CatalogRefresh",
    "FileState",
    "StoreContents",
    "check_query",
    "left_out",
    "open_catalog",
    "refresh_and_report",
    "refresh_catalog",
    "render_catalog_sql",
    "scan_store",
]
