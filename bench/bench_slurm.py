"""A sweep through Slurm against the same sweep run locally, same parallelism, side by side (issue 36's figure:
the Slurm sweep's wall time <= 1.25x the local one).

    bash scripts/slurm_local.sh start      # then export the SLURM_CONF it prints
    .venv/bin/python bench/bench_slurm.py [--runs 8] [--parallel 2] [--repeats 3] [--preset smoke] \
        [--record bench/figures/slurm.json]

Both are what users run, through the CLI, timed from the command's start to its exit (planning, training, and
publishing every run): ``shiftbench train CASE --seeds 0-<runs-1> --parallel K`` (each run a Dagster run in a
process of its own, ``cores // K`` CPU threads each) and the same with ``--backend slurm`` (one job array, K tasks
at a time, ``cpus_per_task = cores // K``: the same threads, so the same versions are expected and checked). The
two alternate, ``--repeats`` times each, in a warehouse of the sprites split built first; medians are reported.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)

CASE = "sprites-uniform"


def sweep(env: dict[str, str], args: argparse.Namespace, slurm: list[str]) -> tuple[float, dict[str, str]]:
    """One sweep through the CLI: its wall time and the versions it published (run -> version)."""
    last = args.runs - 1
    command = [sys.executable, "-m", "shiftbench.pipelines.cli", "train", CASE, "--seeds", f"0-{last}", "--parallel"]
    command += [str(args.parallel), "--preset", args.preset, "--device", "cpu", *slurm]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    found = re.findall(r"^\[sweep \d+/\d+\] (\S+) version (\S+) ", done.stdout, re.MULTILINE)
    if len(found) != args.runs:
        raise SystemExit(f"expected {args.runs} published runs:\n{done.stdout[-3000:]}")
    return seconds, dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="smoke")
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    from tests.conftest import small_sprites_home

    work = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    home = work / "home"
    small_sprites_home(home, CASE)
    cluster = work / "cluster.yaml"
    cluster.write_text(f"cpus_per_task: {max(1, (os.cpu_count() or 1) // args.parallel)}\ntime: '1:00:00'\n")
    env = {**os.environ, "SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"}
    env["DAGSTER_HOME"] = str(work / "dagster")
    Path(env["DAGSTER_HOME"]).mkdir()
    timings: dict[str, list[float]] = {"local": [], "slurm": []}
    versions: dict[str, dict[str, str]] = {}
    for repeat in range(args.repeats):
        for name, extra in (("local", []), ("slurm", ["--backend", "slurm", "--slurm-settings", str(cluster)])):
            seconds, versions[name] = sweep(env, args, extra)
            timings[name].append(seconds)
            recording.run(repeat=repeat, sweep=name, seconds=seconds, versions=versions[name])
            print(f"repeat {repeat + 1} {name}: {seconds:.1f}s", flush=True)
    same = versions["local"] == versions["slurm"]
    local, slurm = statistics.median(timings["local"]), statistics.median(timings["slurm"])
    print(f"\n{args.runs} {args.preset} runs, {args.parallel} at a time, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print(f"local sweep  median {local:7.1f}s  ({', '.join(f'{t:.1f}' for t in timings['local'])})")
    print(f"slurm sweep  median {slurm:7.1f}s  ({', '.join(f'{t:.1f}' for t in timings['slurm'])})")
    print(f"slurm / local: {slurm / local:.2f}x; same versions: {same}")
    figures = {name: records.median_figure(times, "s", 1, f"the {name} sweep") for name, times in timings.items()}
    figures["ratio"] = {"what": "slurm / local", "figure": f"{slurm / local:.2f}\u00d7", "value": slurm / local}
    figures["same_versions"] = {"what": "both sweeps published the same versions", "figure": str(same), "value": same}
    what = f"{args.runs} {args.preset} runs of {CASE}, {args.parallel} at a time, locally and through Slurm"
    recording.save(what, figures)


if __name__ == "__main__":
    main()
