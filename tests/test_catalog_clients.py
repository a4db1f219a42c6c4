"""The catalog from DuckDB clients that are not shiftbench: a warehouse moved after its catalog was built, opened
from separate processes in other working directories, with nothing set, by .venv's DuckDB 2.x, .venv-clients'
DuckDB 1.4.5 (the oldest line pyproject allows) and the DuckDB CLI, as the README shows them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shiftbench.store import Store
from shiftbench.warehouse.catalog import open_catalog, refresh_catalog
from shiftbench.warehouse.publishing import check_version

from .conftest import CLIENTS_PYTHON, PROJECT, ToyDir, missing, run_client, toy_tables

# Every view of the catalog, counted: one that does not bind (a path that does not resolve, SQL the client's
# DuckDB does not know) fails the run.
COUNT_EVERY_VIEW = """
import json, sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
views = [name for (name,) in con.execute(
    "SELECT view_name FROM duckdb_views() WHERE NOT internal AND database_name = current_database() ORDER BY 1"
).fetchall()]
print(json.dumps({"duckdb": duckdb.__version__, "counts": {v: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0]
                                                          for v in views}}))
"""

# The catalog attached to another database: DuckDB cannot tell the views where it is until one line says so.
ATTACHED = """
import sys
import duckdb
con = duckdb.connect()
con.execute(f"ATTACH '{sys.argv[1]}' AS sb (READ_ONLY)")
try:
    con.execute("SELECT count(*) FROM sb.examples").fetchall()
except duckdb.IOException as exc:
    print(str(exc).splitlines()[0])
con.execute("SET VARIABLE shiftbench_home = ?", [sys.argv[2]])
print(con.execute("SELECT count(*) FROM sb.examples").fetchall()[0][0])
"""


def _readme_line(prefix: str) -> str:
    """The README's example that starts with ``prefix`` (the one a user copies)."""
    [line] = [line for line in (PROJECT / "README.md").read_text().splitlines() if line.startswith(prefix)]
    return line


@pytest.fixture
def moved_warehouse(tmp_path: Path, toy_breeds_dir: ToyDir) -> tuple[Path, dict[str, int], list[tuple[str, int]]]:
    """A warehouse built in ``project/warehouse`` and moved (``mv``) to ``elsewhere/warehouse``: (the moved
    catalog, shiftbench's count of every view, the README query's rows), both read before the move."""
    home = tmp_path / "project" / "warehouse"
    store = Store(home / "store")
    for benchmark, seed in (("toy", 0), ("toy", 3), ("toy-good", 1)):
        staged = store.writer.stage("breeds", benchmark, toy_tables(toy_breeds_dir(), seed=seed))
        check_version(store, staged)
        store.log.publish(staged)
    assert refresh_catalog(home / "catalog.duckdb", home / "store").ok
    con, _ = open_catalog(home / "catalog.duckdb", home / "store")
    with con:
        views = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
        counts = {v: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for (v,) in views}  # type: ignore[index]
        rows = con.execute("SELECT split, count(*) FROM examples GROUP BY split ORDER BY 1").fetchall()
    (tmp_path / "elsewhere").mkdir()
    subprocess.run(["mv", str(home), str(tmp_path / "elsewhere")], check=True)
    assert not home.exists()
    return tmp_path / "elsewhere" / "warehouse" / "catalog.duckdb", counts, rows


def _check_readme_python(python: Path, catalog: Path, rows: list[tuple[str, int]]) -> None:
    """The README's Python line, verbatim, from the folder holding the (moved) warehouse, as from the project."""
    line = _readme_line('.venv/bin/python -c "import duckdb')
    code = line.removeprefix('.venv/bin/python -c "').removesuffix('"')
    out = run_client(python, code, cwd=catalog.parent.parent)
    for split, count in rows:
        assert re.search(rf"│ {split}\s+│\s+{count} │", out), out


def _check_every_view(python: Path, catalog: Path, counts: dict[str, int], major: str) -> None:
    found = json.loads(run_client(python, COUNT_EVERY_VIEW, str(catalog), cwd=Path("/")))
    assert found["duckdb"].startswith(major)
    assert found["counts"] == counts
    assert counts["examples"] > 0 and counts["metashift_distances"] == 0  # data read; the lambda view binds too
    missing, found_after = run_client(python, ATTACHED, str(catalog), str(catalog.parent), cwd=Path("/")).splitlines()
    assert 'No files found that match the pattern "store/breeds/' in missing
    assert int(found_after) == counts["examples"]


def test_a_moved_warehouse_opens_in_duckdb_2_from_anywhere(
    moved_warehouse: tuple[Path, dict[str, int], list[tuple[str, int]]],
) -> None:
    catalog, counts, rows = moved_warehouse
    _check_every_view(Path(sys.executable), catalog, counts, "2.")
    _check_readme_python(Path(sys.executable), catalog, rows)


@pytest.mark.clients
def test_a_moved_warehouse_opens_in_duckdb_1_4_from_anywhere(
    moved_warehouse: tuple[Path, dict[str, int], list[tuple[str, int]]], clients_python: Path
) -> None:
    catalog, counts, rows = moved_warehouse
    _check_every_view(clients_python, catalog, counts, "1.4.")
    _check_readme_python(clients_python, catalog, rows)


@pytest.fixture
def duckdb_cli() -> Path:
    """The DuckDB CLI: .venv-clients' (duckdb-cli, scripts/clients-requirements.txt), else one on PATH."""
    found = CLIENTS_PYTHON.parent / "duckdb"
    if found.is_file():
        return found
    on_path = shutil.which("duckdb")
    if on_path is None:
        message = "no DuckDB CLI in .venv-clients or on PATH: run bash scripts/clients_env.sh"
        missing(message, "SHIFTBENCH_REQUIRE_CLIENTS")
    return Path(on_path)


@pytest.mark.clients
def test_a_moved_warehouse_opens_in_the_duckdb_cli_from_anywhere(
    moved_warehouse: tuple[Path, dict[str, int], list[tuple[str, int]]], duckdb_cli: Path
) -> None:
    """The README's CLI line, with the moved warehouse's path, run from the root directory."""
    catalog, _, rows = moved_warehouse
    line = _readme_line("duckdb -readonly ")
    command = line.replace("/path/to/warehouse/catalog.duckdb", str(catalog)).split(" ", 2)
    assert command[:2] == ["duckdb", "-readonly"], line
    sql = command[2].removeprefix(f"{catalog} ").strip('"')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "PYTHON"))}
    done = subprocess.run(
        [str(duckdb_cli), "-readonly", "-csv", str(catalog), sql],
        cwd="/", env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    header, *lines = done.stdout.splitlines()
    assert header == "split,count_star()", done.stdout
    assert sorted(lines) == [f"{split},{count}" for split, count in rows], done.stdout
