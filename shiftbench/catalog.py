"""The DuckDB catalog: ``$SHIFTBENCH_HOME/catalog.duckdb`` with views over the store.

Views are created from the SQL files in ``shiftbench/sql/catalog/``: ``create_base_views.sql``
(publications, latest versions, ``benchmarks`` and ``benchmarks_history``) and, for every
table that has a contract, ``create_table_views.sql`` (``<table>`` and ``<table>_history``), or
``create_result_views.sql`` for results tables, whose views carry ``is_current`` (the split they
were trained on is still the latest) and show only current results. A table whose contract has an SQL file beside it
(``<contract>.sql``) is a view computed from other tables when queried (MetaShift's
``metashift_distances`` from the embeddings, ``metashift_subset_images`` from the stored annotations),
over the versions that store it too; it is created after the tables it reads.

The catalog is derived from the store and rebuilt after every publish:

- **Readers never block a refresh, and never see half of one.** A refresh writes a new catalog in a
  temporary file and renames it over ``catalog.duckdb`` (atomic); a reader that had the old file open
  keeps its consistent view, the next one opens the new file. Writers take turns (a lock file).
- **One damaged version never takes the others down.** Views list the files of intact versions
  explicitly (manifest readable, every file present with its recorded size) and the publication
  events that parse; what was left out is recorded in ``catalog_problems`` and returned.
- **A moved home is noticed.** ``catalog_info`` records the store the views read; shiftbench rebuilds
  a catalog whose store is elsewhere before reading it (a DuckDB shell opened on a moved catalog
  should run ``shiftbench catalog`` first).
- **A refresh that cannot be written** (a full disk) leaves the previous catalog as it was and says
  why: the store, not the catalog, is the truth, and ``shiftbench catalog`` rebuilds it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import duckdb
from filelock import FileLock, Timeout

from shiftbench.contracts import Contract, contracts, empty_relation
from shiftbench.errors import StoreError, disk_full

SQL_DIR = Path(str(resources.files("shiftbench") / "sql"))  # package data, as the contracts
LOCK_TIMEOUT_S = 120.0
_PUBLICATION_COLUMNS = {
    "family": "VARCHAR",
    "benchmark": "VARCHAR",
    "version": "VARCHAR",
    "published_at": "VARCHAR",
}


@dataclass(frozen=True)
class CatalogRefresh:
    """What a refresh did: whether the catalog now reflects the store, and what it left out."""

    ok: bool
    reason: str = ""  # why it was not refreshed
    problems: list[str] = field(default_factory=list)  # damaged versions or events left out

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class StoreContents:
    tables: dict[str, list[Path]]  # table -> files of intact versions
    publications: list[tuple[str, str, str, str]]  # (family, benchmark, version, published_at)
    problems: list[str]


def scan_store(store: Path) -> StoreContents:
    """The intact versions' files and the readable publication events (a cheap check: sizes, not hashes)."""
    from shiftbench.store import StagedVersion, Store

    reader = Store(store)
    tables: dict[str, list[Path]] = {}
    publications: list[tuple[str, str, str, str]] = []
    problems: list[str] = []
    if not store.is_dir():
        return StoreContents(tables, publications, problems)
    for family_dir in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for bench_dir in sorted(p for p in family_dir.iterdir() if p.is_dir()):
            intact: set[str] = set()
            versions_dir = bench_dir / "versions"
            for version_dir in sorted(versions_dir.iterdir() if versions_dir.is_dir() else []):
                if version_dir.name.startswith(".") or not (version_dir / "manifest.json").exists():
                    continue
                staged = StagedVersion(family_dir.name, bench_dir.name, version_dir.name, version_dir, False)
                problem = reader.damage(staged, checksums=False)
                if problem is not None:
                    problems.append(problem)
                    continue
                intact.add(version_dir.name)
                for path in sorted(version_dir.glob("*.parquet")):
                    tables.setdefault(path.stem, []).append(path)
            for event in reader.publications(family_dir.name, bench_dir.name):
                if event["version"] in intact:
                    publications.append((family_dir.name, bench_dir.name, event["version"], event["published_at"]))
    problems.extend(sorted(reader.problems))
    return StoreContents(tables, publications, problems)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _table_source(contents: StoreContents, contract: Contract) -> str:
    files = contents.tables.get(contract.table)
    if files:
        listed = ", ".join(_literal(str(path)) for path in files)
        # Versions written before a column joined the contract lack it: the empty typed relation adds
        # it as NULL, so views (and readers) bind whatever mix of older and newer files the store holds.
        return (
            f"(SELECT * FROM read_parquet([{listed}], union_by_name = true) "
            f"UNION ALL BY NAME SELECT * FROM {empty_relation(contract.columns)})"
        )
    return empty_relation(contract.columns)


def render_catalog_sql(contents: StoreContents) -> list[str]:
    """The statements that create every view over the listed files (after ``publications_data`` exists)."""
    all_contracts = contracts()
    base = (SQL_DIR / "catalog" / "create_base_views.sql").read_text("utf-8")
    statements = [
        base.replace("{{publications}}", "publications_data").replace(
            "{{benchmarks}}", _table_source(contents, all_contracts["benchmarks"])
        )
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
    statements.append((SQL_DIR / "catalog" / "create_union_views.sql").read_text("utf-8"))
    return statements


def _stored_versions(contents: StoreContents, table: str) -> str:
    """The versions that store ``table`` as SQL literals ``'benchmark/version'`` (store/<family>/<benchmark>/
    versions/<version>/<table>.parquet), or ``''`` when none does."""
    keys = sorted({f"{path.parents[2].name}/{path.parent.name}" for path in contents.tables.get(table, [])})
    return ", ".join(_literal(key) for key in keys) or "''"


def _write(path: Path, contents: StoreContents, store: Path) -> None:
    columns = ", ".join(f"{name} {kind}" for name, kind in _PUBLICATION_COLUMNS.items())
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE publications_data ({columns})")
        if contents.publications:
            con.executemany("INSERT INTO publications_data VALUES (?, ?, ?, ?)", contents.publications)
        for sql in render_catalog_sql(contents):
            con.execute(sql)
        con.execute("CREATE TABLE catalog_info (key VARCHAR, value VARCHAR)")
        info = {"store": str(store.resolve()), "refreshed_at": datetime.now(UTC).isoformat(timespec="seconds")}
        con.executemany("INSERT INTO catalog_info VALUES (?, ?)", list(info.items()))
        con.execute("CREATE TABLE catalog_problems (problem VARCHAR)")
        if contents.problems:
            con.executemany("INSERT INTO catalog_problems VALUES (?)", [(p,) for p in contents.problems])
        con.execute("CHECKPOINT")


def refresh_catalog(catalog_path: Path, store: Path, *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> CatalogRefresh:
    """Rebuild the catalog from the store; never raises for a catalog it could not write (says why)."""
    try:
        catalog_path.parent.mkdir(parents=True, exist_ok=True)
        contents = scan_store(store)
        # One writer at a time; readers never wait (they keep the file they opened).
        with FileLock(catalog_path.with_name(f".{catalog_path.name}.lock"), timeout=lock_timeout_s):
            tmp = catalog_path.with_name(f".{catalog_path.name}.{uuid.uuid4().hex}.tmp")
            try:
                _write(tmp, contents, store)
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
    return CatalogRefresh(True, problems=contents.problems)


def catalog_store(catalog_path: Path) -> str | None:
    """The store a catalog's views read (None when the file is missing or not a catalog)."""
    if not catalog_path.is_file():
        return None
    try:
        with duckdb.connect(str(catalog_path), read_only=True) as con:
            row = con.execute("SELECT value FROM catalog_info WHERE key = 'store'").fetchone()
    except duckdb.Error:
        return None
    return str(row[0]) if row else None


def open_catalog(catalog_path: Path, store: Path) -> tuple[duckdb.DuckDBPyConnection, CatalogRefresh | None]:
    """A read-only connection to a catalog of ``store``, rebuilt first when missing, damaged or moved."""
    refreshed = None
    if catalog_store(catalog_path) != str(store.resolve()):
        refreshed = refresh_catalog(catalog_path, store)
        if not refreshed.ok:  # the file there is not this store's catalog: never read another store
            raise StoreError(f"{refreshed.reason}; no catalog of {store} to query")
    return duckdb.connect(str(catalog_path), read_only=True), refreshed


def refresh_and_report(catalog_path: Path, store: Path) -> CatalogRefresh:
    """Refresh, and tell whoever listens (the CLI, a Dagster run's log) when it could not or left things out."""
    from shiftbench import progress

    result = refresh_catalog(catalog_path, store)
    if not result.ok:
        detail = f"{result.reason}; the versions are published (the store is the truth): run `shiftbench catalog`"
        progress.report(progress.Event("catalog", str(catalog_path), status="stale", detail=detail))
    for problem in result.problems:
        progress.report(progress.Event("catalog", str(catalog_path), status="damaged", detail=problem))
    return result
