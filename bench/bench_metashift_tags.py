"""MetaShift on Open-Images-shaped tag tables (issue 27's rows): the CLI end to end, one piece or fanned out.

Each run is ``shiftbench build metashift --benchmark NAME@tags [--units N]`` in a new ``SHIFTBENCH_HOME``
(Dagster, every contract, publishing and the figures included), timed from outside. Peak memory is the largest
*sum* of the resident sets of the CLI and all its descendants (``/proc``, sampled every 0.2 s), since
``--units`` runs Dagster's multiprocess executor; ``/usr/bin/time``'s figure (the largest single process) is
recorded beside it. After each build, the distances of the largest class are asked of the catalog's view.

Inputs (``bench/tag_table.py``, written when missing):

- ``boxable``: 1.9 M images, 14.3 M (image, class) rows over 600 classes; ``metashift`` with its defaults;
- ``image-level``: 9 M images, 150 M rows over 20,000 tags; a spec of its own: the 600 most frequent tags as
  the class list (a file), at most 1,000 contexts per class (largest first).

    .venv/bin/python bench/bench_metashift_tags.py --shape boxable --dir /tmp/oi
    .venv/bin/python bench/bench_metashift_tags.py --shape image-level --dir /tmp/oi --units 1 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_metashift_gqa import distance_query
from process_memory import run_sampled

PROJECT = Path(__file__).resolve().parents[1]
IMAGE_LEVEL_SPEC = """family: metashift
collections:
  oi-image-level:
    # Open Images' image-level shape: a study's 600 classes (the most frequent tags), at most 1,000 contexts each
    context_kinds: [object]
    classes_file: classes.txt
    max_contexts_per_class: 1000
"""


def inputs(shape: str, directory: Path) -> tuple[dict[str, str], str]:
    """The environment and benchmark name of a shape's build; its table written first when missing."""
    directory.mkdir(parents=True, exist_ok=True)
    table = directory / ("boxable.parquet" if shape == "boxable" else "image_level.parquet")
    if not table.exists():
        command = [sys.executable, str(PROJECT / "bench" / "tag_table.py"), str(table), "--shape", shape]
        if shape == "image-level":
            command += ["--classes-file", str(directory / "classes.txt")]
        subprocess.run(command, check=True)
    env = {"SHIFTBENCH_TAGS_TABLE": str(table)}
    if shape == "boxable":
        return env, "metashift@tags"
    spec = directory / "specs.yaml"
    spec.write_text(IMAGE_LEVEL_SPEC)
    return {**env, "SHIFTBENCH_METASHIFT_SPECS": str(spec)}, "oi-image-level"


def build(env: dict[str, str], benchmark: str, units: int, home: Path) -> dict[str, Any]:
    command = ["/usr/bin/time", "-f", "WALL %e RSS_KB %M", str(PROJECT / ".venv" / "bin" / "shiftbench"), "build"]
    command += ["metashift", "--benchmark", benchmark] + (["--units", str(units)] if units > 1 else [])
    start = time.perf_counter()
    process, stdout, stderr, peak_kb = run_sampled(command, {**os.environ, **env, "SHIFTBENCH_HOME": str(home)})
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"CLI failed ({process.returncode}): {(stdout + stderr)[-2000:]}")
    largest_process = int(next(line for line in stderr.splitlines()[::-1] if line.startswith("WALL ")).split()[-1])
    version = re.search(r"version ([0-9a-f]{16})", stdout)
    return {
        "seconds": seconds,
        "peak_tree_mib": peak_kb / 1024,
        "peak_largest_process_mib": largest_process / 1024,
        "version": version.group(1) if version else None,
        "summary": next((line.strip() for line in stdout.splitlines() if "subsets selected" in line), ""),
        "distance_query": distance_query(home, benchmark),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("boxable", "image-level"), required=True)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "oi", help="where the tables are")
    parser.add_argument("--units", type=int, nargs="+", default=[1], help="1: one piece; N: --units N")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "metashift_tags.json")
    args = parser.parse_args()
    env, benchmark = inputs(args.shape, args.dir)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": " ".join(sys.argv[1:]),
        "runs": {},
    }
    for units in args.units:
        runs = []
        for run in range(args.runs):
            home = Path(tempfile.mkdtemp(prefix=f"shiftbench-tags-{units}-{run}-"))
            try:
                runs.append(build(env, benchmark, units, home))
            finally:
                shutil.rmtree(home, ignore_errors=True)
            print(f"units {units}: {json.dumps(runs[-1])}", flush=True)
        results["runs"][str(units)] = runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print("\n| units | time (median) | peak RSS, all processes | largest process | version | largest class query |")
    print("| --- | --- | --- | --- | --- | --- |")
    for units, runs in results["runs"].items():
        query = runs[0]["distance_query"]
        print(
            f"| {units} | {statistics.median(r['seconds'] for r in runs):.1f} s "
            f"| {max(r['peak_tree_mib'] for r in runs):,.0f} MiB "
            f"| {max(r['peak_largest_process_mib'] for r in runs):,.0f} MiB | {runs[0]['version']} "
            f"| {query['subsets']:,} subsets, {query['pairs']:,} pairs: {query['median_s']:.2f} s |"
        )


if __name__ == "__main__":
    main()
