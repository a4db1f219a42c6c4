"""What the catalog's damage check costs: refreshes (every version hashed, or the cheap check of unchanged ones),
opening it (a stat per listed file, then DuckDB's read-only, locked connection) and a query through it.

    .venv/bin/python bench/bench_catalog.py --store warehouse/store [--copies 10] [--runs 5] \
        [--record bench/figures/catalog.json]

``--hash-mib`` measures sha256's throughput on a file of that size (what verifying a version of that size
costs). The store is copied to a temporary warehouse first (nothing is written to it); ``--copies K`` adds K copies of
every version under other names (unpublished, so the views are unchanged, but listed, stat'ed and hashed like
the rest) for a larger store. Prints one line per measurement: the median and every run, in seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import records

from shiftbench.tables.fingerprint import sha256_file
from shiftbench.warehouse.catalog import open_catalog, refresh_catalog
from shiftbench.warehouse.catalog_files import changed_files, recorded_states


def _enlarge(store: Path, copies: int) -> None:
    for version_dir in sorted(store.glob("*/*/versions/*")):
        if version_dir.name.startswith("."):
            continue
        for k in range(copies):
            shutil.copytree(version_dir, version_dir.with_name(f"{version_dir.name[:12]}c{k:03d}"))


def _timed(runs: int, setup: Callable[[], None], work: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(runs):
        setup()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return times


RECORDING = records.start(None)  # main() starts it with --record
FIGURES: dict[str, dict] = {}


def _report(name: str, times: list[float], key: str) -> None:
    """Print a measurement's line and record its runs and median as the figure ``key``."""
    for number, seconds in enumerate(times):
        RECORDING.run(measurement=key, round=number, seconds=seconds)
    FIGURES[key] = records.median_figure(times, "s", 3, name)
    listed = ", ".join(f"{t:.3f}" for t in times)
    print(f"{name:<58} median {statistics.median(times):8.3f} s   ({listed})", flush=True)


def _open_and_query(catalog: Path, store: Path) -> None:
    con, _ = open_catalog(catalog, store)
    with con:
        con.execute("SELECT count(*) FROM examples").fetchone()


def _plain_query(catalog: Path) -> None:
    with duckdb.connect(str(catalog), read_only=True) as con:
        con.execute("SELECT count(*) FROM examples").fetchone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hash-mib", type=int, default=1024, help="size of a file to measure sha256's throughput")
    records.add_argument(parser)
    args = parser.parse_args()
    RECORDING.path = args.record
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        home = Path(tmp) / "warehouse"
        store, catalog = home / "store", home / "catalog.duckdb"
        shutil.copytree(args.store, store)
        _enlarge(store, args.copies)
        files = list(store.glob("*/*/versions/*/*.parquet"))
        size = sum(f.stat().st_size for f in files)
        print(f"store: {len(files)} Parquet files, {size / 2**20:.1f} MiB ({args.copies} extra copies)")
        remove = lambda: catalog.unlink(missing_ok=True)  # noqa: E731
        _report(
            "refresh, no previous catalog (every version hashed)",
            _timed(args.runs, remove, lambda: refresh_catalog(catalog, store)),
            "refresh_first",
        )
        keep = lambda: None  # noqa: E731
        _report(
            "refresh, nothing changed (cheap check)",
            _timed(args.runs, keep, lambda: refresh_catalog(catalog, store)),
            "refresh_unchanged",
        )
        recorded = recorded_states(catalog) or {}
        _report(
            f"stat the {len(recorded)} listed files",
            _timed(args.runs, keep, lambda: changed_files(home, recorded)),
            "stat_files",
        )
        _report(
            "open_catalog, nothing changed (stats + locked connection)",
            _timed(args.runs, keep, lambda: open_catalog(catalog, store)[0].close()),
            "open",
        )
        _report(
            "open_catalog + SELECT count(*) FROM examples",
            _timed(args.runs, keep, lambda: _open_and_query(catalog, store)),
            "open_query",
        )
        _report(
            "plain duckdb.connect + the same query (no checks)",
            _timed(args.runs, keep, lambda: _plain_query(catalog)),
            "plain_query",
        )
        largest = max(files, key=lambda f: f.stat().st_size)

        def touch() -> None:
            os.utime(largest, ns=(time.time_ns(), time.time_ns()))

        blob = home / "blob.bin"
        with blob.open("wb") as handle:
            for _ in range(args.hash_mib):
                handle.write(os.urandom(2**20))
        hashed = _timed(args.runs, keep, lambda: sha256_file(blob))
        _report(f"sha256 of {args.hash_mib} MiB (a version's verification: size / this)", hashed, "sha256")
        touched = f"open_catalog after a touch of the largest file ({largest.stat().st_size / 2**20:.1f} MiB)"
        _report(touched, _timed(args.runs, touch, lambda: open_catalog(catalog, store)[0].close()), "open_after_touch")
    RECORDING.save(f"the catalog's damage check on {args.store} with {args.copies} extra copies", FIGURES)


if __name__ == "__main__":
    main()
