"""The DuckDB catalog: ``$SHIFTBENCH_HOME/catalog.duckdb`` with views over the store.

Views are created from the SQL files in ``sql/catalog/``: ``create_base_views.sql``
(publications, latest versions, ``benchmarks`` and ``benchmarks_history``) and, for every
table that has a contract, ``create_table_views.sql`` (``<table>`` and ``<table>_history``), or
``create_result_views.sql`` for results tables, whose views carry ``is_current`` (the split they
were trained on is still the latest) and show only current results.
Views read the Parquet files through globs, so a publish never needs to rewrite them; the
catalog is refreshed after each publish only so that a table's first version replaces the
empty placeholder relation. A catalog held open by another process (DuckDB allows one writer)
is retried, then left as is with a warning: the store, not the catalog, is the truth.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import duckdb

from shiftbench.contracts import Contract, contracts, empty_relation

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"
_PUBLICATION_COLUMNS = {
    "family": "VARCHAR",
    "benchmark": "VARCHAR",
    "version": "VARCHAR",
    "published_at": "VARCHAR",
}


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def table_glob(store: Path, table: str) -> str:
    return str(store / "*" / "*" / "versions" / "*" / f"{table}.parquet")


def _table_source(store: Path, contract: Contract) -> str:
    if any(store.glob(f"*/*/versions/*/{contract.table}.parquet")):
        return f"read_parquet({_literal(table_glob(store, contract.table))}, union_by_name = true)"
    return empty_relation(contract.columns)


def _publications_source(store: Path) -> str:
    if any(store.glob("*/*/publications/*.json")):
        pattern = str(store / "*" / "*" / "publications" / "*.json")
        columns = "{" + ", ".join(f"{k}: '{v}'" for k, v in _PUBLICATION_COLUMNS.items()) + "}"
        return f"read_json({_literal(pattern)}, columns = {columns}, format = 'auto')"
    return empty_relation(_PUBLICATION_COLUMNS)


def render_catalog_sql(store: Path) -> list[str]:
    """The statements that (re)create every view, with the store's paths filled in."""
    all_contracts = contracts()
    base = (SQL_DIR / "catalog" / "create_base_views.sql").read_text("utf-8")
    statements = [
        base.replace("{{publications}}", _publications_source(store)).replace(
            "{{benchmarks}}", _table_source(store, all_contracts["benchmarks"])
        )
    ]
    tables = (SQL_DIR / "catalog" / "create_table_views.sql").read_text("utf-8")
    results = (SQL_DIR / "catalog" / "create_result_views.sql").read_text("utf-8")
    for name, contract in sorted(all_contracts.items()):
        if name == "benchmarks":
            continue
        template = tables if contract.store_key == "benchmark" else results
        statements.append(
            template.replace("{{table}}", name)
            .replace("{{key}}", contract.store_key)
            .replace("{{source}}", _table_source(store, contract))
        )
    return statements


def refresh_catalog(catalog_path: Path, store: Path, *, attempts: int = 5) -> bool:
    """(Re)create the views; returns False if the catalog stayed locked by another process."""
    catalog_path.parent.mkdir(parents=True, exist_ok=True)
    statements = render_catalog_sql(store)
    for attempt in range(attempts):
        try:
            with duckdb.connect(str(catalog_path)) as con:
                for sql in statements:
                    con.execute(sql)
            return True
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            time.sleep(0.2 * (attempt + 1))
    warnings.warn(
        f"{catalog_path} is locked by another process; its views were not refreshed "
        "(run `shiftbench catalog` later; existing views still read the store)",
        stacklevel=2,
    )
    return False
