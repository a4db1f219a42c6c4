"""A training run on a busy machine: the quick preset alone, and beside other CPU-bound work.

    .venv/bin/python bench/bench_busy.py --home warehouse [--benchmark sprites-uniform] [--runs 3] \
        [--record bench/figures/busy.json]

Each measurement times the whole ``shiftbench train BENCHMARK --preset quick`` command (the Pipes subprocess
included) on a fresh copy of the warehouse, in three conditions: quiet; beside one single-threaded busy loop
(``python -c 'while True: pass'``); beside a second identical training. And two ways of waiting: OpenMP's
waiting threads spinning (``OMP_WAIT_POLICY=ACTIVE``, GNU OpenMP's behaviour before shiftbench set it) or
sleeping (``PASSIVE``, what :func:`shiftbench.runtime.cpus.yielding_waits` sets). Prints one line per condition:
median and every run, in seconds, and the ratio to the quiet median of the same waiting policy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import records

SHIFTBENCH = Path(sys.executable).with_name("shiftbench")


def _copy(home: Path, into: Path) -> Path:
    target = into / f"home-{time.monotonic_ns()}"
    shutil.copytree(home, target, ignore=shutil.ignore_patterns("runs", "dagster_home"))
    return target


def _train(home: Path, benchmark: str, policy: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SHIFTBENCH_HOME": str(home), "OMP_WAIT_POLICY": policy}
    env["KMP_BLOCKTIME"] = "0" if policy == "PASSIVE" else "200"
    command = [str(SHIFTBENCH), "train", benchmark, "--preset", "quick"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _once(home: Path, scratch: Path, benchmark: str, policy: str, beside: str) -> float:
    other: subprocess.Popen[bytes] | None = None
    if beside == "busy loop":
        other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    elif beside == "second training":
        other = _train(_copy(home, scratch), benchmark, policy)
    started = time.perf_counter()
    run = _train(_copy(home, scratch), benchmark, policy)
    code = run.wait()
    elapsed = time.perf_counter() - started
    if other is not None:
        other.kill() if beside == "busy loop" else other.wait()
    if code != 0:
        raise SystemExit(f"training failed with exit code {code} ({policy}, {beside})")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a warehouse where BENCHMARK is published")
    parser.add_argument("--benchmark", default="sprites-uniform")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policies", default="ACTIVE,PASSIVE")
    parser.add_argument("--conditions", default="quiet,busy loop,second training")
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-busy-") as scratch:
        for policy in args.policies.split(","):
            quiet: float | None = None
            for beside in args.conditions.split(","):
                times = [_once(args.home, Path(scratch), args.benchmark, policy, beside) for _ in range(args.runs)]
                for number, seconds in enumerate(times):
                    recording.run(policy=policy, beside=beside, round=number, seconds=seconds)
                median = statistics.median(times)
                key = f"{policy}.{beside.replace(' ', '-')}"
                figures[key] = records.median_figure(times, "s", 1, f"{policy} waits, {beside}")
                if quiet and beside != "quiet":
                    figures[f"{key}.ratio"] = {
                        "what": f"{policy} waits, {beside} / quiet", "figure": f"{median / quiet:.2f}\u00d7",
                        "value": median / quiet,
                    }  # fmt: skip
                quiet = median if beside == "quiet" else quiet
                ratio = f"   {median / quiet:.2f}x quiet" if quiet else ""
                listed = ", ".join(f"{t:.1f}" for t in times)
                print(f"{policy:<8} {beside:<16} median {median:7.1f} s ({listed}){ratio}", flush=True)
    what = f"the whole `shiftbench train {args.benchmark} --preset quick` command, quiet and beside other work"
    recording.save(what, figures)


if __name__ == "__main__":
    main()
