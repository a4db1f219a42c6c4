"""A hyperparameter search through Slurm against the same runs one by one (issue 49's figure): 8 draws x 2 trials of
ERM and of CDANN on a sprites case, end to end, and the runs each selection method picks.

    bash scripts/slurm_local.sh start      # then export the SLURM_CONF it prints
    .venv/bin/python bench/bench_search.py [--draws 8] [--trials 2] [--parallel 2] [--max-iters 20] \
        [--record bench/figures/search.json]

Both are what users run, through the CLI, timed from the first command's start to the last one's exit: the search,
``shiftbench train CASE --search N --trials K --set method=M --backend slurm --parallel P`` once per method (one job
array each, P tasks at a time, cores // P CPUs each), and the same (draw, trial) runs one at a time, each
``shiftbench train CASE --set search=SPACE --set search_draw=I --seed T`` (a Dagster run in this process's child,
every core), in a second warehouse of the same split. Both publish every run; the versions are compared (they differ
where the thread count differs: CPU results depend on it, which the record says).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

import records  # noqa: E402  (bench/, the script's folder, is on the path)

CASE = "sprites-uniform"
METHODS = ("erm", "cdann")
SPACE = "domainbed_small_images"


def cli(env: dict[str, str], *args: str) -> str:
    command = [sys.executable, "-m", "shiftbench.pipelines.cli", *args]
    done = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def picked(report: str, learner: str) -> list[tuple[str, str]]:
    """(selection method, the draws it picked per trial) for ``learner``'s line of each block of a search's report."""
    found = []
    for block in report.split("[search] selection: ")[1:]:
        label, *lines = block.strip().splitlines()
        line = next(x for x in lines if x.split()[1] == learner)
        found.append((label, line.rsplit("picked draws ", 1)[1].strip()))
    return found


def home_env(work: Path, name: str) -> dict[str, str]:
    from tests.conftest import small_sprites_home

    home = work / name
    small_sprites_home(home, CASE)
    env = {**os.environ, "SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"}
    env["DAGSTER_HOME"] = str(work / f"dagster-{name}")
    Path(env["DAGSTER_HOME"]).mkdir()
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--max-iters", type=int, default=20)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    work = Path(tempfile.mkdtemp(prefix="bench-search-"))
    common = ["--preset", "quick", "--device", "cpu", "--set", f"max_iters={args.max_iters}", "--set", "eval_every=10"]
    cluster = work / "cluster.yaml"
    cluster.write_text(f"cpus_per_task: {max(1, (os.cpu_count() or 1) // args.parallel)}\ntime: '1:00:00'\n")
    searched, reports = home_env(work, "search"), {}
    started = time.perf_counter()
    for method in METHODS:
        out = cli(searched, "train", CASE, *common, "--set", f"method={method}", "--search", str(args.draws),
                  "--trials", str(args.trials), "--search-space", SPACE, "--backend", "slurm", "--parallel",
                  str(args.parallel), "--slurm-settings", str(cluster))  # fmt: skip
        reports[method] = out[out.index("[search] selection") :].strip()
    search_s = time.perf_counter() - started
    single, n_runs = home_env(work, "single"), 0
    started = time.perf_counter()
    for method in METHODS:
        for draw in range(args.draws):
            for trial in range(args.trials):
                cli(single, "train", CASE, *common, "--set", f"method={method}", "--set", f"search={SPACE}",
                    "--set", f"search_draw={draw}", "--seed", str(trial))  # fmt: skip
                n_runs += 1
    single_s = time.perf_counter() - started
    picks = {m: picked(r, "small_cnn" if m == "erm" else f"small_cnn.{m}") for m, r in reports.items()}
    print(f"{n_runs} runs ({args.draws} draws x {args.trials} trials x {', '.join(METHODS)}), {os.cpu_count()} CPUs")
    print(f"search through Slurm ({args.parallel} at a time): {search_s:.1f}s; one by one: {single_s:.1f}s")
    print(f"one by one / search: {single_s / search_s:.2f}x")
    for method, report in reports.items():
        print(f"\n{method}:\n{report}")
    recording.run(search_s=search_s, single_s=single_s, reports=reports)
    figures = {
        "search": {"what": "the search through Slurm", "figure": f"{search_s:.1f} s", "value": search_s},
        "one_by_one": {"what": "the same runs one by one", "figure": f"{single_s:.1f} s", "value": single_s},
        "speedup": {
            "what": "one by one / search",
            "figure": f"{single_s / search_s:.2f}\u00d7",
            "value": single_s / search_s,
        },
        **{
            f"picked_{method}": {
                "what": f"{method}: draws picked per trial, by selection method",
                "figure": "; ".join(f"{label}: {draws}" for label, draws in found),
                "value": found,
            }
            for method, found in picks.items()
        },
    }
    recording.save(f"{n_runs} quick runs of {CASE}, search through local Slurm vs one by one", figures)


if __name__ == "__main__":
    main()
