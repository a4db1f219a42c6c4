"""ConDS benchmark (speed and memory, not correctness): results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_conds.py [--runs 3] [--sprites-per-combination 100]

Timed, each in a fresh process (time excludes imports; peak RSS is the process's ``VmHWM``):

- ``celeba-20k``: the real fixture ``list_attr_celeba_first20000.txt``: strict parse -> attribute
  table -> all 34 canonical cases (draw, shift summary, tables) -> every contract rule of every case
  (staged in a temporary store, as the Dagster asset does; the two plots per case included).
- ``celeba-202k``: the same on 202,599 rows (CelebA's size) in CelebA's format, made from the
  fixture by resampling its rows with replacement (seed 0) under new ids, so the joint distribution
  of the 40 attributes is the fixture's (the real file is not available here).
- ``sprites``: generating the sprites dataset (PNG files + attribute table), then its 34 cases.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
FIXTURE = PROJECT.parent / "shared" / "fixtures" / "celeba" / "list_attr_celeba_first20000.txt"
CELEBA_ROWS = 202_599


def hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_celeba(path: Path, rows: int) -> None:
    """A CelebA-format file of ``rows`` rows resampled from the fixture (seed 0)."""
    import numpy as np

    lines = FIXTURE.read_text().splitlines()
    body = lines[2:]
    pick = np.random.default_rng(0).integers(0, len(body), rows)
    out = [str(rows), lines[1]]
    out += [f"{k + 1:06d}.jpg " + body[j].split(" ", 1)[1] for k, j in enumerate(pick)]
    path.write_text("\n".join(out) + "\n")


def run_cases(settings: Any, dataset: str) -> dict[str, float]:
    from shiftbench.conds.family import CASE, CONDS
    from shiftbench.families import benchmark_builds, variants
    from shiftbench.store.contracts import failures
    from shiftbench.warehouse.publishing import check_staged

    t0 = time.perf_counter()
    inputs = benchmark_builds.build_inputs(settings, CONDS)
    t1 = time.perf_counter()
    stage_s = check_s = 0.0
    for target in [t for t in variants.targets(settings, CASE).values() if t.spec.dataset == dataset]:
        a = time.perf_counter()
        staged = CASE.stage(settings, target, inputs)
        b = time.perf_counter()
        assert not failures(check_staged(staged)), target.benchmark
        stage_s += b - a
        check_s += time.perf_counter() - b
    return {"source_s": t1 - t0, "stage_34_s": stage_s, "checks_34_s": check_s, "total_s": time.perf_counter() - t0}


def worker(kind: str, data: Path) -> dict[str, Any]:
    from shiftbench.config.settings import Settings

    home = Path(tempfile.mkdtemp(prefix="shiftbench-bench-conds-"))
    env = {"SHIFTBENCH_HOME": str(home)}
    if kind.startswith("celeba"):
        folder = data / kind
        env["SHIFTBENCH_CELEBA_DIR"] = str(folder)
        result = run_cases(Settings.from_env(env), "celeba")
    else:
        env["SHIFTBENCH_SPRITES_PER_COMBINATION"] = kind.split(":")[1]
        result = run_cases(Settings.from_env(env), "sprites")  # source_s = generating the images
    result["hwm_mb"] = hwm_mb()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sprites-per-combination", type=int, default=100)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(worker(args.one, args.data)), flush=True)
        return
    data = Path(tempfile.mkdtemp(prefix="shiftbench-conds-data-"))
    (data / "celeba-20k").mkdir()
    (data / "celeba-20k" / "list_attr_celeba.txt").write_text(FIXTURE.read_text())
    (data / "celeba-202k").mkdir()
    make_celeba(data / "celeba-202k" / "list_attr_celeba.txt", CELEBA_ROWS)
    print(json.dumps({"machine": platform.machine(), "python": platform.python_version()}), flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for kind in ("celeba-20k", "celeba-202k", f"sprites:{args.sprites_per_combination}"):
        runs = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--data", str(data)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
            print(kind, runs[-1], flush=True)
        summary[kind] = {
            key: (statistics.median(r[key] for r in runs), min(r[key] for r in runs), max(r[key] for r in runs))
            for key in runs[0]
        }
    print()
    print("| data | source (read or generate) | 34 cases: stage | 34 cases: contract checks | total | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, s in summary.items():
        cells = [
            f"{s[k][0]:.2f} s ({s[k][1]:.2f}-{s[k][2]:.2f})"
            for k in ("source_s", "stage_34_s", "checks_34_s", "total_s")
        ]
        print(f"| {kind} | " + " | ".join(cells) + f" | {s['hwm_mb'][0]:,.0f} MiB |")


if __name__ == "__main__":
    main()
