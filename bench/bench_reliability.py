"""What the reliability guarantees cost, measured side by side with an older checkout.

    python bench/bench_reliability.py --before PATH [--runs 5] [--home DIR]

``--before`` is a checkout of an earlier commit (``git worktree add /tmp/before d619f11``): its catalog
had glob views refreshed in place and its ``check`` ran the contracts without comparing checksums.
Both run with this project's virtualenv on the same store, built once through the library (16 BREEDS
benchmarks on the fixture hierarchy, the MetaShift collections and tasks of the generated sample, the
34 ConDS sprites cases), or taken from ``--home``. Measured, medians of ``--runs``:

- ``catalog_refresh``: rebuilding the catalog from the store (after: scan the store, check sizes, write
  a new file with explicit file lists, rename it over the old one; before: recreate glob views in place).
- ``query_examples``: ``SELECT split, count(*) FROM examples GROUP BY ALL`` on each catalog, in-process.
- ``sql_command``: ``shiftbench sql "SELECT count(*) FROM benchmarks"`` end to end (a new process).
- ``check_command``: ``shiftbench check`` over every latest version (after: every file's SHA-256
  against the manifest, then the contracts; before: the contracts).
- ``instance_open``: opening the Dagster instance (after: under the file lock, touching its three
  storages; before: ``DagsterInstance.get()``), in one process.

Results go to ``bench/results/reliability.json``; BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
FIXTURES = PROJECT.parent / "shared" / "fixtures"
PYTHON_C = [sys.executable, "-c"]
CLI = [sys.executable, "-m", "shiftbench.pipelines.cli"]


def median_of(runs: int, fn: Callable[[], float]) -> dict[str, Any]:
    values = [fn() for _ in range(runs)]
    return {"median_s": round(statistics.median(values), 4), "runs_s": [round(v, 4) for v in values]}


def build_store(home: Path) -> None:
    """Every family's benchmarks through the library (no Dagster), into ``home``."""
    sys.path.insert(0, str(PROJECT))
    from shiftbench.config.settings import Settings
    from shiftbench.families import benchmark_builds, registry, variants

    settings = Settings.from_env(
        {
            "SHIFTBENCH_HOME": str(home),
            "SHIFTBENCH_OFFLINE": "1",
            "SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(FIXTURES / "breeds" / "modified"),
        }
    )
    for family in registry.families().values():
        for kind in family.kinds:
            targets = variants.targets(settings, kind)
            outcomes = benchmark_builds.build(settings, family, [(kind, t) for t in targets.values()])
            failed = [o.benchmark for o in outcomes if o.publication is None]
            assert not failed, failed


def run_timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed: {done.stderr[-2000:]}")
    return elapsed


_REFRESH = {
    "after": "from shiftbench.warehouse.catalog import refresh_catalog as r\nimport sys, time\n"
    "from pathlib import Path\n"
    "t = time.perf_counter(); assert r(Path(sys.argv[1]), Path(sys.argv[2])).ok; print(time.perf_counter() - t)",
    "before": "from shiftbench.catalog import refresh_catalog as r\nimport sys, time\nfrom pathlib import Path\n"
    "t = time.perf_counter(); assert r(Path(sys.argv[1]), Path(sys.argv[2])); print(time.perf_counter() - t)",
}

_QUERY = """
import duckdb, statistics, sys, time
times = []
for _ in range(int(sys.argv[2])):
    with duckdb.connect(sys.argv[1], read_only=True) as con:
        t = time.perf_counter()
        con.execute("SELECT split, count(*) FROM examples GROUP BY ALL").fetchall()
        times.append(time.perf_counter() - t)
print(statistics.median(times))
"""

_INSTANCE = """
import os, statistics, sys, time
os.environ["DAGSTER_HOME"] = sys.argv[1]
import dagster as dg
after = sys.argv[2] == "after"
if after:
    from shiftbench.pipelines.cli import _instance
    from shiftbench.config.settings import Settings
    settings = Settings.from_env({"SHIFTBENCH_HOME": sys.argv[1]})
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    instance = _instance(settings) if after else dg.DagsterInstance.get()
    times.append(time.perf_counter() - t)
    instance.dispose()
print(statistics.median(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--home", type=Path, help="a warehouse whose store to measure (default: build one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-reliability-"))
    home = args.home or work / "built"
    if args.home is None:
        started = time.perf_counter()
        build_store(home)
        print(f"built the store in {time.perf_counter() - started:.1f} s", flush=True)
    store = home / "store"
    checkouts = {"after": PROJECT, "before": args.before.resolve()}
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "store_files": sum(1 for _ in store.rglob("*.parquet")),
        "store_versions": sum(1 for _ in store.glob("*/*/versions/*")),
    }
    for name, root in checkouts.items():
        side: dict[str, Any] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "DAGSTER_"))}
        side_home = work / f"home-{name}"
        side_home.mkdir(exist_ok=True)
        if not (side_home / "store").exists():
            (side_home / "store").symlink_to(store.resolve())
        env.update(PYTHONPATH=str(root), SHIFTBENCH_HOME=str(side_home), SHIFTBENCH_OFFLINE="1")
        env["DAGSTER_HOME"] = str(side_home / "dagster_home")
        (side_home / "dagster_home").mkdir(exist_ok=True)
        catalog = side_home / "catalog.duckdb"

        def refresh(name: str = name, env: dict[str, str] = env, catalog: Path = catalog) -> float:
            out = subprocess.run(
                [*PYTHON_C, _REFRESH[name], str(catalog), str(store)], env=env, capture_output=True, text=True
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-2000:])
            return float(out.stdout.split()[-1])

        side["catalog_refresh"] = median_of(args.runs, refresh)
        query = subprocess.run(
            [*PYTHON_C, _QUERY, str(catalog), str(args.runs * 2)], env=env, capture_output=True, text=True, check=True
        )
        side["query_examples"] = {"median_s": round(float(query.stdout.split()[-1]), 4)}
        side["sql_command"] = median_of(
            args.runs, lambda env=env, root=root: run_timed([*CLI, "sql", "SELECT count(*) FROM benchmarks"], env, root)
        )
        side["check_command"] = median_of(
            max(1, args.runs // 2), lambda env=env, root=root: run_timed([*CLI, "check"], env, root)
        )
        instance = subprocess.run(
            [*PYTHON_C, _INSTANCE, str(side_home / "dagster_home"), name, str(args.runs * 4)],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
        )
        if instance.returncode == 0:
            side["instance_open"] = {"median_s": round(float(instance.stdout.split()[-1]), 4)}
        else:
            side["instance_open"] = {"error": instance.stderr.strip().splitlines()[-1]}
        results[name] = side
        print(name, json.dumps(side), flush=True)
    out = PROJECT / "bench" / "results" / "reliability.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
